"""Speed path `bfloat16_products`: bfloat16 products summed in float32 on a CPU with bfloat16 units, under XLA.

Under Keras' `mixed_bfloat16` policy a layer multiplies two bfloat16
operands into a bfloat16 result. XLA's CPU backend computes such a dot in
float32: it converts both operands, multiplies with float32 kernels and
rounds the result, which makes bfloat16 no faster than float32. A bfloat16
x bfloat16 -> float32 dot, however, goes to the CPU's bfloat16 kernels
(AVX512_BF16 and AMX instructions). Attached to a step that XLA compiles
on such a CPU, Keras' `Dense` and `EinsumDense`, the output projection
(`ScaledSharedEmbedding`'s `h @ E^T`) and `LogitsBias` multiply two
bfloat16 operands as that dot plus one rounding to bfloat16 (float32 sums
rounded once, from the faster kernels), with derivatives, reverse and
forward (`jax.jvp`), of the same kind; anything else stays Keras'.

On JAX that is `dot_general(preferred_element_type=float32)`, and a bias
added to a bfloat16 result gets its gradient summed in float32 directly. On
TensorFlow it is `BatchMatMulV3` with a float32 `Tout`, which only XLA
compiles. `dense` serves a search's own products (`layers_sum_in_float32`).

Example:
>>> import numpy as np
>>> y = dense(np.ones((2, 3), "float32"), np.ones((3, 4), "float32"), bias=np.ones((4,), "float32"))
>>> np.asarray(y).tolist()[0]
[4.0, 4.0, 4.0, 4.0]
"""

import dataclasses
import functools
import math
import types

import keras

from keras_transformer.layers import LogitsBias, ScaledSharedEmbedding
from keras_transformer.speed_paths import eager_ops as ops
from keras_transformer.speed_paths.einsum_equations import contracted_axes
from keras_transformer.speed_paths.registry import SpeedPath, is_chosen, register
from keras_transformer.speed_paths.runtime import Runtime, describe_runtime
from keras_transformer.utils import library_internals


def layers_sum_in_float32(runtime: Runtime | None = None) -> bool:
    """Whether the code calling this now is traced for XLA (`jax.jit`,
    TensorFlow's `jit_compile=True`) where this path applies: there a
    search's own products sum bfloat16 in float32, as its attached layers do."""
    if keras.config.backend() == "torch":  # no XLA; and a `torch.compile`d step need not trace the description
        return False
    runtime = runtime or describe_runtime()
    traced = runtime.backend == "jax" or (
        runtime.backend == "tensorflow" and library_internals.tensorflow_compiles_with_xla()
    )
    return traced and is_chosen("bfloat16_products", dataclasses.replace(runtime, compiled=True))


def dense(x, kernel, bias=None):
    """`x @ kernel (+ bias)`: `x` `(..., k)`, `kernel` `(k, n)`, `bias` `(n,)`;
    summed in float32 where `layers_sum_in_float32()`."""
    if layers_sum_in_float32():
        return summed_dense(x, kernel, bias)
    product = ops.matmul(x, kernel)
    return product if bias is None else ops.add(product, bias)


def summed_dense(x, kernel, bias=None):
    """`x @ kernel (+ bias)`, two bfloat16 operands summed in float32."""
    x, kernel = keras.ops.convert_to_tensor(x), keras.ops.convert_to_tensor(kernel)
    if _both_bfloat16(x, kernel) and len(kernel.shape) == 2:
        product = _tensordot(x, kernel, 1)
    else:
        product = keras.ops.matmul(x, kernel)
    return product if bias is None else summed_add_bias(product, bias)


def summed_einsum(subscripts: str, x, kernel):
    """`keras.ops.einsum(subscripts, x, kernel)`; one that contracts `x`'s
    last axes with `kernel`'s first (`"abc,cde->abde"`) sums two bfloat16
    operands in float32."""
    x, kernel = keras.ops.convert_to_tensor(x), keras.ops.convert_to_tensor(kernel)
    axes = contracted_axes(subscripts)
    if axes and _both_bfloat16(x, kernel):
        return _tensordot(x, kernel, axes)
    return keras.ops.einsum(subscripts, x, kernel)


def summed_add_bias(x, bias):
    """`x + bias`, `bias` broadcast over `x`'s leading axes; on JAX, its
    bfloat16 gradient for `bias` is summed in float32 and rounded once."""
    if keras.config.backend() == "jax" and _is_bias(x, bias):
        return _jax_bias_add_with_gradient()(x, keras.ops.convert_to_tensor(bias))
    return keras.ops.add(x, bias)


def _tensordot(x1, x2, k: int):
    """`x1`'s last k axes contracted with `x2`'s first k, summed in float32, rounded to bfloat16 once."""
    if keras.config.backend() == "jax":
        return _jax_tensordot_primitive().bind(x1, x2, k=k)
    return _tensorflow_tensordot(x1, x2, k)


def _is_bias(x, bias) -> bool:
    """Whether `x + bias` broadcasts a bfloat16 `bias` over `x`'s leading
    axes (a dense layer's bias), without converting Python numbers."""
    shape, bias_shape = tuple(getattr(x, "shape", ())), tuple(getattr(bias, "shape", ()))
    return (
        0 < len(bias_shape) < len(shape)
        and shape[len(shape) - len(bias_shape) :] == bias_shape
        and _both_bfloat16(x, bias)
    )


def _both_bfloat16(x1, x2) -> bool:
    return keras.backend.standardize_dtype(x1.dtype) == keras.backend.standardize_dtype(x2.dtype) == "bfloat16"


def _dot(x1, x2, axes1: tuple, axes2: tuple):
    """Contracts `axes1` of `x1` with `axes2` of `x2`, summing in float32, rounded to bfloat16 once."""
    import jax
    import jax.numpy as jnp

    dimensions = ((axes1, axes2), ((), ()))
    return jax.lax.dot_general(x1, x2, dimensions, preferred_element_type=jnp.float32).astype(jnp.bfloat16)


@functools.cache
def _jax_tensordot_primitive():
    """`x1`'s last k axes contracted with `x2`'s first k, as a JAX primitive
    whose derivatives, forward and reverse, are the same kind of dots.

    A primitive, with transposes of its own: the transpose JAX derives for a
    dot summed in float32 multiplies float32 cotangents (the slow float32
    kernels), a `custom_vjp` has no forward mode (`jax.jvp`, `jax.jacfwd`),
    and a `custom_jvp`'s tangent is transposed by JAX's rules."""
    import jax
    import jax.numpy as jnp
    from jax.extend.core import Primitive
    from jax.interpreters import ad, batching, mlir

    def tensordot(x1, x2, *, k):
        return _dot(x1, x2, tuple(range(x1.ndim - k, x1.ndim)), tuple(range(k)))

    def shape(x1, x2, *, k):
        return jax.core.ShapedArray(x1.shape[: x1.ndim - k] + x2.shape[k:], jnp.bfloat16)

    # d x1 = gradient . x2 over x2's kept axes; d x2 = x1 . gradient over x1's kept axes.
    def first_gradient(gradient, x1, x2, *, k):
        kept1, kept2 = x1.aval.ndim - k, x2.ndim - k
        return _dot(gradient.astype(x2.dtype), x2, tuple(range(kept1, kept1 + kept2)), tuple(range(k, x2.ndim)))

    def second_gradient(gradient, x1, x2, *, k):
        kept1 = x1.ndim - k
        return _dot(x1, gradient.astype(x1.dtype), tuple(range(kept1)), tuple(range(kept1)))

    def batched(operands, batch_axes, *, k):
        (x1, x2), (axis1, axis2) = operands, batch_axes
        # The batch axis of one operand becomes one of its kept axes; with
        # both batched, a batched dot_general (JAX's own derivatives).
        if axis2 is None:
            return primitive.bind(jnp.moveaxis(x1, axis1, 0), x2, k=k), 0
        if axis1 is None:
            product = primitive.bind(x1, jnp.moveaxis(x2, axis2, -1), k=k)
            return product, product.ndim - 1
        return jax.vmap(functools.partial(tensordot, k=k), in_axes=(axis1, axis2))(x1, x2), 0

    primitive = Primitive("bfloat16_tensordot_summed_in_float32")
    primitive.def_impl(tensordot)
    primitive.def_abstract_eval(shape)
    mlir.register_lowering(primitive, mlir.lower_fun(tensordot, multiple_results=False))
    ad.defbilinear(primitive, first_gradient, second_gradient)
    batching.primitive_batchers[primitive] = batched
    return primitive


@functools.cache
def _jax_bias_add_with_gradient():
    """`x + bias`, whose gradient for `bias` sums over `x`'s leading axes in float32, rounded once."""
    import jax
    import jax.numpy as jnp

    @jax.custom_jvp
    def bias_add(x, bias):
        return x + bias

    @bias_add.defjvp
    def tangent(primals, tangents):
        # Added in float32 (the same values), so that reverse mode, which
        # transposes this, sums the bias's cotangent in float32.
        (x, bias), (x_tangent, bias_tangent) = primals, tangents
        return bias_add(x, bias), (x_tangent.astype(jnp.float32) + bias_tangent.astype(jnp.float32)).astype(x.dtype)

    return bias_add


def _tensorflow_tensordot(x1, x2, k: int):
    """`x1`'s last k axes contracted with `x2`'s first k, as one matrix product."""
    import tensorflow as tf

    contracted = math.prod(x2.shape[:k])
    product = _tensorflow_matrix_product()(tf.reshape(x1, (-1, contracted)), tf.reshape(x2, (contracted, -1)))
    kept = [tf.shape(x1)[i] if size is None else size for i, size in enumerate(x1.shape[: len(x1.shape) - k])]
    return tf.reshape(product, kept + list(x2.shape[k:]))


@functools.cache
def _tensorflow_matrix_product():
    """`a @ b` of bfloat16 matrices, summed in float32 and rounded to bfloat16
    once, with a gradient of the same kind of products."""
    import tensorflow as tf

    def product(a, b, adj_x=False, adj_y=False):
        exact = tf.raw_ops.BatchMatMulV3(x=a, y=b, Tout=tf.float32, adj_x=adj_x, adj_y=adj_y)
        return tf.cast(exact, tf.bfloat16)

    @tf.custom_gradient
    def matrix_product(a, b):
        def gradient(upstream):
            upstream = tf.cast(upstream, a.dtype)
            return product(upstream, b, adj_y=True), product(a, upstream, adj_x=True)

        return product(a, b), gradient

    return matrix_product


def _dense_call(self, inputs, training=None):
    return self.activation(summed_dense(inputs, self.kernel, self.bias))


def _einsum_dense_call(self, inputs, training=None):
    x = summed_einsum(self.equation, inputs, self.kernel)
    return self.activation(x if self.bias is None else summed_add_bias(x, self.bias))


def _embedding_call(self, inputs, reverse: bool = False):
    if not (reverse and self.reverse_dtype is None and self.logit_soft_cap is None):
        return type(self).call(self, inputs, reverse=reverse)
    kernel = keras.ops.transpose(self.embeddings) if self.tie_weights else self.reverse_embeddings
    return summed_dense(keras.ops.cast(inputs, self.compute_dtype), keras.ops.cast(kernel, self.compute_dtype))


def _logits_bias_call(self, logits):
    # The bias's gradient: a sum over every target position.
    return summed_add_bias(logits, keras.ops.cast(self.bias, logits.dtype))


def _patch(layer: keras.layers.Layer, runtime: Runtime) -> dict:
    calls = (
        (keras.layers.EinsumDense, _einsum_dense_call),
        (keras.layers.Dense, _dense_call),
        (ScaledSharedEmbedding, _embedding_call),
        (LogitsBias, _logits_bias_call),
    )
    for cls, call in calls:
        if isinstance(layer, cls):
            return {"call": types.MethodType(call, layer)}
    return {}


register(
    SpeedPath(
        "bfloat16_products",
        "XLA on a CPU multiplies bfloat16 -> bfloat16 in float32; bfloat16 -> float32 reaches the bfloat16 units",
        lambda runtime: (
            runtime.compiles_with_xla and runtime.on_cpu and runtime.has_bfloat16_units and runtime.under_xla
        ),
        patch=_patch,
    )
)
