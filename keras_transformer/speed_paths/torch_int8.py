"""Speed path `torch_int8`: int8 products on torch's CPU through torch's own int8 kernels.

Keras' int8 layers quantize the weights once and the inputs at each call
(one scale per row), then multiply int8 by int8 with `ops.matmul`, which on
torch runs as an int32 product that no BLAS serves: slower than float32.
torch's own `quantized::linear_dynamic` (FBGEMM on x86) takes prepacked
int8 weights with one scale per output and quantizes its float32 input at
each call; Keras has no way to reach it, hence this path.

Attached, Keras' int8 `Dense` and `EinsumDense` layers and the output
projection (`ScaledSharedEmbedding`'s `h @ E^T`) call `linear` with Keras'
own int8 weights and scales, packed once per weight (again after the
weight changes), wherever `takes_torch_int8` says so; elsewhere they run
Keras' int8 code. Each row keeps its own scale, as in Keras, and the
weights give up one bit so that the kernel's 16-bit sums cannot saturate
(see `linear` and `_WEIGHT_LEVELS`): the outputs are Keras' int8 outputs
within the error of quantizing the inputs.

Example:
>>> import numpy as np, torch
>>> weight = np.array([[127, -127], [64, 0]], "int8")  # (inputs, outputs)
>>> scale = np.array([127.0, 127.0], "float32")        # weight = int8 / scale
>>> y = linear(torch.ones((1, 2)), torch.from_numpy(weight), torch.from_numpy(scale))
>>> np.round(y.numpy(), 1).tolist()
[[1.5, -1.0]]
"""

from __future__ import annotations

import functools
import math
import types
import warnings

import keras
from keras import ops

from keras_transformer.layers import ScaledSharedEmbedding
from keras_transformer.speed_paths.derived_tensors import derived, version
from keras_transformer.speed_paths.einsum_equations import contracted_axes
from keras_transformer.speed_paths.registry import SpeedPath, register
from keras_transformer.speed_paths.runtime import Runtime
from keras_transformer.utils import library_internals

# Engines whose dynamic int8 linear is FBGEMM's, measured faster than float32.
_ENGINES = ("x86", "fbgemm")
# The weights' largest magnitude in the kernel: 7 bits. On CPUs without VNNI
# the kernel adds pairs of products in 16 bits, which 8-bit inputs times
# 8-bit weights saturate (255 * 127 * 2 > 32,767). `torch.ao` gives the
# inputs 7 bits; here the weights give up the bit (Keras' -127..127 rescaled
# to -63..63), and the inputs keep Keras' resolution (255 * 63 * 2 < 32,767),
# which came nearer float32's BLEU (`benchmarks/real_text.py` measures it).
_WEIGHT_LEVELS = 63
# The packed weights, by int8 weight (`speed_paths.derived_tensors`).
_PACKED: dict[int, tuple] = {}


def takes_torch_int8(layer, inputs) -> bool:
    """Whether `layer`'s int8 product of `inputs` runs through `linear`:
    on torch, on the CPU, float32 inputs, Keras' default quantization of
    the inputs (no weight-only configuration, no LoRA), no gradient to
    compute for them (the kernel has none; training goes to Keras' code),
    and not traced by `torch.compile` (whose fake tensors cannot stand for
    quantized ones: a compiled search runs Keras' int8 code)."""
    if layer.quantization_mode != "int8":
        return False
    import torch

    return (
        getattr(layer, "inputs_quantizer", None) is not None
        and not getattr(layer, "lora_enabled", False)
        and torch.backends.quantized.engine in _ENGINES
        and _kernels_available()
        and isinstance(inputs, torch.Tensor)
        and inputs.dtype == torch.float32
        and inputs.device.type == "cpu"
        and not (torch.is_grad_enabled() and inputs.requires_grad)
        and not torch.compiler.is_compiling()
    )


@functools.cache
def _kernels_available() -> bool:
    """Whether this torch has the kernel and its quantized weights, which
    torch has deprecated (Keras' int8 code runs without them)."""
    import torch

    try:
        return callable(torch.ops.quantized.linear_dynamic) and library_internals.torch_quantizes_per_channel()
    except (AttributeError, RuntimeError):
        return False


def linear(inputs, weight, scale, *, contracted_axes: int = 1, weight_rows_are_outputs: bool = False):
    """`inputs` times the int8 `weight` dequantized (`weight / scale`).

    Args:
        inputs: float32 `(..., k_1, ..., k_c)`, its last `contracted_axes`
            axes contracted with the weight's first ones.
        weight: int8 `(k_1, ..., k_c, n_1, ...)`, or `(n, k)` with
            `weight_rows_are_outputs` (an embedding matrix used as `h @ E^T`).
        scale: one scale per output, in the outputs' order (any shape with
            that many elements: Keras' `kernel_scale` variables).

    Returns:
        float32 `(..., n_1, ...)`.
    """
    import torch

    if weight_rows_are_outputs:
        contracted_shape, output_shape = tuple(weight.shape[1:]), tuple(weight.shape[:1])
    else:
        contracted_shape = tuple(weight.shape[:contracted_axes])
        output_shape = tuple(weight.shape[contracted_axes:])
    leading = tuple(inputs.shape[: inputs.dim() - contracted_axes])
    packed = _packed(weight, scale, math.prod(output_shape), weight_rows_are_outputs)
    flat = inputs.reshape(*leading, math.prod(contracted_shape))
    # The kernel quantizes its input with one scale for the whole tensor, Keras
    # with one per row: each row divided by its largest magnitude first, and
    # its outputs multiplied back after (a product is linear in each row).
    row_scale = flat.abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(flat.dtype).tiny)
    outputs = torch.ops.quantized.linear_dynamic(flat / row_scale, packed, False) * row_scale  # False: 8 bits
    return outputs.reshape(*leading, *output_shape)


def _packed(weight, scale, outputs: int, weight_rows_are_outputs: bool):
    """The prepacked weight, made again when the weight or its scale has changed."""
    state = (id(scale), version(scale))
    return derived(_PACKED, weight, state, lambda: _pack(weight, scale, outputs, weight_rows_are_outputs))


def _pack(weight, scale, outputs: int, weight_rows_are_outputs: bool):
    import torch

    rows = weight.reshape(outputs, -1) if weight_rows_are_outputs else weight.reshape(-1, outputs).t()
    rescale = _WEIGHT_LEVELS / 127  # Keras' -127..127 onto the kernel's levels
    rows = torch.round(rows.detach().float() * rescale).to(torch.int8)
    # Keras' scale multiplies a float weight into int8; a quantized tensor's divides.
    per_output = (scale.detach().reshape(outputs).double() * rescale).reciprocal()
    with warnings.catch_warnings():  # torch's deprecation of quantized tensors, which users cannot act on
        warnings.filterwarnings("ignore", "torch.quantize_per_tensor", UserWarning)
        quantized = library_internals.torch_per_channel_quantized(
            rows.contiguous(), per_output, torch.zeros(outputs, dtype=torch.long), 0
        )
        return torch.ops.quantized.linear_prepack(quantized, None)


def einsum_contracted_axes(layer: keras.layers.EinsumDense) -> int:
    """The kernel axes that the quantized layer's equation contracts (a
    tensordot's), where the int8 kernel's scale holds one value per output
    in the outputs' order (Keras' layout of it then); else 0."""
    contracted = contracted_axes(layer.equation)
    transpose = list(library_internals.kernel_transpose_axes(layer) or [])
    per_output = math.prod(layer.kernel_scale.shape) == math.prod(layer.kernel.shape[contracted:])
    return contracted if contracted and transpose == sorted(transpose) and per_output else 0


def _dense_call(self, inputs, training=None):
    if not takes_torch_int8(self, inputs):
        return type(self).quantized_call(self, inputs, training=training)
    x = linear(inputs, ops.convert_to_tensor(self.kernel), ops.convert_to_tensor(self.kernel_scale))
    return self.activation(x if self.bias is None else x + ops.convert_to_tensor(self.bias))


def _einsum_dense_call(self, inputs, training=None):
    contracted = einsum_contracted_axes(self) if takes_torch_int8(self, inputs) else 0
    if not contracted:
        return type(self).quantized_call(self, inputs, training=training)
    kernel, scale = ops.convert_to_tensor(self.kernel), ops.convert_to_tensor(self.kernel_scale)
    x = linear(inputs, kernel, scale, contracted_axes=contracted)
    return self.activation(x if self.bias is None else x + ops.convert_to_tensor(self.bias))


def _output_projection_call(self, inputs, reverse: bool = False):
    if not (reverse and self.logit_soft_cap is None and takes_torch_int8(self, inputs)):
        return type(self).quantized_call(self, inputs, reverse=reverse)
    if self.tie_weights:  # E: (vocabulary, d_model), one scale per token
        embeddings, scale = ops.convert_to_tensor(self.embeddings), ops.convert_to_tensor(self.embeddings_scale)
        return linear(inputs, embeddings, scale, weight_rows_are_outputs=True)
    kernel, scale = ops.convert_to_tensor(self.reverse_embeddings), ops.convert_to_tensor(self.reverse_embeddings_scale)
    return linear(inputs, kernel, scale)


def _patch(layer: keras.layers.Layer, runtime: Runtime) -> dict:
    if isinstance(layer, keras.layers.EinsumDense):
        call = _einsum_dense_call
    elif isinstance(layer, keras.layers.Dense):
        call = _dense_call
    elif isinstance(layer, ScaledSharedEmbedding):
        call = _output_projection_call
    else:
        return {}
    return {"quantized_call": types.MethodType(call, layer)}


register(
    SpeedPath(
        "torch_int8",
        "Keras' int8 matmul on torch runs as int32 without BLAS; FBGEMM's int8 kernel is faster than float32",
        lambda runtime: runtime.backend == "torch" and runtime.on_cpu,
        patch=_patch,
    )
)
