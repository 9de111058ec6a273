"""Speed path `direct_calls`: a built layer's `call` run directly on eager tensors, without Keras' per-call work.

At every call, Keras' `Layer.__call__` binds the arguments to `call`'s
signature, resolves the training flag and the masks, opens a name scope and
an autocast scope, checks the input, and goes through `torch.nn.Module`'s
hooks. Under XLA that runs once, while the search is traced; torch runs
eagerly, and so does TensorFlow outside `tf.function`, so it runs at every
call of every layer. Keras has no switch for it, hence this path.

Attached, the layers of `DIRECT` swap their class for a subclass with
`DirectCall` first: it runs `call` (or `quantized_call`, as Keras would) directly
when none of that work would change anything: built, one tensor argument
(of the layer's compute dtype if floating point) without a Keras mask,
keyword arguments Keras passes on as they are (no `training`, no `mask`),
no autocast scope and no mixed precision, no activity regularizer, no
rematerialization. Any other call goes through Keras' `__call__`. What
the direct route bypasses (torch forward hooks too) is written at
`utils.library_internals.call_bypassing_keras`.
"""

import functools

import keras

from keras_transformer.layers import LogitsBias, ScaledSharedEmbedding, SinusoidalPositionEncoding
from keras_transformer.layers.encoder_block import FeedForward
from keras_transformer.speed_paths.registry import SpeedPath, register
from keras_transformer.speed_paths.runtime import Runtime
from keras_transformer.utils import library_internals

# The layers called with one tensor, many times a decoding step.
DIRECT = (
    keras.layers.Dense,
    keras.layers.EinsumDense,
    keras.layers.LayerNormalization,
    FeedForward,
    ScaledSharedEmbedding,
    SinusoidalPositionEncoding,
    LogitsBias,
)


class DirectCall:
    """Mixin: `layer(x)` as `layer.call(x)` on eager tensors where Keras' `__call__` would add nothing."""

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and _left_as_they_are(kwargs) and calls_directly(self, args[0]):
            return library_internals.call_bypassing_keras(self, args[0], kwargs)
        return super().__call__(*args, **kwargs)


@functools.cache
def direct_class(cls: type) -> type:
    """`cls` with `DirectCall` first; same name, same module."""
    return type(cls.__name__, (DirectCall, cls), {"__module__": cls.__module__, "__qualname__": cls.__qualname__})


def _left_as_they_are(kwargs: dict) -> bool:
    """Keyword arguments that Keras' `__call__` hands to `call` unchanged:
    Python bools and ints, and eager tensors that are not floating point;
    not `training` or `mask`, which it resolves itself."""
    return all(
        name not in ("training", "mask") and (type(value) in (bool, int) or _eager_tensor_of(value, None))
        for name, value in kwargs.items()
    )


def calls_directly(layer: keras.layers.Layer, inputs) -> bool:
    """Whether `layer(inputs)` may skip Keras' `__call__` (see the module's docstring)."""
    compute_dtype = layer.compute_dtype
    return (
        layer.built
        and _eager_tensor_of(inputs, compute_dtype)
        and compute_dtype == layer.variable_dtype
        and library_internals.keras_mask(inputs) is None
        and library_internals.autocast_scope() is None
        and layer.activity_regularizer is None
        and library_internals.remat_mode(layer) is None
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


def _patch(layer: keras.layers.Layer, runtime: Runtime) -> dict:
    if type(layer) not in DIRECT:
        return {}
    keras_quantize = layer.quantize  # Keras' wrapper of the class's `quantize`, made per layer

    def quantize(mode=None, config=None, **kwargs):
        # Keras quantizes only its own classes (`type(self) is Dense`); the
        # direct class runs the same `call` as the class it stands in for.
        return keras_quantize(mode=mode, config=config, **{**kwargs, "type_check": False})

    return {"__class__": direct_class(type(layer)), "quantize": quantize}


register(
    SpeedPath(
        "direct_calls",
        "Keras' Layer.__call__ costs an eager decoding step about as much as its products",
        lambda runtime: runtime.backend in ("torch", "tensorflow"),
        patch=_patch,
    )
)
