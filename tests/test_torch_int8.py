"""Attached, int8 layers on torch multiply through torch's own int8 kernels
(`speed_paths.torch_int8`), with Keras' int8 weights, to Keras' int8 values
within the tolerance of quantizing the inputs."""

import keras
import numpy as np
import pytest
from keras import ops

import keras_transformer as kt
from helpers import PAIRS
from keras_transformer import speed_paths
from keras_transformer.layers import ScaledSharedEmbedding
from keras_transformer.speed_paths import torch_int8

Dense, EinsumDense = keras.layers.Dense, keras.layers.EinsumDense

pytestmark = pytest.mark.skipif(keras.config.backend() != "torch", reason="torch's int8 kernels")


@pytest.fixture
def kernel_calls(monkeypatch):
    """Counts the calls of torch's int8 kernel and the packings of weights."""
    import torch

    calls = {"kernel": 0, "pack": 0}
    kernel, pack = torch.ops.quantized.linear_dynamic, torch_int8._pack

    def counted_kernel(*args):
        calls["kernel"] += 1
        return kernel(*args)

    def counted_pack(*args):
        calls["pack"] += 1
        return pack(*args)

    monkeypatch.setattr(torch_int8, "_pack", counted_pack)
    monkeypatch.setattr(torch.ops.quantized, "linear_dynamic", counted_kernel)
    return calls


def _quantized_pair(make, inputs_shape):
    """The float layer and an int8 copy with the same weights."""
    float_layer, int8_layer = make(), make()
    float_layer.build(inputs_shape)
    int8_layer.build(inputs_shape)
    int8_layer.set_weights(float_layer.get_weights())
    int8_layer.quantize("int8")
    return float_layer, _attached(int8_layer)


def _attached(layer):
    speed_paths.attach(layer)
    assert "torch_int8" in speed_paths.attached_paths(layer)
    return layer


def _without_torch_kernels(layer, inputs, monkeypatch, **kwargs):
    with monkeypatch.context() as patch:
        patch.setattr(torch_int8, "takes_torch_int8", lambda *args: False)
        return ops.convert_to_numpy(layer(inputs, **kwargs))


LAYERS = {
    "dense": (lambda: Dense(24, bias_initializer="random_normal"), (3, 5, 16)),
    "query projection": (lambda: EinsumDense("abc,cde->abde", (None, 2, 8), bias_axes="de"), (3, 5, 16)),
    "output projection": (lambda: EinsumDense("abcd,cde->abe", (None, 16), bias_axes="e"), (3, 5, 2, 8)),
}


@pytest.mark.parametrize("name", LAYERS)
def test_int8_projections_take_torch_kernels_with_keras_int8_values(name, kernel_calls, monkeypatch):
    import torch

    make, shape = LAYERS[name]
    float_layer, int8_layer = _quantized_pair(make, shape)
    inputs = np.random.default_rng(0).normal(size=shape).astype("float32")
    with torch.inference_mode():
        exact = ops.convert_to_numpy(float_layer(inputs))
        int8 = ops.convert_to_numpy(int8_layer(inputs))
        keras_int8 = _without_torch_kernels(int8_layer, inputs, monkeypatch)
    assert kernel_calls["kernel"] == 1 and int8.shape == exact.shape
    # Both quantize the weights alike and the inputs to 7-8 bits: a few percent of the range.
    scale = np.abs(exact).max()
    assert np.abs(int8 - exact).max() < 0.05 * scale
    assert np.abs(int8 - keras_int8).max() < 0.05 * scale
    assert np.abs(int8 - exact).max() > 0  # quantized, not the float product


@pytest.mark.parametrize("tie_weights", [True, False])
def test_the_int8_output_projection_takes_torch_kernels(tie_weights, kernel_calls):
    import torch

    def make():
        return ScaledSharedEmbedding(input_dim=40, output_dim=16, tie_weights=tie_weights)

    float_layer, int8_layer = _quantized_pair(make, None)
    hidden = np.random.default_rng(1).normal(size=(4, 1, 16)).astype("float32")
    with torch.inference_mode():
        exact = ops.convert_to_numpy(float_layer(hidden, reverse=True))
        int8 = ops.convert_to_numpy(int8_layer(hidden, reverse=True))
        embedded = ops.convert_to_numpy(int8_layer(np.array([[1, 2]])))  # lookups stay Keras' own
    assert kernel_calls["kernel"] == 1 and int8.shape == (4, 1, 40) and embedded.shape == (1, 2, 16)
    assert np.abs(int8 - exact).max() < 0.05 * np.abs(exact).max()


def test_weights_are_packed_once_and_again_when_they_change(kernel_calls):
    import torch

    layer = Dense(8)
    layer.build((2, 4))
    layer.quantize("int8")
    _attached(layer)
    inputs = np.ones((2, 4), "float32")
    with torch.inference_mode():
        first = ops.convert_to_numpy(layer(inputs))
        assert ops.convert_to_numpy(layer(inputs)).tolist() == first.tolist()
        assert kernel_calls == {"kernel": 2, "pack": 1}
    layer.kernel.assign(-ops.convert_to_numpy(layer.kernel))  # e.g. weights loaded after quantizing
    with torch.inference_mode():
        again = ops.convert_to_numpy(layer(inputs))
    assert kernel_calls["pack"] == 2
    np.testing.assert_allclose(again, -first, atol=0.05 * np.abs(first).max())


def test_a_gradient_through_an_int8_layer_takes_keras_code(kernel_calls):
    import torch

    layer = Dense(3)
    layer.build((2, 4))
    layer.quantize("int8")
    _attached(layer)
    inputs = torch.ones((2, 4), requires_grad=True)
    layer(inputs).sum().backward()
    assert kernel_calls["kernel"] == 0 and inputs.grad is not None and inputs.grad.shape == (2, 4)


def test_an_int8_translation_runs_on_torch_kernels(trained_model, kernel_calls, tmp_path):
    trained_model.save_to_preset(str(tmp_path / "preset"))
    model = kt.Transformer.from_preset(str(tmp_path / "preset"))  # a copy: the fixture stays float32
    sources = [source for source, _ in PAIRS]
    float_translations = model.translate(sources, beam_size=None)
    model.quantize("int8")
    assert model.translate(sources, beam_size=None) == float_translations
    assert kernel_calls["kernel"] > 0


def test_each_row_is_quantized_on_its_own_scale():
    import torch

    float_layer, int8_layer = _quantized_pair(LAYERS["dense"][0], (2, 16))
    rows = np.random.default_rng(2).normal(size=(2, 16)).astype("float32")
    rows[1] *= 1000  # a row far larger than the other, in the same batch
    with torch.inference_mode():
        exact = ops.convert_to_numpy(float_layer(rows))
        together = ops.convert_to_numpy(int8_layer(rows))
        alone = ops.convert_to_numpy(int8_layer(rows[:1]))
    # The small row keeps its own precision: with one scale for the batch it would round to zero.
    assert np.abs(together[0] - exact[0]).max() < 0.05 * np.abs(exact[0]).max()
    np.testing.assert_allclose(together[0], alone[0], atol=0.05 * np.abs(exact[0]).max())


def _int8_dense(kernel):
    layer = Dense(kernel.shape[1], use_bias=False)
    layer.build((None, kernel.shape[0]))
    layer.kernel.assign(kernel)
    layer.quantize("int8")
    return _attached(layer)


def test_signed_inputs_keep_eight_bits():
    import torch

    identity = _int8_dense(np.eye(256, dtype="float32"))  # exact in 7 bits and in 8
    row = np.linspace(-1.0, 1.0, 256, dtype="float32")[None]
    with torch.inference_mode():
        error = np.abs(ops.convert_to_numpy(identity(row)) - row).max()
    # Rounding to 255 steps over [-1, 1] errs by at most 1/255; to 127 steps (7 bits), up to 1/127.
    assert error < 0.005


def test_sums_of_large_products_do_not_saturate():
    import torch

    ones = _int8_dense(np.ones((64, 4), "float32"))
    with torch.inference_mode():
        outputs = ops.convert_to_numpy(ones(np.ones((2, 64), "float32")))
    # With 8-bit inputs and 8-bit weights, CPUs without VNNI clip each pair's sum to 32,767: about half.
    np.testing.assert_allclose(outputs, 64.0, rtol=0.01)
