"""Speed path `eager_ops`: `keras.ops` calling torch or TensorFlow directly on eager tensors.

Each `keras.ops` call first checks its arguments for symbolic tensors,
converts each to a tensor and standardizes dtypes, and on TensorFlow goes
through TensorFlow's own dispatch as well: for a decoding step's small
tensors, several times what the operation itself takes. Under XLA that
runs once, while the search is traced; an eager step (torch, TensorFlow
outside `tf.function`) pays it at every operation. Keras has no lighter
path, hence this one.

The direct versions (`torch_eager_ops`, `tensorflow_eager_ops`) run only
where they give what `keras.ops` gives, to the bit: eager tensors (or Keras
variables holding them), a floating dtype shared by the operands, shapes of
Python ints, dtypes by name; anything else goes through `keras.ops`.
Attached, they stand for `keras.ops` in the paper's layers' methods
(`attachment.rebound`) and run Keras' `LayerNormalization`. As a module,
every name is `keras.ops`' own or its direct version on this backend.

Example:
>>> import numpy as np
>>> from keras_transformer.speed_paths import eager_ops
>>> x = eager_ops.convert_to_tensor(np.arange(6, dtype="float32"))
>>> eager_ops.convert_to_numpy(eager_ops.reshape(x, (2, 3))).tolist()
[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
"""

import types

import keras
from keras import ops

from keras_transformer.speed_paths.registry import SpeedPath, register
from keras_transformer.speed_paths.runtime import Runtime

NAMES = (
    "add",
    "cast",
    "einsum",
    "layer_normalization",
    "matmul",
    "reshape",
    "shape",
    "slice_update",
    "softmax",
    "take_along_axis",
    "transpose",
    "where",
)
__all__ = list(NAMES)


def direct_operations(backend: str) -> dict:
    """The direct versions of `NAMES` on `backend`, those it has (none on JAX)."""
    if backend == "torch":
        from keras_transformer.speed_paths import torch_eager_ops as direct
    elif backend == "tensorflow":
        from keras_transformer.speed_paths import tensorflow_eager_ops as direct
    else:
        return {}
    return {name: getattr(direct, name) for name in NAMES if hasattr(direct, name)}


# As a module: the direct versions on this process's backend, and
# `keras.ops`' own function for every other name.
def __getattr__(name: str):
    return getattr(ops, name)


globals().update(direct_operations(keras.config.backend()))


def _applies(runtime: Runtime) -> bool:
    # A compiled step runs each operation once, while it is traced.
    return runtime.backend in ("torch", "tensorflow") and not runtime.compiled


def _patch(layer: keras.layers.Layer, runtime: Runtime) -> dict:
    if type(layer) is not keras.layers.LayerNormalization:
        return {}
    direct = types.SimpleNamespace(**direct_operations(runtime.backend))

    def call(self, inputs):
        # Keras' own `call`, through the direct operations.
        outputs = direct.layer_normalization(
            inputs, self.gamma, self.beta, self.axis, self.epsilon, rms_scaling=self.rms_scaling
        )
        return direct.cast(outputs, self.compute_dtype)

    return {"call": types.MethodType(call, layer)}


register(
    SpeedPath(
        "eager_ops",
        "keras.ops' checks and conversions cost an eager decoding step more than its operations",
        _applies,
        patch=_patch,
        operations=lambda runtime: direct_operations(runtime.backend),
    )
)
