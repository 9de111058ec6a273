"""The residual connection around every sublayer (sections 3.1 and 5.4)."""

from collections.abc import Callable

import keras

from keras_transformer.layers.direct_call import DirectCall
from keras_transformer.utils import eager_ops

# P_drop of the base model (section 5.4): the blocks' and the backbone's default dropout.
RESIDUAL_DROPOUT = 0.1


def residual_sublayer(
    x, sublayer: Callable, dropout: Callable | None, norm: Callable, normalize_first: bool, training=None
):
    """Post-LN `LayerNorm(x + Dropout(Sublayer(x)))` (section 3.1, the
    paper's), or Pre-LN `x + Dropout(Sublayer(LayerNorm(x)))`.

    The dropout is section 5.4's: "applied to the output of each sub-layer,
    before it is added to the sub-layer input"; `training` is passed to it.
    `dropout=None` leaves it out (decoding).

    Example:
    >>> def dropout(h, training=None):
    ...     return h
    >>> residual_sublayer(3.0, lambda h: 2 * h, dropout, norm=lambda h: h / 9, normalize_first=False)
    1.0
    >>> residual_sublayer(3.0, lambda h: 2 * h, dropout, norm=lambda h: h / 9, normalize_first=True)
    3.6666666666666665
    """

    def dropped(h):
        return h if dropout is None else dropout(h, training=training)

    if normalize_first:
        return x + dropped(sublayer(norm(x)))
    return norm(x + dropped(sublayer(x)))


@keras.saving.register_keras_serializable(package="keras_transformer")
class LayerNormalization(DirectCall, keras.layers.LayerNormalization):
    """Keras' `LayerNormalization`; on torch it skips Keras' per-call work
    where that adds nothing (`layers.direct_call`, `utils.eager_ops`)."""

    def call(self, inputs):
        # Keras' own `call`, through `eager_ops`.
        outputs = eager_ops.layer_normalization(
            inputs, self.gamma, self.beta, self.axis, self.epsilon, rms_scaling=self.rms_scaling
        )
        return eager_ops.cast(outputs, self.compute_dtype)


def layer_norm(block: keras.layers.Layer, inputs_shape, name: str) -> LayerNormalization:
    """A built LayerNorm with the block's `layer_norm_epsilon` and dtype policy."""
    norm = LayerNormalization(epsilon=block.layer_norm_epsilon, dtype=block.dtype_policy, name=name)
    norm.build(inputs_shape)
    return norm
