"""bfloat16 products traced inside `float32_accumulation()` are bfloat16 x bfloat16 -> float32 dots on JAX's CPU
backend, with the values and gradients of Keras' own products."""

import contextlib
import re

import numpy as np
import pytest
from keras import ops

from keras_transformer.layers.bfloat16_products import float32_accumulation

PRODUCTS = {
    "matmul (dense layer)": (lambda a, b: ops.matmul(a, b), (2, 5, 8), (8, 6)),
    "einsum (attention projection in)": (lambda a, b: ops.einsum("abc,cde->abde", a, b), (2, 5, 8), (8, 3, 4)),
    "einsum (attention projection out)": (lambda a, b: ops.einsum("abcd,cde->abe", a, b), (2, 5, 3, 4), (3, 4, 6)),
}


def operands(shape_a, shape_b):
    rng = np.random.default_rng(0)
    return [ops.cast(rng.standard_normal(s).astype("float32"), "bfloat16") for s in (shape_a, shape_b)]


@pytest.fixture
def jax():
    import keras

    if keras.config.backend() != "jax":
        pytest.skip("the products are rerouted on JAX only")
    import jax

    return jax


@pytest.mark.parametrize("name", sorted(PRODUCTS))
def test_values_and_gradients_are_keras_own(jax, name):
    product, shape_a, shape_b = PRODUCTS[name]
    a, b = operands(shape_a, shape_b)

    def loss(a, b):
        return ops.sum(ops.cast(product(a, b), "float32") ** 2)

    expected_value, expected_gradients = jax.value_and_grad(loss, argnums=(0, 1))(a, b)
    with float32_accumulation():
        value, gradients = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(a, b)
    np.testing.assert_allclose(float(value), float(expected_value), rtol=2e-2)
    for gradient, expected in zip(gradients, expected_gradients):
        assert gradient.dtype == expected.dtype == "bfloat16"
        gradient, expected = (np.asarray(g, "float32") for g in (gradient, expected))
        np.testing.assert_allclose(gradient, expected, rtol=5e-2, atol=0.1)


def test_the_traced_dot_takes_bfloat16_and_sums_in_float32(jax):
    a, b = operands((32, 64), (64, 48))
    outside = jax.jit(lambda a, b: ops.matmul(a, b)).lower(a, b).compile().as_text()
    with float32_accumulation():
        inside = jax.jit(lambda a, b: ops.matmul(a, b)).lower(a, b).compile().as_text()
    assert _dot_operand_types(inside) == {"bf16"}
    assert _dot_operand_types(outside) == {"f32"}  # Keras' own product: XLA converts the operands first


def _dot_operand_types(program: str) -> set[str]:
    types = dict(re.findall(r"%(\S+) = (\w+)\[", program))
    operands = re.findall(r" dot\(%([^,\s)]+), %([^,\s)]+)\)", program)
    return {types[name] for pair in operands for name in pair}


def test_other_products_and_dtypes_are_left_alone():
    a, b = (np.ones((2, 3, 4), "float32"), np.ones((2, 4, 5), "float32"))
    with float32_accumulation():
        batched = ops.matmul(ops.cast(a, "bfloat16"), ops.cast(b, "bfloat16"))  # batched: not a tensordot
        single = ops.matmul(a[0], b[0])
    assert ops.convert_to_numpy(ops.cast(batched, "float32")).tolist() == np.full((2, 3, 5), 4.0).tolist()
    assert ops.convert_to_numpy(single).dtype == np.float32


@pytest.fixture
def bfloat16_units(jax):
    from keras_transformer.layers.bfloat16_products import cpu_has_bfloat16_instructions

    if jax.default_backend() != "cpu" or not cpu_has_bfloat16_instructions():
        pytest.skip("the products are rerouted on CPUs with bfloat16 instructions only")


def _task_program(jax, tokenizer, enabled: bool) -> str:
    """The optimised XLA program of a tiny `mixed_bfloat16` Transformer's
    forward pass, as `fit` runs it (the functional graph of its layers)."""
    from helpers import make_model

    model = make_model(tokenizer, dtype="mixed_bfloat16")
    inputs = {
        "encoder_token_ids": np.ones((2, 5), "int32"),
        "encoder_padding_mask": np.ones((2, 5), "int32"),
        "decoder_token_ids": np.ones((2, 4), "int32"),
        "decoder_padding_mask": np.ones((2, 4), "int32"),
    }
    values = [v.value for v in model.trainable_variables + model.non_trainable_variables]

    def forward(values, inputs):
        trainable, non_trainable = values[: len(model.trainable_variables)], values[len(model.trainable_variables) :]
        return model.stateless_call(trainable, non_trainable, inputs)[0]

    # As a user's `fit`: no `float32_accumulation` around it; or turned off.
    with contextlib.nullcontext() if enabled else float32_accumulation(False):
        return jax.jit(forward).lower(values, inputs).compile().as_text()


def _dots_by_output_width(program: str) -> dict[int, set[str]]:
    """The operand element types of the program's dots, by their output's last dimension."""
    types = dict(re.findall(r"%(\S+) = (\w+)\[", program))
    dots = re.findall(r"= \w+\[(?:\d+,)*(\d+)\]\S* dot\(%([^,\s)]+), %([^,\s)]+)\)", program)
    widths = {}
    for width, first, second in dots:
        widths.setdefault(int(width), set()).update((types[first], types[second]))
    return widths


def test_the_model_s_layers_trace_bfloat16_dots(jax, bfloat16_units, tokenizer):
    # The feed-forward layers (d_ff = 32 wide) and the pre-softmax projection
    # (64 tokens wide) multiply bfloat16 operands; without it XLA converts
    # them to float32 first.
    vocabulary, d_ff = tokenizer.vocabulary_size(), 32
    assert vocabulary == 64
    inside, outside = (
        _dots_by_output_width(_task_program(jax, tokenizer, True)),
        _dots_by_output_width(_task_program(jax, tokenizer, False)),
    )
    assert inside[vocabulary] == inside[d_ff] == {"bf16"}
    assert outside[vocabulary] == outside[d_ff] == {"f32"}


def test_tensorflow_trains_bfloat16_without_xla_and_decodes_with_it(monkeypatch, tokenizer):
    import keras

    if keras.config.backend() != "tensorflow":
        pytest.skip("XLA is chosen per dtype on TensorFlow only")
    from helpers import make_model
    from keras_transformer.generation import decoding
    from keras_transformer.models import transformer

    for has_units, expected in ((False, True), (True, False)):  # ends with bfloat16 units
        monkeypatch.setattr(decoding, "cpu_has_bfloat16_instructions", lambda has_units=has_units: has_units)
        assert decoding.resolve_jit_compile("auto", "bfloat16") is expected
        assert decoding.resolve_jit_compile("auto", "float32") is True
        assert decoding.resolve_jit_compile("auto") is True
        assert decoding.resolve_jit_compile(True, "bfloat16") is True

    # A compiled bfloat16 model: training steps without XLA, its searches with it.
    searches = []
    monkeypatch.setattr(transformer, "compiled_search", lambda model, jit, *args: searches.append(jit) or (1 / 0))
    model = make_model(tokenizer, dtype="mixed_bfloat16")
    model.compile()
    assert model.jit_compile is False
    with pytest.raises(ZeroDivisionError):
        model.generate("a dog runs .")
    assert searches == [True]
