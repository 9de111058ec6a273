"""The TensorFlow side of `speed_paths.eager_ops`: `keras.ops`' functions that run
TensorFlow's operations directly (`tf.raw_ops`) on eager tensors, outside
any `tf.function`, where that gives what `keras.ops` gives, and go through
`keras.ops` otherwise.

Each runs the operations Keras' TensorFlow backend would run for these
operands, in the same order, so the values are Keras' to the bit; gradients
recorded on a `tf.GradientTape` are Keras' up to the order in which a
tensor's are summed (a float32 ulp). Inside a
`tf.function` (the compiled search) every call goes through `keras.ops`:
there it runs once, while tracing.
"""

import functools

import keras
import tensorflow as tf
from keras import ops

raw = tf.raw_ops


def _plain(x):
    """`x` as an eager tensor if it is one (or a variable's value read now), else None."""
    if not tf.executing_eagerly():
        return None
    if isinstance(x, keras.Variable):
        x = x.value
    if isinstance(x, tf.Variable):
        return x.value()
    return x if isinstance(x, tf.Tensor) else None


def _same_float(a, b):
    """`(a, b)` as eager tensors of one floating dtype, else None."""
    a, b = _plain(a), _plain(b)
    if a is None or b is None or a.dtype != b.dtype or not a.dtype.is_floating:
        return None
    return a, b


@functools.lru_cache(maxsize=4096)
def _int32s(values: int | tuple[int, ...]):
    """A shape, a permutation or an axis as a tensor, made once: converting a
    tuple takes longer than the operation that reads it."""
    return tf.constant(values, tf.int32)


@functools.lru_cache(maxsize=256)
def _scalar(value: float, dtype: tf.DType):
    return tf.constant(value, dtype)


def matmul(x1, x2):
    """As Keras: `MatMul` for two matrices, a batched product for two
    batches, and a batch times a matrix as one `MatMul` of the batch
    flattened to rows (`tf.tensordot`'s way)."""
    operands = _same_float(x1, x2)
    if operands:
        a, b = operands
        if a.shape.rank == 2 and b.shape.rank == 2:
            return raw.MatMul(a=a, b=b)
        if a.shape.rank > 2 and b.shape.rank > 2:
            return raw.BatchMatMulV2(x=a, y=b)
        if a.shape.rank > 2 and b.shape.rank == 2:
            rows = raw.MatMul(a=raw.Reshape(tensor=a, shape=_int32s((-1, a.shape[-1]))), b=b)
            return raw.Reshape(tensor=rows, shape=_int32s((*a.shape[:-1], b.shape[-1])))
    return ops.matmul(x1, x2)


def einsum(subscripts, x1, x2):
    """The projections' equations, as Keras' TensorFlow backend runs them:
    a batched product with the kernel flattened to a matrix, and reshapes."""
    operands = _same_float(x1, x2)
    if operands:
        x, kernel = operands
        if subscripts == "abc,cd->abd":
            return raw.BatchMatMulV2(x=x, y=kernel)
        if subscripts == "abc,cde->abde":
            (_, b, c), (_, d, e) = x.shape, kernel.shape
            product = raw.BatchMatMulV2(x=x, y=raw.Reshape(tensor=kernel, shape=_int32s((c, -1))))
            return raw.Reshape(tensor=product, shape=_int32s((-1, b, d, e)))
        if subscripts == "abcd,cde->abe":
            (_, b, c, d), e = x.shape, kernel.shape[-1]
            rows = raw.Reshape(tensor=x, shape=_int32s((-1, b, c * d)))
            return raw.BatchMatMulV2(x=rows, y=raw.Reshape(tensor=kernel, shape=_int32s((-1, e))))
    return ops.einsum(subscripts, x1, x2)


def add(x1, x2):
    operands = _same_float(x1, x2)
    return raw.AddV2(x=operands[0], y=operands[1]) if operands else ops.add(x1, x2)


def reshape(x, newshape):
    tensor = _plain(x)
    if tensor is not None and isinstance(newshape, tuple) and all(type(size) is int for size in newshape):
        return raw.Reshape(tensor=tensor, shape=_int32s(newshape))
    return ops.reshape(x, newshape)


def transpose(x, axes=None):
    tensor = _plain(x)
    if tensor is not None and isinstance(axes, tuple | list) and all(type(axis) is int for axis in axes):
        return raw.Transpose(x=tensor, perm=_int32s(tuple(axes)))
    return ops.transpose(x, axes)


_TF_DTYPES = {"float32": tf.float32, "bool": tf.bool, "int32": tf.int32}


def cast(x, dtype):
    tensor = _plain(x)
    if tensor is not None and dtype in _TF_DTYPES:
        target = _TF_DTYPES[dtype]
        return tensor if tensor.dtype == target else raw.Cast(x=tensor, DstT=target)
    return ops.cast(x, dtype)


def shape(x):
    tensor = _plain(x)
    return tuple(tensor.shape) if tensor is not None else ops.shape(x)


def softmax(x, axis=-1):
    tensor = _plain(x)
    if tensor is not None and tensor.dtype == tf.float32 and axis in (-1, tensor.shape.rank - 1):
        return raw.Softmax(logits=tensor)
    return ops.softmax(x, axis=axis)


def layer_normalization(x, gamma=None, beta=None, axis=-1, epsilon=None, rms_scaling=False):
    """Over the last axis, with a scale and an offset, float32: Keras' steps
    (`tf.nn.moments`, then `x * inv + (beta - mean * inv)`) as raw operations."""
    tensor, operands = _plain(x), _same_float(gamma, beta)
    last = axis[0] if isinstance(axis, list | tuple) and len(axis) == 1 else axis
    if (
        tensor is None
        or tensor.dtype != tf.float32
        or not operands
        or operands[0].dtype != tf.float32
        or last not in (-1, tensor.shape.rank - 1)
        or epsilon is None
        or rms_scaling
    ):
        return ops.layer_normalization(x, gamma, beta, axis, epsilon, rms_scaling=rms_scaling)
    gamma, beta = operands
    last_axis = _int32s((tensor.shape.rank - 1,))
    mean = raw.Mean(input=tensor, axis=last_axis, keep_dims=True)
    deviation = raw.SquaredDifference(x=tensor, y=raw.StopGradient(input=mean))
    variance = raw.Mean(input=deviation, axis=last_axis, keep_dims=True)
    inv = raw.Mul(x=raw.Rsqrt(x=raw.AddV2(x=variance, y=_scalar(epsilon, tf.float32))), y=gamma)
    offset = raw.AddV2(x=raw.Mul(x=raw.Neg(x=mean), y=inv), y=beta)
    return raw.AddV2(x=raw.Mul(x=tensor, y=inv), y=offset)


def take_along_axis(x, indices, axis=None):
    """Rows picked along axis 1 by indices of shape `(batch, k, 1, ...)`
    (the search's beams and tokens): one batched `GatherV2`."""
    tensor, picks = _plain(x), _plain(indices)
    if (
        tensor is not None
        and picks is not None
        and axis == 1
        and picks.dtype.is_integer
        and picks.shape.rank == tensor.shape.rank >= 2
        and picks.shape[0] == tensor.shape[0]
        and all(size == 1 for size in picks.shape[2:])
    ):
        picks = raw.Reshape(tensor=picks, shape=_int32s(tuple(picks.shape[:2])))
        # A negative index counts from the end, as in Keras.
        length = _scalar(tensor.shape[1], picks.dtype)
        picks = raw.SelectV2(
            condition=raw.Less(x=picks, y=_scalar(0, picks.dtype)), t=raw.AddV2(x=picks, y=length), e=picks
        )
        return raw.GatherV2(params=tensor, indices=picks, axis=_int32s(1), batch_dims=1)
    return ops.take_along_axis(x, indices, axis=axis)


def where(condition, x1, x2):
    c, a, b = _plain(condition), _plain(x1), _plain(x2)
    if c is not None and c.dtype == tf.bool:
        if a is not None and b is not None and a.dtype == b.dtype:
            return raw.SelectV2(condition=c, t=a, e=b)
        if a is not None and a.dtype.is_floating and isinstance(x2, float):
            return raw.SelectV2(condition=c, t=a, e=_scalar(x2, a.dtype))
        if b is not None and b.dtype.is_floating and isinstance(x1, float):
            return raw.SelectV2(condition=c, t=_scalar(x1, b.dtype), e=b)
    return ops.where(condition, x1, x2)


def slice_update(inputs, start_indices, updates):
    """TensorFlow's own strided-slice update, where Keras writes XLA's
    DynamicUpdateSlice, which eager TensorFlow compiles with XLA for every
    new shape it meets (a decoding cache's at every search). The update must
    lie inside `inputs`."""
    tensor = _plain(inputs)
    if tensor is None:
        return ops.slice_update(inputs, start_indices, updates)
    begin = [int(start) for start in start_indices]
    end = [start + size for start, size in zip(begin, updates.shape, strict=True)]
    return raw.TensorStridedSliceUpdate(
        input=tensor, begin=begin, end=end, strides=[1] * len(begin), value=cast(updates, tensor.dtype.name)
    )
