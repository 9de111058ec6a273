"""Without TensorFlow (a JAX or PyTorch machine), the models import, decode
and train; the tokenizers work (with `sentencepiece`, see
test_tokenizers_without_tensorflow.py); `tf.data` pipelines say what is missing."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import REPO_ROOT

WITHOUT_MODULES = Path(__file__).resolve().parent / "without_modules"


def run_without(modules: str, code: str, backend: str = "jax", timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh Python where `modules` cannot be imported."""
    env = {
        **os.environ,
        "BLOCKED_MODULES": modules,
        "KERAS_BACKEND": backend,
        "PYTHONPATH": os.pathsep.join([str(WITHOUT_MODULES), str(REPO_ROOT)]),
    }
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_blocker_blocks():
    result = run_without("tensorflow", "import tensorflow")
    assert result.returncode != 0 and "blocked by tests/without_modules" in result.stderr


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_a_model_translates_token_ids_and_trains_without_tensorflow(backend):
    result = run_without(
        "tensorflow,tensorflow_text",
        """
        import sys
        import keras, numpy as np
        from keras_transformer import Transformer, TransformerBackbone
        backbone = TransformerBackbone(vocabulary_size=40, num_encoder_layers=1, num_decoder_layers=1,
                                       num_heads=2, hidden_dim=8, intermediate_dim=16, dropout=0.1)
        model = Transformer(backbone=backbone, preprocessor=None)
        ids = np.array([[1, 5, 6, 7, 2]], "int32")
        out = model.generate({"encoder_token_ids": ids, "encoder_padding_mask": ids > 0}, max_length=8)
        print("generated", np.asarray(out["decoder_token_ids"]).shape)
        model.compile()
        x = {"encoder_token_ids": ids, "encoder_padding_mask": ids > 0,
             "decoder_token_ids": ids, "decoder_padding_mask": ids > 0}
        history = keras.Model.fit(model, x, ids, epochs=1, verbose=0)
        print("loss", history.history["loss"][0])
        assert "tensorflow" not in sys.modules
    """,
        backend=backend,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "generated (1, " in result.stdout and "loss" in result.stdout


def test_tokenizers_are_made_and_tf_data_pipelines_say_what_is_missing():
    result = run_without(
        "tensorflow,tensorflow_text",
        """
        from keras_transformer import TransformerTokenizer
        from keras_transformer.training import data
        from keras_transformer.marian import MarianTokenizer
        TransformerTokenizer(), MarianTokenizer()
        for make in (lambda: data.token_batches(None, 100), lambda: data.tokenize_pairs([], [], None)):
            try:
                make()
            except ImportError as error:
                print("ImportError:", error)
            else:
                raise AssertionError("no ImportError")
    """,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("ImportError:")]
    assert len(lines) == 2 and all("tensorflow-text" in line for line in lines), result.stdout
