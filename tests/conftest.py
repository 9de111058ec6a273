"""Shared fixtures: a tiny vocabulary and tiny models built from it (helpers.py has the
plain functions and constants)."""

import os
from pathlib import Path

import keras
import numpy as np
import pytest
from keras import ops

# Seed before any tokenizer exists: tf.random.set_seed clears TF's eager
# resources, which breaks a SentencePiece op created earlier.
keras.utils.set_random_seed(1234)

from hypothesis import settings  # noqa: E402

import keras_transformer as kt  # noqa: E402
from helpers import PAIRS, REPO_ROOT, make_model  # noqa: E402

# CI replays the same examples every run (a new random one could fail a
# submission for a reason unrelated to it); locally each run explores new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


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
    x, y, w = model.preprocessor({"encoder_text": [p[0] for p in PAIRS], "decoder_text": [p[1] for p in PAIRS]})
    # One epoch of 120 identical batches: Keras' per-epoch overhead dominates
    # tiny models, so this is several times faster than 120 epochs.
    repeats = 120
    x = {k: np.tile(ops.convert_to_numpy(v), (repeats, 1)) for k, v in x.items()}
    y, w = (np.tile(ops.convert_to_numpy(t), (repeats, 1)) for t in (y, w))
    model.fit(x, y, sample_weight=w, batch_size=len(PAIRS), epochs=1, shuffle=False, verbose=0)
    return model
