"""Marian (Opus-MT) checkpoints in `transformers` format, loaded exactly.

The Opus-MT models (Tiedemann & Thottingal 2020, about a thousand language
pairs on the Hugging Face Hub) are the paper's encoder-decoder Transformer,
Post-LN, with sinusoidal positions and scaled, tied embeddings, plus a few
choices the backbone expresses with its own arguments: swish or ReLU in the
FFN, sines and cosines concatenated, a final logits bias, LayerNorm epsilon
1e-5, and their own special ids (`<pad>` = V - 1 starts the decoder, `</s>`
ends every sequence). `Transformer.from_preset("hf://Helsinki-NLP/...")`
comes here for any checkpoint whose `config.json` has a `model_type`.

Modules, each one step: `config` (check and convert `config.json`), `hub`
(fetch files, cache first), `weights` (read safetensors or `tf_model.h5`,
never a pickle), `convert` (tensors into the backbone), `tokenizer` and
`preprocessor` (Marian's two SentencePiece models and packing), `loader`
(all of it together), `card` (the model card `keras-transformer convert`
writes).
"""

from keras_transformer.marian.config import MarianConfigError
from keras_transformer.marian.loader import is_transformers_checkpoint, load_marian
from keras_transformer.marian.preprocessor import MarianPreprocessor
from keras_transformer.marian.tokenizer import MarianTokenizer
from keras_transformer.marian.weights import PickleOnlyError

__all__ = [
    "MarianConfigError",
    "MarianPreprocessor",
    "MarianTokenizer",
    "PickleOnlyError",
    "is_transformers_checkpoint",
    "load_marian",
]
