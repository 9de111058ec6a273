"""Marian (Opus-MT) checkpoints in `transformers` format, loaded exactly.

The Opus-MT models (Tiedemann & Thottingal 2020, about a thousand language
pairs on the Hugging Face Hub) are the paper's encoder-decoder Transformer,
Post-LN, with sinusoidal positions and scaled, tied embeddings, plus a few
choices the backbone expresses with its own arguments: swish or ReLU in the
FFN, sines and cosines concatenated, a final logits bias, LayerNorm epsilon
1e-5, and their own special ids (`<pad>` = V - 1 starts the decoder, `</s>`
ends every sequence).

Importing this package (which the first use of a public name of
`keras_transformer` does) registers `keras_hub_loader.MarianPresetLoader` for
model type `"marian"` through the one hook KerasHub leaves
(`utils.library_internals.register_transformers_loader`):
`Transformer.from_preset("hf://Helsinki-NLP/...")`, and KerasHub's own
`Seq2SeqLM.from_preset` and `Backbone.from_preset`, come here through
KerasHub's choice of converter by `config.json`'s `model_type`.

Modules, each one step: `config` (check and convert `config.json`), `hub`
(fetch files, cache first), `weights` (read safetensors or `tf_model.h5`,
never a pickle), `convert` (tensors into the backbone), `tokenizer` and
`preprocessor` (Marian's two SentencePiece models and packing), `loader`
(all of it together), `keras_hub_loader` (KerasHub's entry points), `card`
(what a converted checkpoint's card says, written by `presets.model_card`). The way back out:
`export_weights`, `export_tokenizer` and `export` write any model of this
project as a Marian checkpoint in `transformers` format.
"""

from keras_transformer.marian.config import MODEL_TYPE, MarianConfigError
from keras_transformer.marian.export import MarianExportError, export_transformers
from keras_transformer.marian.keras_hub_loader import MarianPresetLoader
from keras_transformer.marian.loader import is_transformers_checkpoint, load_marian
from keras_transformer.marian.preprocessor import MarianPreprocessor
from keras_transformer.marian.tokenizer import MarianTokenizer
from keras_transformer.marian.weights import PickleOnlyError
from keras_transformer.utils.library_internals import register_transformers_loader

register_transformers_loader(MODEL_TYPE, MarianPresetLoader)

__all__ = [
    "MarianConfigError",
    "MarianExportError",
    "MarianPresetLoader",
    "MarianPreprocessor",
    "MarianTokenizer",
    "PickleOnlyError",
    "export_transformers",
    "is_transformers_checkpoint",
    "load_marian",
]
