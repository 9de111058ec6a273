"""`keras.ops`, with the decoding step's most frequent operations calling
the backend directly on eager tensors (torch, and TensorFlow outside
`tf.function`).

Each `keras.ops` call first checks its arguments for symbolic tensors,
converts each to a tensor and standardizes dtypes, and on TensorFlow goes
through TensorFlow's own dispatch as well: for a decoding step's small
tensors, several times what the operation itself takes. Under XLA
(TensorFlow, JAX) that runs once, while the search is traced; an eager step
pays it at every operation of every step, which in a small model's decoding
step costs more than the products themselves (`benchmarks/RESULTS.md`,
"torch: where a decoding call goes" and "TensorFlow: decoding a few
sentences eagerly"). Keras has no lighter path, hence this module.

Every other name is `keras.ops`' own (`eager_ops.top_k is keras.ops.top_k`),
and so are all of them on JAX. The direct versions
(`utils.torch_eager_ops`, `utils.tensorflow_eager_ops`) run only where they
give what `keras.ops` gives, to the bit: eager tensors (or Keras variables
holding them), a floating dtype shared by the operands, shapes of Python
ints, dtypes by name; anything else goes through `keras.ops`.

Example:
>>> import numpy as np
>>> from keras_transformer.utils import eager_ops
>>> x = eager_ops.convert_to_tensor(np.arange(6, dtype="float32"))
>>> eager_ops.convert_to_numpy(eager_ops.reshape(x, (2, 3))).tolist()
[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
"""

import keras
from keras import ops

__all__ = [
    "add",
    "cast",
    "einsum",
    "layer_normalization",
    "matmul",
    "reshape",
    "shape",
    "softmax",
    "take_along_axis",
    "transpose",
    "where",
]


def __getattr__(name: str):
    return getattr(ops, name)


if keras.config.backend() == "torch":
    from keras_transformer.utils import torch_eager_ops as _direct
elif keras.config.backend() == "tensorflow":
    from keras_transformer.utils import tensorflow_eager_ops as _direct
else:
    _direct = ops

add, cast, einsum, matmul = _direct.add, _direct.cast, _direct.einsum, _direct.matmul
layer_normalization, take_along_axis = _direct.layer_normalization, _direct.take_along_axis
reshape, shape, softmax = _direct.reshape, _direct.shape, _direct.softmax
transpose, where = _direct.transpose, _direct.where
