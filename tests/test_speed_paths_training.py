"""Speed path `openblas_products`: a JAX training step's products in OpenBLAS give the plain layers' logits and
gradients up to float32 rounding, and the path is chosen for compiled JAX training steps only."""

import keras
import numpy as np
import pytest

from helpers import make_model
from keras_transformer import speed_paths
from keras_transformer.speed_paths import Runtime, openblas_products

BACKEND = keras.config.backend()
INPUTS = {
    "encoder_token_ids": np.array([[2, 9, 14, 21, 3, 0], [2, 30, 11, 3, 0, 0]], "int32"),
    "encoder_padding_mask": np.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]], "int32"),
    "decoder_token_ids": np.array([[0, 7, 12, 5, 3], [0, 8, 3, 0, 0]], "int32"),
    "decoder_padding_mask": np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], "int32"),
}


@pytest.mark.parametrize("compiled, training", [(False, True), (True, False), (False, False)])
def test_openblas_products_are_for_compiled_training_steps_only(compiled, training):
    runtime = Runtime("jax", "cpu", frozenset({"avx2"}), 2, compiled=compiled, training=training)
    assert not speed_paths.PATHS["openblas_products"].applies_to(runtime)


def test_openblas_products_are_not_for_other_backends():
    for backend in ("tensorflow", "torch"):
        runtime = Runtime(backend, "cpu", frozenset({"avx2"}), 2, compiled=True, training=True)
        assert not speed_paths.PATHS["openblas_products"].applies_to(runtime)


@pytest.mark.skipif(BACKEND != "jax", reason="an XLA FFI handler for JAX")
def test_openblas_products_give_the_plain_logits_and_gradients(tokenizer):
    import jax
    import jax.numpy as jnp

    if not openblas_products.handler_registered():
        pytest.skip("openblas_products needs g++ and scipy-openblas64 (pip install keras-transformer[openblas])")
    backbone = make_model(tokenizer, use_logits_bias=True).backbone
    trainable = [v.value for v in backbone.trainable_variables]
    others = [v.value for v in backbone.non_trainable_variables]
    weights = jnp.asarray(np.random.default_rng(0).standard_normal((2, 5, tokenizer.vocabulary_size())), "float32")

    def logits_and_gradients():
        def score(values):
            hidden, _ = backbone.stateless_call(values, others, INPUTS)
            logits = backbone.logits(hidden["decoder_sequence_output"])
            return jnp.sum(jnp.sin(logits) * weights), logits

        (_, logits), gradients = jax.jit(jax.value_and_grad(score, has_aux=True))(trainable)
        return np.asarray(logits), [np.asarray(g) for g in gradients]

    plain = logits_and_gradients()
    others_off = frozenset(speed_paths.PATHS) - {"openblas_products"}
    runtime = Runtime("jax", "cpu", frozenset({"avx2"}), 2, others_off, compiled=True, training=True)
    assert speed_paths.attach(backbone, runtime, compiled=True, training=True) == ("openblas_products",)
    attached = logits_and_gradients()
    speed_paths.detach(backbone)
    np.testing.assert_allclose(attached[0], plain[0], rtol=1e-5, atol=1e-5)
    for got, expected in zip(attached[1], plain[1]):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
