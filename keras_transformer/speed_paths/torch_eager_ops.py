"""The torch side of `speed_paths.eager_ops`: `keras.ops`' functions that call
torch directly on plain torch tensors (or Keras variables holding them) where
that gives what `keras.ops` gives, and go through `keras.ops` otherwise."""

import keras
import torch
from keras import ops


def _plain(x):
    """`x` as a torch tensor if it is one (or a Keras variable's value), else None."""
    if isinstance(x, keras.Variable):
        x = x.value
    return x if isinstance(x, torch.Tensor) else None


def _same_float(a, b):
    """`(a, b)` as torch tensors of one floating dtype, else None."""
    a, b = _plain(a), _plain(b)
    if a is None or b is None or a.dtype != b.dtype or not a.dtype.is_floating_point:
        return None
    return a, b


def matmul(x1, x2):
    operands = _same_float(x1, x2)
    if not operands:
        return ops.matmul(x1, x2)
    a, b = operands
    if a.dtype == torch.float16 and a.device.type == "cpu":
        # As Keras does: torch's float16 product on a CPU rounds otherwise, and runs slower.
        return torch.matmul(a.float(), b.float()).half()
    return torch.matmul(a, b)


def einsum(subscripts, x1, x2):
    operands = _same_float(x1, x2)
    return torch.einsum(subscripts, *operands) if operands else ops.einsum(subscripts, x1, x2)


def add(x1, x2):
    operands = _same_float(x1, x2)
    return torch.add(*operands) if operands else ops.add(x1, x2)


def reshape(x, newshape):
    tensor = _plain(x)
    if tensor is not None and isinstance(newshape, tuple) and all(type(size) is int for size in newshape):
        return tensor.reshape(newshape)
    return ops.reshape(x, newshape)


def transpose(x, axes=None):
    tensor = _plain(x)
    return tensor.permute(axes) if tensor is not None and axes is not None else ops.transpose(x, axes)


_TORCH_DTYPES = {"float32": torch.float32, "bool": torch.bool, "int32": torch.int32}


def cast(x, dtype):
    tensor = _plain(x)
    if tensor is not None and dtype in _TORCH_DTYPES:
        return tensor.to(_TORCH_DTYPES[dtype])
    return ops.cast(x, dtype)


def shape(x):
    tensor = _plain(x)
    return tuple(tensor.shape) if tensor is not None else ops.shape(x)


def softmax(x, axis=-1):
    tensor = _plain(x)
    if tensor is not None and tensor.dtype == torch.float32 and isinstance(axis, int):
        return torch.softmax(tensor, axis)
    return ops.softmax(x, axis=axis)


def layer_normalization(x, gamma=None, beta=None, axis=-1, epsilon=None, rms_scaling=False):
    """Over the last axis, with a scale and an offset: `torch.nn.functional.layer_norm`, as Keras calls it."""
    tensor, operands = _plain(x), _same_float(gamma, beta)
    last = axis[0] if isinstance(axis, list | tuple) and len(axis) == 1 else axis
    if (
        tensor is not None
        and tensor.dtype == torch.float32
        and operands
        and operands[0].dtype == torch.float32
        and last in (-1, tensor.ndim - 1)
        and epsilon is not None
        and not rms_scaling
    ):
        return torch.nn.functional.layer_norm(tensor, tensor.shape[-1:], *operands, epsilon)
    return ops.layer_normalization(x, gamma, beta, axis, epsilon, rms_scaling=rms_scaling)


take_along_axis = ops.take_along_axis  # a few calls a step: Keras' own


def where(condition, x1, x2):
    c, a, b = _plain(condition), _plain(x1), _plain(x2)
    if c is not None and c.dtype == torch.bool:
        if a is not None and b is not None and a.dtype == b.dtype:
            return torch.where(c, a, b)
        if a is not None and a.dtype.is_floating_point and isinstance(x2, float):
            return torch.where(c, a, x2)
        if b is not None and b.dtype.is_floating_point and isinstance(x1, float):
            return torch.where(c, x1, b)
    return ops.where(condition, x1, x2)
