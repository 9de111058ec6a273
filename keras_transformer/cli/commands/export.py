"""Export a preset as a TensorFlow SavedModel that translates strings, or as
a Marian checkpoint in `transformers` format.

The SavedModel takes a batch of sentences and returns their translations:
tokenization, beam search and detokenization all run inside its graph, so
TensorFlow Serving (or any TensorFlow program with tensorflow_text) serves it
without this package. Its signatures are `serving_default(inputs)` and
`translate_with_options(inputs, alpha, greedy)`. A sentence longer than the
model takes is truncated (the Python `translate` splits it instead). Marian
(Opus-MT) models export too, with their source and target SentencePiece
models and `vocab.json` in the graph.

The export runs on the TensorFlow backend whatever KERAS_BACKEND says.

`--format transformers` writes the model instead as a Marian checkpoint
(`model.safetensors`, `config.json`, the SentencePiece models and
vocabulary) that `transformers`' `MarianMTModel` and `MarianTokenizer` load
and CTranslate2's `TransformersConverter` converts, with the same greedy
translations (see `keras_transformer.marian.export`); the search options do
not apply to it.

Example:
    keras-transformer export multi30k_en_de exported/en_de/1
    keras-transformer export presets/my_ende exported/my_ende/1 --beam-size 5 --overwrite
    keras-transformer export hf://Helsinki-NLP/opus-mt-en-de exported/opus_mt_en_de/1
    keras-transformer export big_en_de exported/big_en_de/1
    keras-transformer export hf://Helsinki-NLP/opus-mt-tc-big-gmw-gmw exported/en_nl/1 --target-language nld
    keras-transformer export presets/my_ende exported/my_ende_marian --format transformers
"""

import argparse
from pathlib import Path

from keras_transformer.cli.search_options import add_search_arguments, search_settings

FORMATS = ("saved_model", "transformers")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("preset", help="a preset name, a preset directory, or an hf:// handle")
    parser.add_argument(
        "directory",
        help="the SavedModel folder to write (TensorFlow Serving wants MODEL_NAME/VERSION, e.g. en_de/1)",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default=FORMATS[0],
        help="a TensorFlow SavedModel (default), or a Marian checkpoint in transformers format",
    )
    add_search_arguments(parser)
    parser.add_argument(
        "--target-language",
        metavar="LANG",
        help="for a multilingual model, the language the SavedModel translates into (e.g. deu)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty DIRECTORY")


def run(args: argparse.Namespace) -> int:
    import keras

    from keras_transformer import Transformer
    from keras_transformer.generation.saved_model import export_saved_model
    from keras_transformer.utils.errors import UserError

    if args.format == "transformers":
        return _export_transformers(args)
    if keras.config.backend() != "tensorflow":
        raise UserError(
            f"export needs the TensorFlow backend, and Keras was already started on "
            f"{keras.config.backend()!r}; run `KERAS_BACKEND=tensorflow keras-transformer export ...`."
        )
    # Checked before the (slow) loading of the preset.
    search = search_settings(args)
    target = _checked_target(args)
    model = Transformer.from_preset(args.preset)
    directory = export_saved_model(
        model,
        target,
        search=search,
        overwrite=args.overwrite,
        target_language=args.target_language,
    )
    print(f"exported {args.preset} to {directory} (signature 'serving_default': strings in, translations out).")
    return 0


def _export_transformers(args: argparse.Namespace) -> int:
    from keras_transformer import Transformer
    from keras_transformer.marian import export_transformers
    from keras_transformer.utils.errors import UserError

    if args.target_language is not None:
        raise UserError(
            "--target-language is for the SavedModel; a checkpoint in transformers format keeps every "
            "language (MarianTokenizer reads the >>xxx<< token at the start of each source)."
        )
    target = _checked_target(args)
    directory = export_transformers(Transformer.from_preset(args.preset), target, overwrite=args.overwrite)
    print(f"exported {args.preset} to {directory} (MarianMTModel.from_pretrained and CTranslate2 read it).")
    return 0


def _checked_target(args: argparse.Namespace) -> Path:
    """The export folder, checked before the (slow) loading of the preset."""
    from keras_transformer.utils.errors import UserError

    target = Path(args.directory)
    if target.exists() and not target.is_dir():
        raise UserError(f"{target} exists and is not a folder; choose another export folder.")
    if target.is_dir() and any(target.iterdir()) and not args.overwrite:
        raise UserError(f"{target} is not empty; pass --overwrite to replace it.")
    return target
