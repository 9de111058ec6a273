"""The one set of weights every implementation runs: a random Marian checkpoint.

`python -m benchmarks.checkpoint --size tiny --out DIR` writes
`DIR/marian` (a Hugging Face `MarianMTModel` saved as safetensors, with a
word-level tokenizer whose token `i` is the string of id `i`, so that
CTranslate2's converter finds a vocabulary) and `DIR/ct2` (that checkpoint
converted by CTranslate2's own `TransformersConverter`, float32; int8 is
quantized when loading). `--no-ct2` skips the conversion, for a machine without
CTranslate2 (the GPU machine).

Random weights are redrawn by `randomize`: with `transformers`' own
initialisation (std 0.02) every source decodes to the same repeated token,
which makes a weak agreement check; these give unit-scale logits that depend
on the source. `final_logits_bias` stays zero, so this project, which has no
logits bias, computes the same function.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from benchmarks.workloads import END_ID, SIZES, UNK_ID, ModelSize, pad_id

SEED = 20260
INIT = "randomize v1"  # change when `randomize` changes: cached checkpoints are rebuilt

MARIAN_DIR = "marian"
CT2_DIR = "ct2"


def vocabulary(size: ModelSize) -> list[str]:
    """Token strings by id: `</s>`, `<unk>`, `t2` ... `t{V-2}`, `<pad>`."""
    tokens = [f"t{i}" for i in range(size.vocabulary_size)]
    tokens[END_ID], tokens[UNK_ID], tokens[pad_id(size)] = "</s>", "<unk>", "<pad>"
    return tokens


def marian_config(size: ModelSize):
    from transformers import MarianConfig

    return MarianConfig(
        vocab_size=size.vocabulary_size,
        decoder_vocab_size=size.vocabulary_size,
        d_model=size.hidden_dim,
        encoder_layers=size.layers,
        decoder_layers=size.layers,
        encoder_attention_heads=size.num_heads,
        decoder_attention_heads=size.num_heads,
        encoder_ffn_dim=size.intermediate_dim,
        decoder_ffn_dim=size.intermediate_dim,
        activation_function="swish",
        scale_embedding=True,
        max_position_embeddings=1024,
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=pad_id(size),
        decoder_start_token_id=pad_id(size),
        eos_token_id=END_ID,
        forced_eos_token_id=None,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
    )


def save_tokenizer(size: ModelSize, directory: Path) -> None:
    """A whitespace word-level tokenizer over `vocabulary(size)`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokens = vocabulary(size)
    tokenizer = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    ).save_pretrained(directory)


def randomize(model, seed: int) -> None:
    """Embeddings N(0, 1/d) (the `<pad>` row zero, as Marian keeps it),
    Linear weights N(0, 1/fan_in), biases N(0, 0.1^2), LayerNorm scales
    N(0.5, 1) and shifts N(0, 0.1^2); `final_logits_bias` untouched (zero)."""
    import torch

    generator = torch.Generator().manual_seed(seed)

    def normal(parameter, mean: float, std: float) -> None:
        parameter.copy_(mean + std * torch.randn(parameter.shape, generator=generator))

    d_model = model.config.d_model
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "embed_positions" in name:  # fixed sinusoids, not saved
                continue
            if name.endswith("shared.weight"):
                normal(parameter, 0.0, d_model**-0.5)
                parameter[model.config.pad_token_id] = 0.0
            elif "layer_norm" in name:
                normal(parameter, 0.5, 1.0) if name.endswith("weight") else normal(parameter, 0.0, 0.1)
            elif name.endswith("weight"):
                normal(parameter, 0.0, parameter.shape[1] ** -0.5)
            elif name.endswith("bias"):
                normal(parameter, 0.0, 0.1)


def build(size_name: str, out: Path, convert: bool = True) -> Path:
    """Writes the Marian checkpoint and (if `convert`) its CTranslate2 conversion
    under `out` (kept if already there from the same seed, initialisation and
    conversion); returns `out`."""
    import torch
    from transformers import MarianMTModel

    size = SIZES[size_name]
    marian, ct2, stamp = out / MARIAN_DIR, out / CT2_DIR, out / "checkpoint.json"
    expected = {"size": size_name, "seed": SEED, "init": INIT, "ct2": convert}
    if stamp.exists() and json.loads(stamp.read_text()) == expected:
        return out
    stamp.unlink(missing_ok=True)
    for directory in (marian, ct2):
        shutil.rmtree(directory, ignore_errors=True)
    torch.manual_seed(SEED)
    model = MarianMTModel(marian_config(size)).eval()
    randomize(model, SEED)
    if torch.count_nonzero(model.final_logits_bias):
        raise AssertionError("final_logits_bias must be zero: this project has no logits bias")
    model.save_pretrained(marian, safe_serialization=True)
    save_tokenizer(size, marian)
    if convert:
        import ctranslate2

        ctranslate2.converters.TransformersConverter(str(marian)).convert(str(ct2), force=True)
    stamp.write_text(json.dumps(expected))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--no-ct2", action="store_true", help="skip the CTranslate2 conversion")
    args = parser.parse_args()
    build(args.size, args.out, convert=not args.no_ct2)


if __name__ == "__main__":
    main()
