"""The layers' matrix products and bias adds, summed in float32 from bfloat16 operands on the CPU.

Under Keras' `mixed_bfloat16` policy a layer multiplies two bfloat16
operands into a bfloat16 result. XLA's CPU backend computes such a dot in
float32: it converts both operands, multiplies with float32 kernels and
rounds the result, which makes bfloat16 no faster than float32. A bfloat16 x
bfloat16 -> float32 dot, however, goes to YNNPACK's bfloat16 kernels
(AVX512_BF16 and AMX instructions where the CPU has them). The model's
layers therefore multiply through `dense` and `einsum` and add biases
through `add_bias`: inside `float32_accumulation()`, traced for XLA on such
a CPU, a product of two bfloat16 operands is that dot plus one rounding to
bfloat16 (the same values: float32 sums rounded once, from the faster
kernels), with derivatives, reverse (gradients) and forward (`jax.jvp`,
`jax.jacfwd`), of the same kind; anywhere else they are `keras.ops`'
`matmul`, `einsum` and `add`. Keras' own functions are left as they are.

On JAX that is `dot_general(preferred_element_type=float32)`, and a bias
added to a bfloat16 result gets its gradient summed in float32 directly
(from JAX's own, XLA's CPU backend makes a slow reduce-window). On
TensorFlow it is `BatchMatMulV3` with a float32 `Tout`, which only XLA
compiles (TensorFlow has no kernel of its own for it): products traced for
XLA (`jit_compile=True`) take it, and those TensorFlow runs itself (eagerly,
or in a function without XLA) are left to its oneDNN kernels, which already
use the bfloat16 units. TensorFlow's XLA still converts routed dots whose
operand is transposed to float32: the output projection `h E^T` (searches
project onto a transposed copy instead,
`TransformerBackbone.decoding_output_kernel`) and the weight gradients, so a
bfloat16 training step runs faster without XLA there
(`generation.decoding.resolve_jit_compile`). Other dtypes, torch,
accelerators and CPUs without bfloat16 instructions take Keras' products.

The layers enter `float32_accumulation()` around their calls
(`accumulating_in_float32`), so `fit`, `predict`, `generate` and the command
line all use it; `float32_accumulation(False)` turns it off inside.

Example:
>>> import numpy as np
>>> y = dense(np.ones((2, 3), "float32"), np.ones((3, 4), "float32"), bias=np.ones((4,), "float32"))
>>> np.asarray(y).tolist()[0]
[4.0, 4.0, 4.0, 4.0]
"""

import contextlib
import contextvars
import functools
import math
import re
from collections.abc import Callable

import keras

from keras_transformer.utils import eager_ops as ops
from keras_transformer.utils import library_internals

# None: no `float32_accumulation` around; False: turned off by an outer one.
_FLOAT32_ACCUMULATION = contextvars.ContextVar("float32_accumulation", default=None)


@contextlib.contextmanager
def float32_accumulation(enabled: bool = True):
    """Within it, `dense`, `einsum` and `add_bias` traced for XLA (`jax.jit`,
    TensorFlow's `jit_compile=True`, Keras' compiled steps) accumulate
    bfloat16 operands in float32 as the module says. Tracing is what it
    affects: a function compiled before keeps its products.
    `float32_accumulation(False)` turns it off for everything inside, the
    model's layers included (to compare the two)."""
    if keras.config.backend() == "torch":  # no XLA; and `torch.compile` cannot trace a context variable
        yield
        return
    # Only XLA's CPU backend computes bfloat16 dots in float32; elsewhere nothing changes.
    enabled = enabled and _FLOAT32_ACCUMULATION.get() is not False
    enabled = enabled and computes_on_cpu() and cpu_has_bfloat16_instructions()
    token = _FLOAT32_ACCUMULATION.set(enabled)
    try:
        yield
    finally:
        _FLOAT32_ACCUMULATION.reset(token)


def layers_sum_in_float32() -> bool:
    """Whether the model's layers, traced here now, sum bfloat16 products in
    float32 (they enter `float32_accumulation()` themselves, unless an outer
    one turned it off): on JAX on a CPU with bfloat16 instructions, and on
    TensorFlow there while XLA compiles."""
    if keras.config.backend() == "torch" or _FLOAT32_ACCUMULATION.get() is False:
        return False
    return computes_on_cpu() and cpu_has_bfloat16_instructions() and _traced_for_xla()


def _summing_in_float32() -> bool:
    """Whether `dense`, `einsum` and `add_bias`, called now, take the float32-summed route."""
    # torch first: `torch.compile` cannot trace a context variable.
    return keras.config.backend() != "torch" and bool(_FLOAT32_ACCUMULATION.get()) and _traced_for_xla()


def _traced_for_xla() -> bool:
    return keras.config.backend() == "jax" or library_internals.tensorflow_compiles_with_xla()


def accumulating_in_float32(method: Callable) -> Callable:
    """Decorates a layer's method so that it runs inside `float32_accumulation()`."""

    @functools.wraps(method)
    def method_accumulating_in_float32(*args, **kwargs):
        with float32_accumulation():
            return method(*args, **kwargs)

    return method_accumulating_in_float32


def dense(x, kernel, bias=None):
    """`x @ kernel (+ bias)`: `x` `(..., k)`, `kernel` `(k, n)`, `bias` `(n,)`."""
    routed = _summing_in_float32()
    if routed:
        x, kernel = ops.convert_to_tensor(x), ops.convert_to_tensor(kernel)
    if routed and _both_bfloat16(x, kernel) and len(kernel.shape) == 2:
        product = _tensordot(x, kernel, 1)
    else:
        product = ops.matmul(x, kernel)
    return product if bias is None else add_bias(product, bias)


def einsum(subscripts: str, x, kernel):
    """`ops.einsum(subscripts, x, kernel)` of a layer's input and its kernel;
    one that contracts `x`'s last axes with `kernel`'s first (`"abc,cde->abde"`)
    sums in float32 as the module says."""
    if _summing_in_float32():
        x, kernel = ops.convert_to_tensor(x), ops.convert_to_tensor(kernel)
        axes = contracted_axes(subscripts)
        if axes and _both_bfloat16(x, kernel):
            return _tensordot(x, kernel, axes)
    return ops.einsum(subscripts, x, kernel)


def torch_linear(x, kernel, bias, contracted: int):
    """`x`'s last `contracted` axes times `kernel`'s first ones, plus `bias`
    shaped as the kernel's other axes, as one `torch.addmm` (what
    `torch.nn.Linear` runs): on torch, all float32. One kernel instead of a
    product and then an add, faster at decoding's shapes (`benchmarks/RESULTS.md`,
    "torch: where a decoding call goes"). None anywhere else: the caller
    multiplies and adds apart."""
    if keras.config.backend() != "torch" or bias is None or not contracted:
        return None
    import torch

    x, kernel, bias = (value.value if isinstance(value, keras.Variable) else value for value in (x, kernel, bias))
    if not all(isinstance(value, torch.Tensor) and value.dtype == torch.float32 for value in (x, kernel, bias)):
        return None
    inputs, outputs = tuple(kernel.shape[:contracted]), tuple(kernel.shape[contracted:])
    if tuple(bias.shape) != outputs or tuple(x.shape[x.dim() - contracted :]) != inputs:
        return None
    k, n = math.prod(inputs), math.prod(outputs)
    product = torch.addmm(bias.reshape(n), x.reshape(-1, k), kernel.reshape(k, n))
    return product.reshape(*x.shape[: x.dim() - contracted], *outputs)


def add_bias(x, bias):
    """`x + bias`, `bias` broadcast over `x`'s leading axes; on JAX, its
    bfloat16 gradient for `bias` is summed in float32 and rounded once."""
    if keras.config.backend() == "jax" and _summing_in_float32() and _is_bias(x, bias):
        return _jax_bias_add_with_gradient()(x, ops.convert_to_tensor(bias))
    return ops.add(x, bias)


@functools.cache
def cpu_has_bfloat16_instructions() -> bool:
    """Whether the CPU multiplies bfloat16 itself: AVX512_BF16 or AMX (the
    flags of Linux's `/proc/cpuinfo`; False where there is none)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            flags = next((line.split(":", 1)[1].split() for line in cpuinfo if line.startswith("flags")), [])
    except OSError:
        return False
    return bool({"avx512_bf16", "amx_bf16"} & set(flags))


def _tensordot(x1, x2, k: int):
    """`x1`'s last k axes contracted with `x2`'s first k, summed in float32, rounded to bfloat16 once."""
    if keras.config.backend() == "jax":
        return _jax_tensordot_primitive().bind(x1, x2, k=k)
    return _tensorflow_tensordot(x1, x2, k)


def contracted_axes(subscripts: str) -> int:
    """k if `subscripts` contracts the first operand's last k axes with the
    second's first k (a tensordot, e.g. `"abc,cde->abde"`: 1), else 0.

    Example:
    >>> contracted_axes("abcd,cde->abe"), contracted_axes("aecd,abcd->acbe")
    (2, 0)
    """
    match = re.fullmatch(r"(\w+),(\w+)->(\w+)", subscripts.replace(" ", ""))
    if not match:
        return 0
    first, second, output = match.groups()
    for k in range(1, min(len(first), len(second)) + 1):
        distinct = len(set(first + second)) == len(first + second) - k
        if distinct and first[-k:] == second[:k] and output == first[:-k] + second[k:]:
            return k
    return 0


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


def computes_on_cpu() -> bool:
    """Whether the backend computes on the CPU: JAX's default device is
    one, or TensorFlow sees no GPU."""
    backend = keras.config.backend()
    if backend == "jax":
        import jax

        return jax.default_backend() == "cpu"
    if backend == "tensorflow":
        import tensorflow as tf

        return not tf.config.list_physical_devices("GPU")
    return False


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
