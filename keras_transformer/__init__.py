"""keras-transformer: the Transformer of "Attention Is All You Need" on Keras 3.

The public names load on first use, so that `import keras_transformer` starts
neither Keras nor TensorFlow: the command line (`keras_transformer.cli`) sets
Keras' backend up before they start. Loading them registers the package's
classes, preset names and Marian loader with KerasHub
(`keras_hub.models.Seq2SeqLM.from_preset("multi30k_en_de")`); where Keras
runs already (KerasHub imported first), `import keras_transformer` loads them
at once, since there is no backend left to choose.
"""

import importlib
import sys

from keras_transformer.version import __version__ as __version__

# Each public name, and the module that defines it.
_PUBLIC_NAMES = {
    "LabelSmoothedCrossEntropy": "keras_transformer.training",
    "MaskedAccuracy": "keras_transformer.training",
    "SearchSettings": "keras_transformer.generation.settings",
    "TrainingRecipe": "keras_transformer.training",
    "Transformer": "keras_transformer.models.transformer",
    "TransformerBackbone": "keras_transformer.models.transformer_backbone",
    "TransformerPreprocessor": "keras_transformer.models.transformer_preprocessor",
    "TransformerSchedule": "keras_transformer.training",
    "TransformerTokenizer": "keras_transformer.models.transformer_tokenizer",
    "beam_search": "keras_transformer.generation.search",
    "greedy_search": "keras_transformer.generation.search",
    "length_penalty": "keras_transformer.generation.search",
    "paper_optimizer": "keras_transformer.training",
    "train_tokenizer": "keras_transformer.models.transformer_tokenizer",
}
_PUBLIC_MODULES = ("layers", "marian")
# What KerasHub's entry points need: the task class, its presets (registered
# by `presets.resolution` on import) and the Marian loader.
_KERAS_HUB_REGISTRATIONS = ("keras_transformer.models.transformer", "keras_transformer.marian")

__all__ = sorted([*_PUBLIC_NAMES, *_PUBLIC_MODULES, "__version__"])


def __getattr__(name: str):
    """Loads a public name on first use, registering the package with KerasHub first."""
    if name not in _PUBLIC_NAMES and name not in _PUBLIC_MODULES:
        raise AttributeError(f"module 'keras_transformer' has no attribute {name!r}")
    _register_with_keras_hub()
    if name in _PUBLIC_MODULES:
        return importlib.import_module(f"keras_transformer.{name}")
    value = getattr(importlib.import_module(_PUBLIC_NAMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def _register_with_keras_hub() -> None:
    for module in _KERAS_HUB_REGISTRATIONS:
        importlib.import_module(module)


if "keras" in sys.modules:
    _register_with_keras_hub()
