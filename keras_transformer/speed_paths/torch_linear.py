"""Speed path `torch_linear`: a projection and its bias as one `torch.addmm`, what `torch.nn.Linear` runs.

Keras' `Dense` and `EinsumDense` multiply, then add the bias: two kernels
and a product written and read once more. Attached, those with a bias whose
equation contracts the input's last axes with the kernel's first ones
(every projection of the paper's layers) run `linear` on float32 torch
tensors, and Keras' own `call` otherwise. `addmm` sums the bias into the
product, so its values may differ from Keras' in the last bits.

Example:
>>> import torch
>>> linear(torch.ones(2, 3), torch.ones(3, 4), torch.ones(4), contracted=1).tolist()[0]
[4.0, 4.0, 4.0, 4.0]
"""

import math
import types

import keras

from keras_transformer.speed_paths.einsum_equations import contracted_axes
from keras_transformer.speed_paths.registry import SpeedPath, register
from keras_transformer.speed_paths.runtime import Runtime


def linear(x, kernel, bias, contracted: int):
    """`x`'s last `contracted` axes times `kernel`'s first ones, plus `bias`
    shaped as the kernel's other axes, as one `torch.addmm`, all float32
    torch tensors (or Keras variables holding them); None for anything else."""
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


def _patch(layer: keras.layers.Layer, runtime: Runtime) -> dict:
    if isinstance(layer, keras.layers.EinsumDense):
        contracted = contracted_axes(layer.equation)
    elif isinstance(layer, keras.layers.Dense):
        contracted = 1
    else:
        return {}
    if not contracted or layer.bias is None:
        return {}

    def call(self, inputs, training=None):
        x = linear(inputs, self.kernel, self.bias, contracted)
        return type(self).call(self, inputs, training=training) if x is None else self.activation(x)

    return {"call": types.MethodType(call, layer)}


register(
    SpeedPath(
        "torch_linear",
        "one addmm for a product and its bias is faster on torch at decoding's shapes than two kernels",
        lambda runtime: runtime.backend == "torch",
        patch=_patch,
    )
)
