"""Weights saved on one backend give the same results on the other two."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from keras import ops

from helpers import PAIRS, REPO_ROOT

SOURCES = [p[0] for p in PAIRS] + ["a dog sleeps .", "two women walk ."]

PROBE = """
import json, sys
import numpy as np
from keras import ops
import keras_transformer as kt
model = kt.Transformer.from_preset(sys.argv[1])
x, _, _ = model.preprocessor({"encoder_text": SOURCES, "decoder_text": TARGETS})
np.save(sys.argv[2] + ".npy", ops.convert_to_numpy(model(x)))
json.dump(model.translate(SOURCES, beam_size=3), open(sys.argv[2] + ".json", "w"))
"""


def probe(backend: str, preset: str, out: str) -> tuple[np.ndarray, list[str]]:
    code = f"SOURCES = {SOURCES!r}\nTARGETS = {[p[1] for p in PAIRS] * 2!r}[:len(SOURCES)]\n" + PROBE
    env = {**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", code, preset, out], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, f"{backend} failed:\n{result.stderr[-3000:]}"
    return np.load(out + ".npy"), json.load(open(out + ".json"))


@pytest.mark.slow
def test_other_backends_give_the_same_logits_and_translations(trained_model, tmp_path):
    preset = str(tmp_path / "preset")
    trained_model.save_to_preset(preset)
    targets = ([p[1] for p in PAIRS] * 2)[: len(SOURCES)]
    x, _, _ = trained_model.preprocessor({"encoder_text": SOURCES, "decoder_text": targets})
    logits = ops.convert_to_numpy(trained_model(x))
    translations = trained_model.translate(SOURCES, beam_size=3)
    others = [b for b in ("tensorflow", "jax", "torch") if b != keras.config.backend()]
    for backend in others:
        other_logits, other_translations = probe(backend, preset, str(tmp_path / backend))
        np.testing.assert_allclose(other_logits, logits, atol=1e-4, err_msg=backend)
        assert other_translations == translations, backend
