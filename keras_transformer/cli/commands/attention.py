"""Draw what a preset attends to when it translates a sentence.

The sentence is translated greedily, then the model reads its own
translation again (teacher forcing) and the attention weights are drawn as
heat maps labelled with subwords ("##" marks a piece that continues a word),
in the spirit of Figures 3 to 5 of the paper:

- by default, the encoder-decoder attention of one decoder layer (--layer,
  the last by default), all heads (--heads) in a grid, rows the output
  subwords and columns the source subwords;
- with --encoder-self-attention, one head (--head) of one encoder layer's
  self-attention, as Figure 4 does.

Layers and heads count from 0; --layer -1 is the last. The picture's format
follows the suffix of --out (.png, .svg, .pdf). The translation is printed.

Examples:
    keras-transformer attention --preset multi30k_en_de "Two dogs play in the snow." --out att.png
    keras-transformer attention --preset multi30k_en_de "Two dogs play in the snow." \\
        --out heads.png --layer 0 --heads 0,1
    keras-transformer attention --preset multi30k_en_de "Two dogs play in the snow." \\
        --out self.png --encoder-self-attention --layer 2 --head 3
"""

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sentence", help="one sentence to translate")
    parser.add_argument("--preset", required=True, help="a preset name, a preset directory, or an hf:// handle")
    parser.add_argument("--out", required=True, help="the picture to write (.png, .svg, .pdf)")
    parser.add_argument(
        "--layer", type=int, default=-1, help="decoder (or encoder) layer from 0; -1, the default, is the last"
    )
    parser.add_argument(
        "--heads",
        type=_heads,
        default=None,
        metavar="all|I,J,...",
        help="encoder-decoder attention heads to draw, e.g. 0,1 (default: all)",
    )
    parser.add_argument(
        "--encoder-self-attention",
        action="store_true",
        help="draw the encoder's self-attention of one head (--head) instead",
    )
    parser.add_argument("--head", type=int, default=0, help="the head of --encoder-self-attention (default 0)")


def _heads(text: str) -> list[int] | None:
    if text == "all":
        return None
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'all' or head numbers like 0,1; got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    from keras_transformer import Transformer
    from keras_transformer.generation.attention_maps import attention_maps, plot_cross_attention, plot_self_attention

    if args.encoder_self_attention and args.heads is not None:
        raise ValueError("--heads is for the encoder-decoder attention; with --encoder-self-attention give one --head.")
    model = Transformer.from_preset(args.preset)
    maps = attention_maps(model, args.sentence)
    if args.encoder_self_attention:
        plot_self_attention(maps, args.out, layer=args.layer, head=args.head)
    else:
        plot_cross_attention(maps, args.out, layer=args.layer, heads=args.heads)
    print(maps.translation)
    return 0
