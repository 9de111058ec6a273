"""The position-wise feed-forward network (section 3.3)."""

import keras

from keras_transformer.layers.direct_call import DirectCall
from keras_transformer.layers.projections import Dense


@keras.saving.register_keras_serializable(package="keras_transformer")
class FeedForward(DirectCall, keras.layers.Layer):
    """`FFN(x) = max(0, x W1 + b1) W2 + b2` (equation 2), applied to each position.

    `inner` is `x W1 + b1` (d_model to d_ff = `intermediate_dim`) with the
    activation (ReLU in the paper; Opus-MT's base models use swish), `outer`
    is `W2 + b2` back to d_model; both Glorot-uniform.

    Example:
    >>> import numpy as np
    >>> tuple(FeedForward(intermediate_dim=16)(np.ones((2, 3, 8), "float32")).shape)
    (2, 3, 8)
    """

    def __init__(self, intermediate_dim: int, activation="relu", **kwargs):
        super().__init__(**kwargs)
        self.intermediate_dim = intermediate_dim
        self.activation = keras.activations.get(activation)

    def build(self, inputs_shape):
        def dense(units, activation, name):
            return Dense(
                units,
                activation=activation,
                kernel_initializer="glorot_uniform",
                bias_initializer="zeros",
                dtype=self.dtype_policy,
                name=name,
            )

        self.inner = dense(self.intermediate_dim, self.activation, "inner")
        self.outer = dense(inputs_shape[-1], None, "outer")
        self.inner.build(inputs_shape)
        self.outer.build((*inputs_shape[:-1], self.intermediate_dim))
        self.built = True

    def call(self, inputs):
        return self.outer(self.inner(inputs))

    def get_config(self):
        config = super().get_config()
        config.update(
            {"intermediate_dim": self.intermediate_dim, "activation": keras.activations.serialize(self.activation)}
        )
        return config
