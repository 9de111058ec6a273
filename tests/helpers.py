"""Helpers shared by the tests: the repository's root, a tiny parallel corpus
and the tiny models built from it. Fixtures live in conftest.py.

pytest puts tests/ on the import path, so a test module imports them as
`from helpers import PAIRS, make_model`; a test's subprocess adds tests/ to
`sys.path` first. Importing this module imports neither Keras nor the library
(tests/distributed_worker.py configures devices before either starts).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import keras_transformer as kt

REPO_ROOT = Path(__file__).resolve().parents[1]

PAIRS = [
    ("a dog runs .", "ein hund rennt ."),
    ("a cat sleeps .", "eine katze schläft ."),
    ("two dogs play .", "zwei hunde spielen ."),
    ("a man walks .", "ein mann geht ."),
    ("a woman sings .", "eine frau singt ."),
    ("two cats play .", "zwei katzen spielen ."),
]

TINY_CONFIG = dict(
    num_encoder_layers=2,
    num_decoder_layers=2,
    num_heads=2,
    hidden_dim=16,
    intermediate_dim=32,
    dropout=0.0,
    max_sequence_length=64,
)

# `keras-transformer train`'s flags for a tiny model and vocabulary, small
# enough for a few copies of PAIRS; the corpus, run folder, steps and the
# checkpoint and validation intervals are each test's own.
TINY_TRAIN_ARGUMENTS = tuple(
    "--layers 1 --hidden-dim 16 --ff-dim 32 --heads 2 --dropout 0 --vocab-size 64 --max-length 16 "
    "--tokens-per-batch 64 --warmup-steps 4 --verbose 0".split()
)


def make_model(tokenizer: kt.TransformerTokenizer, sequence_length: int = 16, **overrides) -> kt.Transformer:
    """A tiny Transformer with a preprocessor; `overrides` change `TINY_CONFIG`."""
    import keras_transformer as kt

    config = {**TINY_CONFIG, **overrides}
    backbone = kt.TransformerBackbone(vocabulary_size=tokenizer.vocabulary_size(), **config)
    preprocessor = kt.TransformerPreprocessor(tokenizer, sequence_length, sequence_length)
    return kt.Transformer(backbone=backbone, preprocessor=preprocessor)


def random_algorithms(concrete_function) -> set[int]:
    """The `alg` inputs of the uniform random ops in a traced TensorFlow
    graph (1 = Philox, 2 = Threefry, 3 = the device's default: Philox on CPU)."""
    import tensorflow as tf

    ops_found = concrete_function.graph.get_operations()
    return {int(tf.get_static_value(op.inputs[3])) for op in ops_found if op.type == "StatelessRandomUniformV2"}


def record_batches(model, monkeypatch) -> list:
    """Replaces `model.generate` by a wrapper that records each batch's ids."""
    batches = []
    generate = model.generate

    def recording(inputs, **kwargs):
        import numpy as np

        batches.append(np.asarray(inputs["encoder_token_ids"]))
        return generate(inputs, **kwargs)

    monkeypatch.setattr(model, "generate", recording)
    return batches
