"""Translate sentences (arguments, or lines of stdin) with a preset."""

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sentences", nargs="*", help="sentences to translate; none reads stdin, one a line")
    parser.add_argument("--preset", required=True, help="a preset name, a preset directory, or an hf:// handle")
    parser.add_argument("--beam-size", type=int, default=4, help="beams per sentence (default 4, the paper's)")
    parser.add_argument("--alpha", type=float, default=0.6, help="length penalty exponent (default 0.6)")
    parser.add_argument("--batch-size", type=int, default=32, help="sentences decoded together")
    parser.add_argument(
        "--too-long",
        choices=("split", "truncate", "error"),
        default="split",
        help="a sentence longer than the model takes: split it at sentence ends (default), truncate it with a warning, or stop",
    )


def run(args: argparse.Namespace) -> int:
    from keras_transformer import Transformer

    sentences = args.sentences or [line.rstrip("\n") for line in sys.stdin]
    model = Transformer.from_preset(args.preset)
    for translation in model.translate(
        sentences,
        beam_size=args.beam_size,
        alpha=args.alpha,
        batch_size=args.batch_size,
        too_long=args.too_long,
        verbose=0,  # a progress bar on stdout would mix with the translations
    ):
        print(translation)
    return 0
