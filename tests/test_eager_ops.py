"""`speed_paths.eager_ops` gives `keras.ops`' values and dtypes on every backend,
and on torch and eager TensorFlow calls the backend directly only where that
gives the same; `speed_paths.torch_linear`, the projections' one `addmm` on
torch, gives the product plus the bias."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer.speed_paths import eager_ops

ON_TORCH = keras.config.backend() == "torch"
DIRECT = keras.config.backend() in ("torch", "tensorflow")


def _floats(*shape, dtype="float32"):
    return ops.convert_to_tensor(np.random.default_rng(len(shape)).normal(size=shape).astype("float32"), dtype=dtype)


def _indices(rows, trailing_ones=0):
    return ops.convert_to_tensor(np.array(rows, "int32").reshape(np.shape(rows) + (1,) * trailing_ones))


def _cases():
    x, y = _floats(2, 3, 4), _floats(2, 4, 5)
    mask = ops.convert_to_tensor(np.array([[True, False, True, True]] * 3))
    return {
        "matmul": ("matmul", (x, y), {}),
        "matmul, a batch by a matrix": ("matmul", (x, _floats(4, 5)), {}),
        "matmul, two matrices": ("matmul", (_floats(3, 4), _floats(4, 2)), {}),
        "matmul, a matrix by a batch": ("matmul", (_floats(3, 4), y), {}),
        "matmul, float32 by int32": ("matmul", (x, ops.ones((4, 2), "int32")), {}),
        "einsum": ("einsum", ("abc,cd->abd", x, _floats(4, 6)), {}),
        "einsum, into heads": ("einsum", ("abc,cde->abde", x, _floats(4, 2, 3)), {}),
        "einsum, from heads": ("einsum", ("abcd,cde->abe", _floats(2, 3, 2, 4), _floats(2, 4, 5)), {}),
        "einsum, another equation": ("einsum", ("abc,dc->abd", x, _floats(6, 4)), {}),
        "add": ("add", (x, _floats(4)), {}),
        "add, bfloat16 and float32": ("add", (_floats(4, dtype="bfloat16"), _floats(4)), {}),
        "add, a Python number": ("add", (x, 2.0), {}),
        "reshape": ("reshape", (x, (6, -1)), {}),
        "transpose": ("transpose", (x, (0, 2, 1)), {}),
        "transpose, reversed": ("transpose", (x,), {}),
        "cast": ("cast", (x, "int32"), {}),
        "cast, bfloat16": ("cast", (x, "bfloat16"), {}),
        "shape": ("shape", (x,), {}),
        "softmax": ("softmax", (x,), {"axis": -1}),
        "softmax, two axes": ("softmax", (x,), {"axis": (1, 2)}),
        "where, a float": ("where", (mask, x, -1e9), {}),
        "where, the float first": ("where", (mask, -1e9, x), {}),
        "where, two tensors": ("where", (mask, x, -x), {}),
        "where, an int": ("where", (mask, ops.ones((3, 4), "int32"), 7), {}),
        "layer_normalization": ("layer_normalization", (x, _floats(4), _floats(4)), {"epsilon": 1e-3}),
        "layer_normalization, list axis": ("layer_normalization", (x, _floats(4), _floats(4), [-1], 1e-6), {}),
        "take_along_axis, rows": (
            "take_along_axis",
            (_floats(2, 5, 3), _indices([[4, 0, 0, 2], [1, 3, 2, 2]], 1)),
            {"axis": 1},
        ),
        "take_along_axis, matrix": ("take_along_axis", (_floats(2, 5), _indices([[4, 0], [-1, 3]])), {"axis": 1}),
        "take_along_axis, full indices": (
            "take_along_axis",
            (_floats(2, 5, 3), ops.convert_to_tensor(np.zeros((2, 4, 3), "int32"))),
            {"axis": 1},
        ),
        "take_along_axis, axis 2": (
            "take_along_axis",
            (_floats(2, 3, 5), _indices([[[1], [0], [4]]] * 2)),
            {"axis": 2},
        ),
        "layer_normalization, rms": ("layer_normalization", (x, _floats(4), None), {"rms_scaling": True}),
        "slice_update": ("slice_update", (x, (0, 1, 0), _floats(2, 1, 4)), {}),
        "slice_update, a tensor index": ("slice_update", (x, (0, ops.convert_to_tensor(2), 0), _floats(2, 1, 4)), {}),
    }


@pytest.mark.parametrize("case", list(_cases()))
def test_the_same_values_and_dtype_as_keras_ops(case):
    name, args, kwargs = _cases()[case]
    expected = getattr(ops, name)(*args, **kwargs)
    got = getattr(eager_ops, name)(*args, **kwargs)
    if name == "shape":
        assert tuple(got) == tuple(expected) and all(type(size) is int for size in got)
        return
    assert keras.backend.standardize_dtype(got.dtype) == keras.backend.standardize_dtype(expected.dtype)
    np.testing.assert_array_equal(
        ops.convert_to_numpy(ops.cast(got, "float32")), ops.convert_to_numpy(ops.cast(expected, "float32"))
    )


def test_keras_variables_are_read_as_keras_reads_them():
    variable = keras.Variable(np.eye(4, dtype="float32"))
    x = _floats(3, 4)
    np.testing.assert_array_equal(ops.convert_to_numpy(eager_ops.matmul(x, variable)), ops.convert_to_numpy(x))


def test_every_other_name_is_keras_ops():
    assert eager_ops.top_k is ops.top_k
    assert eager_ops.log_softmax is ops.log_softmax
    with pytest.raises(AttributeError):
        _ = eager_ops.no_such_operation


def test_symbolic_tensors_go_through_keras():
    inputs = keras.Input((3, 4))
    assert isinstance(eager_ops.reshape(inputs, (-1, 12)), keras.KerasTensor)
    assert eager_ops.shape(inputs) == (None, 3, 4)


@pytest.mark.skipif(not DIRECT, reason="on JAX these names are keras.ops' own functions")
def test_plain_operands_skip_keras_and_others_do_not(monkeypatch):
    through_keras = []
    for name in ("matmul", "reshape", "where", "layer_normalization"):
        keras_op = getattr(ops, name)
        monkeypatch.setattr(
            ops, name, lambda *a, _op=keras_op, _name=name, **k: through_keras.append(_name) or _op(*a, **k)
        )
    x = _floats(2, 3)
    eager_ops.matmul(x, _floats(3, 2))
    eager_ops.reshape(x, (3, 2))
    eager_ops.where(x > 0, x, 0.0)
    eager_ops.layer_normalization(x, _floats(3), _floats(3), [-1], 1e-6)
    assert through_keras == []
    eager_ops.matmul(x, ops.ones((3, 2), "int32"))
    eager_ops.reshape(x, [3, 2])
    eager_ops.where(x > 0, x, 0)
    eager_ops.layer_normalization(x, _floats(3), None, -1, 1e-6)
    assert through_keras == ["matmul", "reshape", "where", "layer_normalization"]


@pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="tf.function is TensorFlow's")
def test_inside_tf_function_everything_goes_through_keras(monkeypatch):
    import tensorflow as tf

    through_keras = []
    keras_op = ops.matmul
    monkeypatch.setattr(ops, "matmul", lambda *a: through_keras.append("matmul") or keras_op(*a))
    variable = keras.Variable(np.eye(3, dtype="float32"))
    traced = tf.function(lambda x: eager_ops.matmul(x, variable))
    np.testing.assert_array_equal(traced(_floats(2, 3)).numpy(), np.asarray(_floats(2, 3)))
    assert through_keras == ["matmul"]


@pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="gradients recorded eagerly: TensorFlow's tape")
def test_eager_gradients_are_keras_gradients():
    import tensorflow as tf

    kernel = keras.Variable(np.asarray(_floats(4, 4)))
    gamma, beta = keras.Variable(np.asarray(_floats(4))), keras.Variable(np.zeros(4, "float32"))
    x = _floats(2, 3, 4)

    def gradients(library):
        with tf.GradientTape() as tape:
            hidden = library.layer_normalization(library.matmul(x, kernel), gamma, beta, epsilon=1e-6)
            loss = ops.sum(library.softmax(hidden) * x)
        return [g.numpy() for g in tape.gradient(loss, [kernel.value, gamma.value, beta.value])]

    for got, expected in zip(gradients(eager_ops), gradients(ops)):  # summed in another order: last bits
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.skipif(not ON_TORCH, reason="torch's addmm")
@pytest.mark.parametrize(
    "subscripts, x_shape, kernel_shape",
    [
        ("abc,cd->abd", (2, 3, 4), (4, 6)),
        ("abc,cde->abde", (2, 3, 4), (4, 2, 3)),
        ("abcd,cde->abe", (2, 3, 2, 4), (2, 4, 5)),
    ],
)
def test_torch_linear_is_the_product_plus_the_bias(subscripts, x_shape, kernel_shape):
    from keras_transformer.speed_paths.einsum_equations import contracted_axes
    from keras_transformer.speed_paths.torch_linear import linear

    contracted = contracted_axes(subscripts)
    x, kernel = _floats(*x_shape), keras.Variable(np.asarray(_floats(*kernel_shape)))
    bias = keras.Variable(np.asarray(_floats(*kernel_shape[contracted:])))
    fused = linear(x, kernel, bias, contracted)
    expected = ops.einsum(subscripts, x, kernel) + bias
    np.testing.assert_allclose(ops.convert_to_numpy(fused), ops.convert_to_numpy(expected), rtol=1e-5, atol=1e-5)
    assert linear(ops.cast(x, "bfloat16"), kernel, bias, contracted) is None  # float32 only
