"""Calling a built layer's `call` directly on eager tensors, without Keras' per-call work.

At every call, Keras' `Layer.__call__` binds the arguments to `call`'s
signature, resolves the training flag and the masks, opens a name scope and
an autocast scope, checks the input, and goes through `torch.nn.Module`'s
hooks. Under XLA (TensorFlow, JAX) that runs once, while the search is
traced; torch runs eagerly, and so does TensorFlow outside `tf.function`
(the command line's few sentences), so it runs at every call of every
layer, and in a small model's decoding step it costs about as much as the
products themselves (`benchmarks/RESULTS.md`, "torch: where a decoding call
goes").
Keras has no switch for it, hence this mixin.

A layer with `DirectCall` first among its bases runs `call` (or
`quantized_call`, as Keras would) directly when none of that work would
change anything: on torch or eager TensorFlow, built, one tensor argument
(of the layer's compute dtype if floating point) without a Keras mask,
keyword arguments Keras passes on as they are (no `training`, no `mask`),
no autocast scope and no mixed precision, no activity regularizer, no
rematerialization. Any other call goes through
Keras' `__call__`. torch forward hooks registered on such a layer do not run
on the direct path.

Example:
>>> import keras, numpy as np
>>> class Double(DirectCall, keras.layers.Layer):
...     def call(self, inputs):
...         return inputs * 2
>>> keras.ops.convert_to_numpy(Double()(np.ones(2, "float32"))).tolist()
[2.0, 2.0]
"""

import keras

from keras_transformer.utils import library_internals

_EAGER_BACKEND = keras.config.backend() in ("torch", "tensorflow")


class DirectCall:
    """Mixin: `layer(x)` as `layer.call(x)` on eager tensors where Keras' `__call__` would add nothing."""

    def __call__(self, *args, **kwargs):
        if _EAGER_BACKEND and len(args) == 1 and _left_as_they_are(kwargs) and calls_directly(self, args[0]):
            if self.quantization_mode is not None:
                return self.quantized_call(args[0], **kwargs)
            return self.call(args[0], **kwargs)
        return super().__call__(*args, **kwargs)


def _left_as_they_are(kwargs: dict) -> bool:
    """Keyword arguments that Keras' `__call__` hands to `call` unchanged:
    Python bools and ints, and eager tensors that are not floating point;
    not `training` or `mask`, which it resolves itself."""
    return all(
        name not in ("training", "mask") and (type(value) in (bool, int) or _eager_tensor_of(value, None))
        for name, value in kwargs.items()
    )


def calls_directly(layer: keras.layers.Layer, inputs) -> bool:
    """Whether `layer(inputs)` may skip Keras' `__call__` (see the module's
    docstring); torch and TensorFlow only."""
    compute_dtype = layer.compute_dtype
    return (
        layer.built
        and _eager_tensor_of(inputs, compute_dtype)
        and compute_dtype == layer.variable_dtype
        and library_internals.keras_mask(inputs) is None
        and library_internals.autocast_scope() is None
        and layer.activity_regularizer is None
        and getattr(layer, "_remat_mode", None) is None
    )


if keras.config.backend() == "torch":
    import torch

    def _eager_tensor_of(inputs, float_dtype: str | None) -> bool:
        """A torch tensor that Keras would not cast: of `float_dtype` if floating point."""
        if not isinstance(inputs, torch.Tensor):
            return False
        if not inputs.dtype.is_floating_point:
            return True
        return float_dtype is not None and inputs.dtype == getattr(torch, float_dtype)

elif keras.config.backend() == "tensorflow":
    import tensorflow as tf

    def _eager_tensor_of(inputs, float_dtype: str | None) -> bool:
        """An eager tensor (outside `tf.function`, every tensor is) that Keras
        would not cast: of `float_dtype` if floating point."""
        if not (tf.executing_eagerly() and isinstance(inputs, tf.Tensor)):
            return False
        return not inputs.dtype.is_floating or inputs.dtype.name == float_dtype
