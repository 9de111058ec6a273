"""Speed path `openblas_products`: a JAX training step's float32 products computed by OpenBLAS.

On CPUs without AVX-512, OpenBLAS multiplies the training step's shapes
faster than the libraries XLA's CPU backend uses, and XLA can call it
through a foreign-function handler (`openblas_products.cc`, compiled with
g++ against jaxlib's FFI headers on first use, linked to the
`scipy-openblas64` wheel). The projections (`Dense`, and `EinsumDense`
read as 2-D products), the feed-forward layers and the output projection
`h E^T` then compute `Y = X W` there, and their gradients `dX = dY W^T`
and `dW = X^T dY` too. The products equal XLA's up to rounding.

The path needs g++ and `scipy-openblas64` (`pip install
keras-transformer[openblas]`); without them it does not apply.
"""

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import types
from pathlib import Path

import keras

from keras_transformer.layers.scaled_shared_embedding import ScaledSharedEmbedding
from keras_transformer.speed_paths.registry import SpeedPath, register
from keras_transformer.speed_paths.runtime import Runtime
from keras_transformer.utils.files import cache_home

TARGET = "keras_transformer_openblas_product"
SOURCE = Path(__file__).with_suffix(".cc")
# The equations of `layers.multi_head_attention`'s projections, as 2-D products.
_PROJECTION_EQUATIONS = ("abc,cde->abde", "abcd,cde->abe")
_LOG = logging.getLogger(__name__)


@functools.cache
def handler_registered() -> bool:
    """Compiles the handler (once per source and jaxlib version, into the
    cache folder) and registers it with XLA; False, with one logged line,
    where g++ or `scipy-openblas64` is missing or the build fails."""
    try:
        import jax
        import scipy_openblas64
    except ImportError:
        return False
    compiler = shutil.which("g++")
    if compiler is None:
        _LOG.info("openblas_products: no g++ on PATH; the plain products run.")
        return False
    library = Path(scipy_openblas64.get_lib_dir()) / f"lib{scipy_openblas64.get_library()}.so"
    key = hashlib.sha256(SOURCE.read_bytes() + jax.__version__.encode() + str(library).encode()).hexdigest()[:16]
    built = cache_home() / f"openblas_products-{key}.so"
    if not built.exists() and not _compile(compiler, library, built, jax.ffi.include_dir()):
        return False
    handler = ctypes.cdll.LoadLibrary(str(built)).OpenblasProduct
    jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(handler), platform="cpu")
    return True


def _compile(compiler: str, library: Path, built: Path, include: str) -> bool:
    built.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=built.parent) as folder:
        partial = Path(folder) / built.name
        command = [compiler, "-O2", "-shared", "-fPIC", "-std=c++17", "-w", f"-I{include}", str(SOURCE)]
        command += ["-o", str(partial), str(library), f"-Wl,-rpath,{library.parent}"]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            _LOG.warning("openblas_products: g++ failed (%s); the plain products run.", result.stderr.strip()[-300:])
            return False
        os.replace(partial, built)  # whole, or not at all
    return True


def _product(a, b, transpose_a: bool = False, transpose_b: bool = False):
    import jax

    m = a.shape[1] if transpose_a else a.shape[0]
    n = b.shape[0] if transpose_b else b.shape[1]
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((m, n), a.dtype))
    return call(a, b, transpose_a=transpose_a, transpose_b=transpose_b)


@functools.cache
def _products():
    """`matmul(x, w)` and `matmul_transposed(x, e)` (`x e^T`), 2-D, with their gradients in OpenBLAS."""
    import jax

    @jax.custom_vjp
    def matmul(x, w):
        return _product(x, w)

    def matmul_gradients(saved, dy):
        x, w = saved
        return _product(dy, w, transpose_b=True), _product(x, dy, transpose_a=True)

    matmul.defvjp(lambda x, w: (matmul(x, w), (x, w)), matmul_gradients)

    @jax.custom_vjp
    def matmul_transposed(x, e):
        return _product(x, e, transpose_b=True)

    def matmul_transposed_gradients(saved, dy):
        x, e = saved
        return _product(dy, e), _product(dy, x, transpose_a=True)

    matmul_transposed.defvjp(lambda x, e: (matmul_transposed(x, e), (x, e)), matmul_transposed_gradients)
    return matmul, matmul_transposed


def _flat(product, x, matrix):
    """`product` of `x` `(..., k)` with a 2-D matrix, on `x` read as 2-D."""
    y = product(x.reshape(-1, x.shape[-1]), matrix)
    return y.reshape(*x.shape[:-1], y.shape[-1])


def _finish(layer, y):
    if layer.bias is not None:
        y = y + layer.bias.value
    return y if layer.activation is None else layer.activation(y)


def _dense_call(self, inputs, training=None):
    return _finish(self, _flat(_products()[0], inputs, self.kernel.value))


def _einsum_dense_call(self, inputs, training=None):
    kernel = self.kernel.value
    if self.equation == _PROJECTION_EQUATIONS[0]:  # (b, t, d) x (d, heads, d_k)
        flat = _flat(_products()[0], inputs, kernel.reshape(kernel.shape[0], -1))
        y = flat.reshape(*inputs.shape[:-1], *kernel.shape[1:])
    else:  # (b, t, heads, d_v) x (heads, d_v, d)
        y = _flat(_products()[0], inputs.reshape(*inputs.shape[:-2], -1), kernel.reshape(-1, kernel.shape[-1]))
    return _finish(self, y)


def _embedding_call(self, inputs, reverse=False):
    if reverse:
        return _flat(_products()[1], inputs, self.embeddings.value)
    return type(self).call(self, inputs)


def _patch(layer: keras.layers.Layer, runtime: Runtime) -> dict:
    plain = layer.dtype_policy.quantization_mode is None and layer.compute_dtype == "float32"
    if not plain:
        return {}
    if type(layer) is keras.layers.Dense and not layer.lora_enabled:
        return {"call": types.MethodType(_dense_call, layer)}
    if type(layer) is keras.layers.EinsumDense and layer.equation in _PROJECTION_EQUATIONS and not layer.lora_enabled:
        return {"call": types.MethodType(_einsum_dense_call, layer)}
    tied = isinstance(layer, ScaledSharedEmbedding) and layer.tie_weights
    if tied and layer.reverse_dtype is None and layer.logit_soft_cap is None:
        return {"call": types.MethodType(_embedding_call, layer)}
    return {}


register(
    SpeedPath(
        "openblas_products",
        "OpenBLAS multiplies float32 faster than XLA's CPU libraries where the CPU has no AVX-512",
        lambda runtime: (
            runtime.backend == "jax"
            and runtime.on_cpu
            and runtime.training
            and runtime.compiled
            and "avx512f" not in runtime.cpu_flags
            and keras.distribution.distribution() is None  # a foreign call has no sharding rule
            and handler_registered()
        ),
        patch=_patch,
    )
)
