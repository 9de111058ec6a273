"""One encoder layer (section 3.1), with the two pieces every block is made of.

- `residual_sublayer`: the residual connection and LayerNorm around each
  sublayer (sections 3.1 and 5.4);
- `FeedForward`: the position-wise feed-forward network (section 3.3,
  equation 2);
- `EncoderBlock`: multi-head self-attention (`multi_head_attention`) and the
  feed-forward network, each wrapped by `residual_sublayer`.

`decoder_block.DecoderBlock` is built from the same pieces.
"""

from collections.abc import Callable

import keras

from keras_transformer.layers.attention import key_padding_mask
from keras_transformer.layers.multi_head_attention import MultiHeadAttention

# P_drop of the base model (section 5.4): the blocks' and the backbone's default dropout.
RESIDUAL_DROPOUT = 0.1
# What a block's config holds: its constructor's arguments.
BLOCK_ARGUMENTS = (
    "intermediate_dim num_heads dropout attention_dropout activation normalize_first layer_norm_epsilon".split()
)


def residual_sublayer(x, sublayer: Callable, dropout, norm: Callable, normalize_first: bool, training=None):
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

    h = sublayer(norm(x) if normalize_first else x)
    if dropout is not None:
        h = dropout(h, training=training)
    return x + h if normalize_first else norm(x + h)


def layer_norm(block: keras.layers.Layer, inputs_shape, name: str) -> keras.layers.LayerNormalization:
    """A built LayerNorm with the block's `layer_norm_epsilon` and dtype policy."""
    norm = keras.layers.LayerNormalization(epsilon=block.layer_norm_epsilon, dtype=block.dtype_policy, name=name)
    norm.build(inputs_shape)
    return norm


@keras.saving.register_keras_serializable(package="keras_transformer")
class FeedForward(keras.layers.Layer):
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
        self.inner = keras.layers.Dense(self.intermediate_dim, self.activation, dtype=self.dtype_policy, name="inner")
        self.outer = keras.layers.Dense(inputs_shape[-1], dtype=self.dtype_policy, name="outer")
        self.inner.build(inputs_shape)
        self.outer.build((*inputs_shape[:-1], self.intermediate_dim))
        self.built = True

    def call(self, inputs):
        return self.outer(self.inner(inputs))

    def get_config(self):
        activation = keras.activations.serialize(self.activation)
        return {**super().get_config(), "intermediate_dim": self.intermediate_dim, "activation": activation}


@keras.saving.register_keras_serializable(package="keras_transformer")
class EncoderBlock(keras.layers.Layer):
    """One of the N identical encoder layers of section 3.1.

    Two sublayers, each wrapped as in section 3.1 and regularised as in 5.4:

        x = LayerNorm(x + Dropout(MultiHeadSelfAttention(x)))   # 3.2.2
        x = LayerNorm(x + Dropout(FFN(x)))                       # 3.3
        FFN(x) = max(0, x W1 + b1) W2 + b2

    in the attributes `self_attention`, `self_attention_dropout`,
    `self_attention_norm`, `feed_forward`, `feed_forward_dropout` and
    `feed_forward_norm` (made when the block is built, d_model being the
    input's last axis). This is the Post-LN arrangement of the paper;
    `normalize_first=True` gives the Pre-LN variant, `x +
    Dropout(Sublayer(LayerNorm(x)))`, which trains more stably for deep
    stacks (the backbone then adds a final LayerNorm).

    `intermediate_dim` is d_ff, `num_heads` is h, `dropout` is P_drop,
    `activation` is the FFN's (ReLU in the paper). Section 5.4 puts no
    dropout on the attention weights, so `attention_dropout` defaults to 0.

    Example:
    >>> import numpy as np
    >>> block = EncoderBlock(intermediate_dim=16, num_heads=2)
    >>> x = np.random.rand(2, 5, 8).astype("float32")
    >>> tuple(block(x, padding_mask=np.ones((2, 5), bool)).shape)
    (2, 5, 8)
    """

    def __init__(
        self,
        intermediate_dim: int,
        num_heads: int,
        dropout: float = RESIDUAL_DROPOUT,
        attention_dropout: float = 0.0,
        activation="relu",
        normalize_first: bool = False,
        layer_norm_epsilon: float = 1e-6,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.intermediate_dim = intermediate_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.activation = keras.activations.get(activation)
        self.normalize_first = normalize_first
        self.layer_norm_epsilon = layer_norm_epsilon

    def build(self, inputs_shape):
        def dropout(name):
            return keras.layers.Dropout(self.dropout, dtype=self.dtype_policy, name=name)

        self.self_attention = MultiHeadAttention(
            self.num_heads, dropout=self.attention_dropout, dtype=self.dtype_policy, name="self_attention"
        )
        self.self_attention.build(inputs_shape, inputs_shape)
        self.self_attention_dropout = dropout("self_attention_dropout")
        self.self_attention_norm = layer_norm(self, inputs_shape, "self_attention_norm")
        self.feed_forward = FeedForward(
            self.intermediate_dim, self.activation, dtype=self.dtype_policy, name="feed_forward"
        )
        self.feed_forward.build(inputs_shape)
        self.feed_forward_dropout = dropout("feed_forward_dropout")
        self.feed_forward_norm = layer_norm(self, inputs_shape, "feed_forward_norm")
        self.built = True

    def call(self, inputs, padding_mask=None, training=None, return_attention_scores=False):
        """The block on `inputs` `(batch, length, d_model)`.

        Args:
            padding_mask: `(batch, length)`, 0 at padding: no position
                attends to a padded one.
            return_attention_scores: also return the self-attention weights
                `(batch, heads, length, length)`.
        """
        mask = None if padding_mask is None else key_padding_mask(padding_mask)
        weights = []

        def self_attention(h):
            output, attention_weights = self.self_attention(h, h, mask, training=training)
            weights.append(attention_weights)
            return output

        def sublayer(x, layer, dropout, norm):
            return residual_sublayer(x, layer, dropout, norm, self.normalize_first, training)

        x = sublayer(inputs, self_attention, self.self_attention_dropout, self.self_attention_norm)
        x = sublayer(x, self.feed_forward, self.feed_forward_dropout, self.feed_forward_norm)
        return (x, weights[0]) if return_attention_scores else x

    def get_config(self):
        config = super().get_config()
        config.update({name: getattr(self, name) for name in BLOCK_ARGUMENTS})
        config["activation"] = keras.activations.serialize(self.activation)
        return config
