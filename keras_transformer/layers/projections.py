"""Keras' `Dense` and `EinsumDense` whose products go through `layers.products`.

The blocks' projections (W^Q, W^K, W^V, W^O and the FFN's W1, W2) keep
Keras' weights, initialisation and int8 quantization, and multiply through
this package's `products`, which sums bfloat16 products in float32 where
the CPU has bfloat16 units, and on torch runs a product and its bias as one
`addmm`. Quantized to int8, they multiply through torch's
int8 kernels on torch (`layers.torch_int8`), and through Keras' int8 code
elsewhere. On torch they skip Keras' per-call work where it adds nothing
(`layers.direct_call`).
"""

import functools
import math

import keras
from keras import ops

from keras_transformer.layers import products, torch_int8
from keras_transformer.layers.direct_call import DirectCall


@keras.saving.register_keras_serializable(package="keras_transformer")
class Dense(DirectCall, keras.layers.Dense):
    """`activation(x W + b)`, `keras.layers.Dense`'s weights and quantization.

    Example:
    >>> import numpy as np
    >>> layer = Dense(2, kernel_initializer="ones")
    >>> keras.ops.convert_to_numpy(layer(np.ones((1, 3), "float32"))).tolist()
    [[3.0, 3.0]]
    """

    def call(self, inputs, training=None):
        x = products.torch_linear(inputs, self.kernel, self.bias, contracted=1)
        return self.activation(products.dense(inputs, self.kernel, self.bias) if x is None else x)

    def quantized_call(self, inputs, training=None):
        if not torch_int8.takes_torch_int8(self, inputs):
            return super().quantized_call(inputs, training=training)
        x = torch_int8.linear(inputs, ops.convert_to_tensor(self.kernel), ops.convert_to_tensor(self.kernel_scale))
        return self.activation(x if self.bias is None else products.add_bias(x, self.bias))

    def quantize(self, mode=None, type_check=True, config=None):
        # Keras quantizes only its own class (`type_check`); a quantized layer runs Keras' `quantized_call`.
        super().quantize(mode, type_check=False, config=config)


@keras.saving.register_keras_serializable(package="keras_transformer")
class EinsumDense(DirectCall, keras.layers.EinsumDense):
    """`activation(einsum(equation, x, W) + b)`, `keras.layers.EinsumDense`'s
    weights (Glorot fans from the equation's input and output axes) and quantization."""

    def call(self, inputs, training=None):
        x = products.torch_linear(inputs, self.kernel, self.bias, self._contracted_axes)
        if x is None:
            x = products.einsum(self.equation, inputs, self.kernel)
            x = x if self.bias is None else products.add_bias(x, self.bias)
        return self.activation(x)

    def quantized_call(self, inputs, training=None):
        contracted = self._int8_contracted_axes
        if not (contracted and torch_int8.takes_torch_int8(self, inputs)):
            return super().quantized_call(inputs, training=training)
        kernel, scale = ops.convert_to_tensor(self.kernel), ops.convert_to_tensor(self.kernel_scale)
        x = torch_int8.linear(inputs, kernel, scale, contracted_axes=contracted)
        if self.bias is not None:
            x = products.add_bias(x, self.bias)
        return self.activation(x)

    @functools.cached_property
    def _contracted_axes(self) -> int:
        return products.contracted_axes(self.equation)

    @functools.cached_property
    def _int8_contracted_axes(self) -> int:
        """The kernel axes that the equation contracts (a tensordot's), where
        the int8 kernel's scale holds one value per output in the outputs'
        order (Keras' layout of it then); else 0. Fixed once quantized."""
        contracted = products.contracted_axes(self.equation)
        transpose = list(self._kernel_transpose_axes or [])
        per_output = math.prod(self.kernel_scale.shape) == math.prod(self.kernel.shape[contracted:])
        return contracted if contracted and transpose == sorted(transpose) and per_output else 0

    def quantize(self, mode=None, type_check=True, config=None):
        super().quantize(mode, type_check=False, config=config)
