"""bfloat16 matrix products that XLA's CPU backend runs on the CPU's bfloat16 units.

Under Keras' `mixed_bfloat16` policy a layer multiplies two bfloat16
operands into a bfloat16 result. XLA's CPU backend computes such a dot in
float32: it converts both operands, multiplies with float32 kernels and
rounds the result, which makes bfloat16 no faster than float32. A bfloat16 x
bfloat16 -> float32 dot, however, goes to YNNPACK's bfloat16 kernels
(AVX512_BF16 and AMX instructions where the CPU has them). Inside
`float32_accumulation()`, Keras' `matmul` and `einsum` of two bfloat16
operands that contract one's last axes with the other's first (dense layers,
attention projections, the output projection) are traced as that dot plus
one rounding to bfloat16: the same values as before (float32 sums rounded
once), from the faster kernels. Their derivatives, reverse (gradients) and
forward (`jax.jvp`, `jax.jacfwd`), are computed the same way.

On JAX that is `dot_general(preferred_element_type=float32)`. There a bias
added to a bfloat16 result (`ops.add` over the leading axes) also gets its
gradient summed in float32 directly: from JAX's own, XLA's CPU backend makes
a reduce-window that took longer than the layer's forward product (60 against
40 ms for a 4096 x 2048 feed-forward output). On TensorFlow it is
`BatchMatMulV3` with a float32 `Tout`, which only XLA compiles (TensorFlow
has no kernel of its own for it): products traced for XLA
(`jit_compile=True`) are routed, and those TensorFlow runs itself (eagerly,
or in a function without XLA) are left to its oneDNN kernels, which already
use the bfloat16 units. The XLA in TensorFlow 2.21 still converts two kinds
of routed dots to float32, those whose operand is transposed: the output
projection `h E^T` (searches project onto a transposed copy instead,
`TransformerBackbone.decoding_output_kernel`) and the weight gradients. So
under XLA TensorFlow's forward products and input gradients reach the
bfloat16 units, and a bfloat16 training step runs faster without XLA
(`generation.decoding.resolve_jit_compile`). Other products, dtypes,
torch, accelerators and CPUs without bfloat16 instructions (where this was
not measured) are left as they are.

The model's layers trace their products this way (`accumulating_in_float32`
on the blocks' and the output projection's methods), so `fit`, `predict`,
`generate` and the command line all use it.

Example:
>>> import numpy as np
>>> with float32_accumulation():
...     y = keras.ops.matmul(np.ones((2, 3), "float32"), np.ones((3, 4), "float32"))
>>> np.asarray(y).tolist()[0]
[3.0, 3.0, 3.0, 3.0]
"""

import contextlib
import contextvars
import functools
import math
import re
from collections.abc import Callable

import keras

from keras_transformer.utils import library_internals

# None: no `float32_accumulation` around; False: turned off by an outer one.
_ACTIVE = contextvars.ContextVar("bfloat16_products_accumulate_in_float32", default=None)


@contextlib.contextmanager
def float32_accumulation(enabled: bool = True):
    """Within it, products traced for XLA (`jax.jit`, TensorFlow's
    `jit_compile=True`, Keras' compiled steps) accumulate bfloat16 operands
    in float32 as the module says. Tracing is
    what it affects: a function compiled before keeps its products.
    `float32_accumulation(False)` turns it off for everything inside,
    the model's layers included (to compare the two)."""
    # Only XLA's CPU backend computes bfloat16 dots in float32; elsewhere nothing changes.
    enabled = enabled and _ACTIVE.get() is not False and _on_cpu() and cpu_has_bfloat16_instructions()
    if enabled:
        _install()
    token = _ACTIVE.set(enabled)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def routes_products() -> bool:
    """Whether products traced here now are routed (inside a
    `float32_accumulation()` or not, unless one turned it off): on JAX on a
    CPU with bfloat16 instructions, and on TensorFlow there while XLA compiles."""
    if _ACTIVE.get() is False or not (_on_cpu() and cpu_has_bfloat16_instructions()):
        return False
    return keras.config.backend() == "jax" or library_internals.tensorflow_compiles_with_xla()


def accumulating_in_float32(method: Callable) -> Callable:
    """Decorates a layer's method so that it runs inside `float32_accumulation()`."""

    @functools.wraps(method)
    def method_accumulating_in_float32(*args, **kwargs):
        with float32_accumulation():
            return method(*args, **kwargs)

    return method_accumulating_in_float32


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


@functools.cache
def _install() -> None:
    """Routes Keras' `matmul` and `einsum` (and on JAX `add`) of the backend
    through this module, once; outside `float32_accumulation()`, and on
    TensorFlow outside XLA, they call Keras' own."""
    module = library_internals.backend_numpy_module()
    keras_matmul, keras_einsum = module.matmul, module.einsum
    if keras.config.backend() == "jax":
        contract, routing = _jax_tensordot, _ACTIVE.get
    else:
        contract = _tensorflow_tensordot

        def routing():
            return _ACTIVE.get() and library_internals.tensorflow_compiles_with_xla()

    def matmul(x1, x2):
        if routing():  # Keras' own converts its operands itself
            x1, x2 = module.convert_to_tensor(x1), module.convert_to_tensor(x2)
            if _both_bfloat16(x1, x2) and len(x1.shape) >= 2 and len(x2.shape) == 2:
                return contract(x1, x2, 1)
        return keras_matmul(x1, x2)

    def einsum(subscripts, *operands, **kwargs):
        if routing() and len(operands) == 2 and not kwargs:
            x1, x2 = (module.convert_to_tensor(x) for x in operands)
            axes = _contracted_axes(subscripts)
            if axes and _both_bfloat16(x1, x2):
                return contract(x1, x2, axes)
        return keras_einsum(subscripts, *operands, **kwargs)

    module.matmul, module.einsum = matmul, einsum
    if keras.config.backend() != "jax":
        return
    keras_add = module.add

    def add(x1, x2):
        # From JAX's gradient of a broadcast bias add, a bfloat16 sum over
        # the batch, XLA's CPU backend makes a reduce-window some 40x slower
        # than a float32 sum (measured at (128, 32, 2048)), and less exact.
        if routing() and _is_bias(x1, x2):
            return _jax_bias_add(x1, module.convert_to_tensor(x2))
        return keras_add(x1, x2)

    module.add = add


def _contracted_axes(subscripts: str) -> int:
    """k if `subscripts` contracts the first operand's last k axes with the
    second's first k (a tensordot, e.g. `"abc,cde->abde"`: 1), else 0.

    Example:
    >>> _contracted_axes("abcd,cde->abe"), _contracted_axes("aecd,abcd->acbe")
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


def _on_cpu() -> bool:
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


def _jax_bias_add(x, bias):
    return _jax_bias_add_with_gradient()(x, bias)


def _jax_tensordot(x1, x2, k: int):
    return _jax_tensordot_primitive().bind(x1, x2, k=k)


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
