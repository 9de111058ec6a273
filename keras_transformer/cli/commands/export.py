"""Export a preset as a TensorFlow SavedModel that translates strings.

The SavedModel takes a batch of sentences and returns their translations:
tokenization, beam search and detokenization all run inside its graph, so
TensorFlow Serving (or any TensorFlow program with tensorflow_text) serves it
without this package. Its signatures are `serving_default(inputs)` and
`translate_with_options(inputs, alpha, greedy)`. A sentence longer than the
model takes is truncated (the Python `translate` splits it instead). Marian
(Opus-MT) models export too, with their source and target SentencePiece
models and `vocab.json` in the graph.

The export runs on the TensorFlow backend whatever KERAS_BACKEND says.

Example:
    keras-transformer export multi30k_en_de exported/en_de/1
    keras-transformer export presets/my_ende exported/my_ende/1 --beam-size 5 --overwrite
    keras-transformer export hf://Helsinki-NLP/opus-mt-en-de exported/opus_mt_en_de/1
"""

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("preset", help="a preset name, a preset directory, or an hf:// handle")
    parser.add_argument(
        "directory",
        help="the SavedModel folder to write (TensorFlow Serving wants MODEL_NAME/VERSION, e.g. en_de/1)",
    )
    parser.add_argument("--beam-size", type=int, default=4, help="beams per sentence (default 4, the paper's)")
    parser.add_argument("--alpha", type=float, default=0.6, help="default length penalty exponent (default 0.6)")
    parser.add_argument(
        "--max-extra-length", type=int, default=50, help="at most source length + this many tokens (default 50)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty DIRECTORY")


def run(args: argparse.Namespace) -> int:
    import keras

    from keras_transformer import Transformer
    from keras_transformer.utils.errors import UserError
    from keras_transformer.generation.serving import export_saved_model

    if keras.config.backend() != "tensorflow":
        raise UserError(
            f"export needs the TensorFlow backend, and Keras was already started on "
            f"{keras.config.backend()!r}; run `KERAS_BACKEND=tensorflow keras-transformer export ...`."
        )
    # Checked before the (slow) loading of the preset.
    target = Path(args.directory)
    if target.exists() and not target.is_dir():
        raise UserError(f"{target} exists and is not a folder; choose another export folder.")
    if target.is_dir() and any(target.iterdir()) and not args.overwrite:
        raise UserError(f"{target} is not empty; pass --overwrite to replace it.")
    model = Transformer.from_preset(args.preset)
    directory = export_saved_model(
        model,
        target,
        beam_size=args.beam_size,
        alpha=args.alpha,
        max_extra_length=args.max_extra_length,
        overwrite=args.overwrite,
    )
    print(f"exported {args.preset} to {directory} (signature 'serving_default': strings in, translations out).")
    return 0
