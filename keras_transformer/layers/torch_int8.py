"""int8 products on torch's CPU through torch's own int8 kernels.

Keras' int8 layers quantize the weights once and, at each call, the inputs
(one scale per row), then multiply int8 by int8 with `ops.matmul`. On torch
that matmul casts both operands to int32 and runs torch's integer matrix
product, which no BLAS serves: int8 decoding was slower than float32. torch
has int8 kernels of its own for this: `quantized::linear_dynamic`, the
kernel of `torch.ao`'s dynamic quantization (FBGEMM on x86), which takes
prepacked int8 weights with one scale per output column and quantizes its
float32 input at each call. Keras has no way to reach it, hence this module.

The projections (`layers.projections`) and the output projection
(`ScaledSharedEmbedding`) call `linear` with Keras' own int8 weights and
scales, packed here once per weight (again after the weight changes),
wherever `takes_torch_int8` says so; elsewhere they run Keras' int8 code.

The kernel quantizes its input with one scale for the whole tensor (all
rows of a batch), where Keras' code takes one per row; so `linear` divides
each row by its largest magnitude before the kernel and multiplies the
row's outputs back after (a product is linear in each row), which gives
every row the whole range, as Keras' scales do.

On CPUs without VNNI instructions the kernel adds pairs of products in 16
bits, which saturate when 8-bit inputs meet 8-bit weights (255 * 127 * 2 >
32,767). `torch.ao` quantizes the inputs to 7 bits to prevent it: its
asymmetric 7 bits span a signed row in 127 steps where Keras' symmetric 8
bits take 254. Here the weights give up the bit instead (Keras' -127..127
rescaled to -63..63, one scale per output as before) and the inputs keep
Keras' resolution. Per token both ways are equally far from float32, and
farther than Keras' own int8 code; this one scored nearer float32's BLEU
on both shipped presets (`benchmarks/RESULTS.md`, "int8 on torch: which
operand gives up a bit"; `benchmarks/real_text.py` measures it).

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
import warnings

import keras

from keras_transformer.utils.derived_tensors import derived, version

# Engines whose dynamic int8 linear is FBGEMM's, measured faster than
# float32 here (benchmarks/RESULTS.md, "Why the code takes these paths").
_ENGINES = ("x86", "fbgemm")
# The weights' largest magnitude in the kernel: 7 bits, so that the 16-bit
# sums of two products of 8-bit inputs cannot saturate (255 * 63 * 2 < 32,767).
_WEIGHT_LEVELS = 63
# The packed weights, by int8 weight (`utils.derived_tensors`).
_PACKED: dict[int, tuple] = {}


def takes_torch_int8(layer, inputs) -> bool:
    """Whether `layer`'s int8 product of `inputs` runs through `linear`:
    on torch, on the CPU, float32 inputs, Keras' default quantization of
    the inputs (no weight-only configuration, no LoRA), no gradient to
    compute for them (the kernel has none; training goes to Keras' code),
    and not traced by `torch.compile` (whose fake tensors cannot stand for
    quantized ones: a compiled search runs Keras' int8 code)."""
    if keras.config.backend() != "torch" or layer.quantization_mode != "int8":
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
        return callable(torch.ops.quantized.linear_dynamic) and callable(torch._make_per_channel_quantized_tensor)
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
        quantized = torch._make_per_channel_quantized_tensor(
            rows.contiguous(), per_output, torch.zeros(outputs, dtype=torch.long), 0
        )
        return torch.ops.quantized.linear_prepack(quantized, None)
