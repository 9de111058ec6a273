"""Keras' `Dense` and `EinsumDense` whose products go through `layers.products`.

The blocks' projections (W^Q, W^K, W^V, W^O and the FFN's W1, W2) keep
Keras' weights, initialisation and int8 quantization, and multiply through
this package's `products`, which sums bfloat16 products in float32 where
the CPU has bfloat16 units.
"""

import keras

from keras_transformer.layers import products


@keras.saving.register_keras_serializable(package="keras_transformer")
class Dense(keras.layers.Dense):
    """`activation(x W + b)`, `keras.layers.Dense`'s weights and quantization.

    Example:
    >>> import numpy as np
    >>> layer = Dense(2, kernel_initializer="ones")
    >>> keras.ops.convert_to_numpy(layer(np.ones((1, 3), "float32"))).tolist()
    [[3.0, 3.0]]
    """

    def call(self, inputs, training=None):
        return self.activation(products.dense(inputs, self.kernel, self.bias))

    def quantize(self, mode=None, type_check=True, config=None):
        # Keras quantizes only its own class (`type_check`); a quantized layer runs Keras' `quantized_call`.
        super().quantize(mode, type_check=False, config=config)


@keras.saving.register_keras_serializable(package="keras_transformer")
class EinsumDense(keras.layers.EinsumDense):
    """`activation(einsum(equation, x, W) + b)`, `keras.layers.EinsumDense`'s
    weights (Glorot fans from the equation's input and output axes) and quantization."""

    def call(self, inputs, training=None):
        x = products.einsum(self.equation, inputs, self.kernel)
        if self.bias is not None:
            x = products.add_bias(x, self.bias)
        return self.activation(x)

    def quantize(self, mode=None, type_check=True, config=None):
        super().quantize(mode, type_check=False, config=config)
