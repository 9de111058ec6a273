"""Convert a Marian (Opus-MT) checkpoint in `transformers` format into a preset.

The checkpoint (an hf:// handle, a registered name such as base_en_de, or a
folder written by transformers' save_pretrained) is converted exactly, then
saved as a native keras-transformer preset: checksummed, with a model card
naming the source, its license and how it differs from the paper, so that
`upload` can publish it and later loads need no conversion.

Example:
    keras-transformer convert hf://Helsinki-NLP/opus-mt-en-de presets/opus_mt_en_de --dtype float16
"""

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="hf://org/name, a registered name (base_en_de) or a transformers folder")
    parser.add_argument("out_dir", help="the preset folder to write")
    parser.add_argument("--revision", help="a branch, tag or commit of the Hub repo (default: main)")
    parser.add_argument(
        "--dtype",
        choices=("float32", "float16"),
        default="float32",
        help="dtype of the saved weights (float16 halves the file; default float32)",
    )


def convert(source: str, out_dir: str | Path, revision: str | None = None, dtype: str = "float32") -> Path:
    """Converts `source` and saves it as a preset in `out_dir`; returns the folder."""
    from keras_transformer import Transformer
    from keras_transformer.marian.card import model_card, source_license
    from keras_transformer.marian.hub import CheckpointFiles
    from keras_transformer.presets.saving import save_preset
    from keras_transformer.utils.errors import UserError

    files = CheckpointFiles(source, revision)
    # Read here, not guessed: an unreachable Hub or a missing repository raises and says so.
    if "model_type" not in files.config():
        raise UserError(
            f"{source} is not a checkpoint in transformers format (its config.json has no model_type); "
            "convert reads Marian (Opus-MT) checkpoints."
        )
    # The name, not its handle: a name's fixed target language is saved with the tokenizer.
    model = Transformer.from_preset(source, revision=revision)
    license_id = source_license(files)
    card = model_card(files.handle, Path(out_dir).name, model.backbone, license_id, weights_dtype=dtype)
    return save_preset(model, out_dir, weights_dtype=None if dtype == "float32" else dtype, model_card=card)


def run(args: argparse.Namespace) -> int:
    folder = convert(args.source, args.out_dir, revision=args.revision, dtype=args.dtype)
    print(f"Converted {args.source} into {folder}", file=sys.stderr)
    return 0
