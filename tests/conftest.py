"""Shared fixtures: a tiny vocabulary and tiny models built from it."""

import os
from pathlib import Path

import keras
import numpy as np
import pytest
from keras import ops

# Seed before any tokenizer exists: tf.random.set_seed clears TF's eager
# resources, which breaks a SentencePiece op created earlier.
keras.utils.set_random_seed(1234)

import keras_transformer as kt  # noqa: E402
from hypothesis import settings  # noqa: E402

# CI replays the same examples every run (a new random one could fail a
# submission for a reason unrelated to it); locally each run explores new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

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


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """Where the shared corpora live: $KERAS_TRANSFORMER_DATA or ../shared/data."""
    return Path(os.environ.get("KERAS_TRANSFORMER_DATA", REPO_ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def multi30k(data_dir) -> Path:
    path = data_dir / "multi30k"
    if not (path / "raw" / "train.en.gz").exists():
        pytest.skip(f"Multi30k not found at {path}: set KERAS_TRANSFORMER_DATA to the folder holding multi30k/")
    return path


@pytest.fixture(scope="session")
def pairs() -> list[tuple[str, str]]:
    return list(PAIRS)


@pytest.fixture(scope="session")
def tokenizer() -> kt.TransformerTokenizer:
    return kt.train_tokenizer([s for p in PAIRS for s in p] * 10, vocabulary_size=64)


def make_model(tokenizer, sequence_length: int = 16, **overrides) -> kt.Transformer:
    """A tiny Transformer with a preprocessor."""
    config = {**TINY_CONFIG, **overrides}
    backbone = kt.TransformerBackbone(vocabulary_size=tokenizer.vocabulary_size(), **config)
    preprocessor = kt.TransformerPreprocessor(tokenizer, sequence_length, sequence_length)
    return kt.Transformer(backbone=backbone, preprocessor=preprocessor)


@pytest.fixture
def tiny_model(tokenizer) -> kt.Transformer:
    keras.utils.set_random_seed(7)
    return make_model(tokenizer)


@pytest.fixture(scope="session")
def trained_model(tokenizer) -> kt.Transformer:
    """A tiny model that has memorised PAIRS (greedy translation reproduces them)."""
    keras.utils.set_random_seed(3)
    model = make_model(tokenizer)
    model.compile(optimizer=keras.optimizers.Adam(0.01), label_smoothing=0.0)
    x, y, w = model.preprocessor(
        {"encoder_text": [p[0] for p in PAIRS], "decoder_text": [p[1] for p in PAIRS]}
    )
    # One epoch of 120 identical batches: Keras' per-epoch overhead dominates
    # tiny models, so this is several times faster than 120 epochs.
    repeats = 120
    x = {k: np.tile(ops.convert_to_numpy(v), (repeats, 1)) for k, v in x.items()}
    y, w = (np.tile(ops.convert_to_numpy(t), (repeats, 1)) for t in (y, w))
    model.fit(x, y, sample_weight=w, batch_size=len(PAIRS), epochs=1, shuffle=False, verbose=0)
    return model


def random_algorithms(concrete_function) -> set[int]:
    """The `alg` inputs of the uniform random ops in a traced TensorFlow
    graph (1 = Philox, 2 = Threefry, 3 = the device's default: Philox on CPU)."""
    import tensorflow as tf

    ops_found = concrete_function.graph.get_operations()
    return {int(tf.get_static_value(op.inputs[3])) for op in ops_found if op.type == "StatelessRandomUniformV2"}
