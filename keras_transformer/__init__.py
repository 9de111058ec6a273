"""keras-transformer: the Transformer of "Attention Is All You Need" on Keras 3."""

# First, before Keras: the command line's --backend and its filter of native
# TensorFlow log lines only work if set before Keras and TensorFlow start.
from keras_transformer.cli.startup import prepare_if_command_line

prepare_if_command_line()

# `marian` registers its loader with KerasHub, whose from_preset then reads Opus-MT checkpoints.
from keras_transformer import layers, marian
from keras_transformer.generation.search import beam_search, greedy_search, length_penalty
from keras_transformer.generation.settings import SearchSettings
from keras_transformer.models.transformer import Transformer
from keras_transformer.models.transformer_backbone import TransformerBackbone
from keras_transformer.models.transformer_preprocessor import TransformerPreprocessor
from keras_transformer.models.transformer_tokenizer import TransformerTokenizer, train_tokenizer
from keras_transformer.presets.resolution import register_builtin_presets
from keras_transformer.training import (
    LabelSmoothedCrossEntropy,
    MaskedAccuracy,
    TrainingRecipe,
    TransformerSchedule,
    paper_optimizer,
)
from keras_transformer.version import __version__

register_builtin_presets()

__all__ = [
    "LabelSmoothedCrossEntropy",
    "MaskedAccuracy",
    "SearchSettings",
    "TrainingRecipe",
    "Transformer",
    "TransformerBackbone",
    "TransformerPreprocessor",
    "TransformerSchedule",
    "TransformerTokenizer",
    "__version__",
    "beam_search",
    "greedy_search",
    "layers",
    "marian",
    "length_penalty",
    "paper_optimizer",
    "train_tokenizer",
]
