"""Load an Opus-MT (Marian) checkpoint from the Hugging Face Hub and prepare it for serving.

What it shows:

1. `Transformer.from_preset("hf://Helsinki-NLP/opus-mt-en-de")` reads a checkpoint in
   `transformers` format (safetensors or tf_model.h5, never a pickle) and converts it
   exactly on load; it translates like any preset.
2. `convert` (the `keras-transformer convert` command) saves it as a native preset:
   checksummed, with a model card naming its source and license, loading without
   conversion and without `transformers`' files.
3. Export as a TensorFlow SavedModel (strings in, translations out, for TensorFlow
   Serving) with `keras_transformer.generation.saved_model.export_saved_model`: Marian's source and
   target SentencePiece models and its vocab.json run inside the graph, and the
   SavedModel, loaded with TensorFlow and tensorflow_text alone, translates as
   `model.translate` does. Any other preset (e.g. `multi30k_en_de`, or one trained
   with `keras-transformer train`) goes through the same three steps.

Run (the first needs the Hub, or its files in the local Hugging Face cache):
    python examples/opus_mt_export.py                                   # opus-mt-en-de
    python examples/opus_mt_export.py hf://Helsinki-NLP/opus-mt-en-fr --out exported/en_fr
    python examples/opus_mt_export.py path/to/save_pretrained/folder --out exported/mine
    python examples/opus_mt_export.py multi30k_en_de --out exported/multi30k
    python examples/opus_mt_export.py --sentence "A cat sleeps." --sentence "It rains."
"""

import argparse
import sys
from pathlib import Path

import keras_transformer as kt
from keras_transformer.cli.commands.convert import convert
from keras_transformer.generation.saved_model import export_saved_model
from keras_transformer.marian.tokenizer import MarianTokenizer

SENTENCES = ["A dog runs across the green field.", "Two children are playing in the snow."]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "source",
        nargs="?",
        default="hf://Helsinki-NLP/opus-mt-en-de",
        help="an hf:// handle, a save_pretrained folder, or any preset",
    )
    parser.add_argument(
        "--out", default="exported/opus_mt_en_de", help="output folder: preset/ (converted) and savedmodel/1/ (export)"
    )
    parser.add_argument(
        "--sentence",
        action="append",
        dest="sentences",
        help="a sentence to translate (repeat for more; default: two examples)",
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    sentences = args.sentences or SENTENCES

    # 1. Load (and, for a transformers checkpoint, convert) and translate.
    model = kt.Transformer.from_preset(args.source)
    print("loaded:", " | ".join(model.translate(sentences)))

    # 2. A native preset. `convert` writes the model card with the checkpoint's license;
    # for a model that is already native, save_to_preset does the same job.
    preset = out / "preset"
    if isinstance(model.preprocessor.tokenizer, MarianTokenizer):
        convert(args.source, preset)
    else:
        model.save_to_preset(preset)
    converted = kt.Transformer.from_preset(str(preset))
    print("converted:", " | ".join(converted.translate(sentences)))

    # 3. The SavedModel: tokenization, beam search and detokenization in one graph.
    folder = export_saved_model(converted, out / "savedmodel" / "1", overwrite=True)
    print(f"exported to {folder}; serve {folder.parent} with TensorFlow Serving (see README.md)")

    # Check it as a server would: TensorFlow and tensorflow_text only, no keras_transformer.
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    serve = tf.saved_model.load(str(folder)).signatures["serving_default"]
    outputs = serve(inputs=tf.constant(sentences))["outputs"].numpy()
    print("SavedModel:", " | ".join(text.decode("utf-8") for text in outputs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
