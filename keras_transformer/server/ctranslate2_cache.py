"""A model converted for CTranslate2 once, and kept in a cache across restarts.

The model is written as a Marian checkpoint in `transformers` format
(`marian.export.export_transformers`) and converted by CTranslate2's own
`TransformersConverter` into `cache_root() / <key>`, where the key is a
SHA-256 of what the conversion reads (the backbone's config, its weights and
the export's vocabularies) and of the quantization. The folder is written
under a temporary name and renamed when complete (`folder_replaced_atomically`),
so a crash leaves no half-converted model; a later load with the same key
converts nothing. Only converting needs `transformers` and torch (the
converter loads the checkpoint with them); loading a cached model needs
CTranslate2 alone.
"""

import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from keras_transformer.marian.export import export_transformers
from keras_transformer.marian.export_tokenizer import marian_vocabularies
from keras_transformer.utils.files import cache_home, folder_replaced_atomically

EXTRA_INSTALL = 'pip install "keras-transformer[ctranslate2]"'
# Bumped when the conversion changes, so that older cached models are not reused.
CACHE_FORMAT = 1
# The weights' file of every converted model.
MODEL_FILE = "model.bin"


def import_ctranslate2():
    """The `ctranslate2` module, or an error naming the extra to install."""
    try:
        import ctranslate2
    except ImportError as error:
        raise ImportError(
            f"The ctranslate2 engine needs the ctranslate2 extra ({error.name} is missing): {EXTRA_INSTALL}"
        ) from error
    return ctranslate2


def cache_root() -> Path:
    """`$XDG_CACHE_HOME/keras_transformer/ctranslate2` (`~/.cache/...` by default)."""
    return cache_home() / "ctranslate2"


def cache_key(model, quantization: str | None) -> str:
    """A hex SHA-256 of everything the conversion of `model` with `quantization` depends on.

    Example:
    >>> import keras_transformer as kt
    >>> model = kt.Transformer.from_preset("multi30k_en_de")
    >>> cache_key(model, None) == cache_key(model, None) != cache_key(model, "int8")
    True
    """
    backbone = model.backbone
    digest = hashlib.sha256()
    source_pieces, target_pieces = marian_vocabularies(backbone, model.preprocessor)
    head = {"format": CACHE_FORMAT, "quantization": quantization, "backbone": backbone.get_config()}
    for part in (head, source_pieces, target_pieces):
        digest.update(json.dumps(part, sort_keys=True, default=str).encode())
    for weight in backbone.weights:
        digest.update(weight.path.encode())
        digest.update(np.ascontiguousarray(weight.numpy()).tobytes())
    return digest.hexdigest()[:32]


def converted_model(model, quantization: str | None = None, root: str | os.PathLike | None = None) -> Path:
    """The folder of `model` converted for CTranslate2 (converted now unless cached).

    Args:
        model: a float32 `Transformer` that `export_transformers` takes.
        quantization: CTranslate2's weight quantization (`None`: float32, or `"int8"`).
        root: the cache folder (default `cache_root()`).

    Raises:
        ImportError: the ctranslate2 extra is missing (the message says what to install).
        MarianExportError: a Marian checkpoint cannot hold the model.
    """
    folder = Path(root or cache_root()) / cache_key(model, quantization)
    if (folder / MODEL_FILE).is_file():
        return folder
    converter = _converter()
    with folder_replaced_atomically(folder) as converting, tempfile.TemporaryDirectory() as checkpoint:
        export_transformers(model, Path(checkpoint) / "marian")
        converter(str(Path(checkpoint) / "marian")).convert(str(converting), quantization=quantization, force=True)
    return folder


def _converter():
    """CTranslate2's `TransformersConverter`, checked for what it needs: it loads the
    checkpoint with transformers and torch, and without them fails only halfway."""
    ctranslate2 = import_ctranslate2()
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as error:
        raise ImportError(
            f"Converting a model for CTranslate2 needs the ctranslate2 extra ({error.name} is missing): {EXTRA_INSTALL}"
        ) from error
    return ctranslate2.converters.TransformersConverter
