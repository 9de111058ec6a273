"""A learned bias on the output logits (Marian's `final_logits_bias`)."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class LogitsBias(keras.layers.Layer):
    """Adds one learned bias per vocabulary entry to the logits.

    The paper's pre-softmax projection is the transposed embedding matrix and
    nothing else (section 3.4). Marian adds a bias vector to it, which the
    Opus-MT checkpoints store as `final_logits_bias`; the backbone creates
    this layer only when asked (`use_logits_bias=True`). It starts at zero,
    so a fresh model computes the paper's logits.

    Args:
        vocabulary_size: the number of logits.

    Example:
    >>> import numpy as np
    >>> layer = LogitsBias(vocabulary_size=3)
    >>> _ = layer.bias.assign([0.0, 1.0, -1.0])
    >>> keras.ops.convert_to_numpy(layer(np.zeros((1, 1, 3), "float32"))).tolist()
    [[[0.0, 1.0, -1.0]]]
    """

    def __init__(self, vocabulary_size: int, **kwargs):
        super().__init__(**kwargs)
        self.vocabulary_size = vocabulary_size
        self.bias = self.add_weight(shape=(vocabulary_size,), initializer="zeros", name="bias")
        self.built = True

    def call(self, logits):
        return ops.add(logits, ops.cast(self.bias, logits.dtype))

    def get_config(self):
        config = super().get_config()
        config["vocabulary_size"] = self.vocabulary_size
        return config

    def compute_output_shape(self, input_shape):
        return input_shape
