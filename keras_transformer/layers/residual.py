"""The residual connection around every sublayer (sections 3.1 and 5.4)."""

from collections.abc import Callable

import keras

# P_drop of the base model (section 5.4): the blocks' and the backbone's default dropout.
RESIDUAL_DROPOUT = 0.1


def residual_sublayer(x, sublayer: Callable, dropout: Callable, norm: Callable, normalize_first: bool, training=None):
    """Post-LN `LayerNorm(x + Dropout(Sublayer(x)))` (section 3.1, the
    paper's), or Pre-LN `x + Dropout(Sublayer(LayerNorm(x)))`.

    The dropout is section 5.4's: "applied to the output of each sub-layer,
    before it is added to the sub-layer input"; `training` is passed to it.

    Example:
    >>> def dropout(h, training=None):
    ...     return h
    >>> residual_sublayer(3.0, lambda h: 2 * h, dropout, norm=lambda h: h / 9, normalize_first=False)
    1.0
    >>> residual_sublayer(3.0, lambda h: 2 * h, dropout, norm=lambda h: h / 9, normalize_first=True)
    3.6666666666666665
    """
    if normalize_first:
        return x + dropout(sublayer(norm(x)), training=training)
    return norm(x + dropout(sublayer(x), training=training))


def layer_norm(block: keras.layers.Layer, inputs_shape, name: str) -> keras.layers.LayerNormalization:
    """A built LayerNorm with the block's `layer_norm_epsilon` and dtype policy."""
    norm = keras.layers.LayerNormalization(epsilon=block.layer_norm_epsilon, dtype=block.dtype_policy, name=name)
    norm.build(inputs_shape)
    return norm
