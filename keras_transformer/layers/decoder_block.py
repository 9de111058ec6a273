"""One decoder layer (section 3.1)."""

import keras
from keras import ops

from keras_transformer.layers.attention import causal_mask, key_padding_mask
from keras_transformer.layers.cached_attention import attend_cached, cache_keys_values
from keras_transformer.layers.encoder_block import (
    BLOCK_ARGUMENTS,
    RESIDUAL_DROPOUT,
    FeedForward,
    layer_norm,
    residual_sublayer,
)
from keras_transformer.layers.multi_head_attention import MultiHeadAttention


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderBlock(keras.layers.Layer):
    """One of the N identical decoder layers of section 3.1.

    Three sublayers:

        x = LayerNorm(x + Dropout(MaskedSelfAttention(x)))          # causal
        x = LayerNorm(x + Dropout(Attention(q=x, k=v=encoder_out)))  # 3.2.3
        x = LayerNorm(x + Dropout(FFN(x)))

    in the attributes `self_attention`, `cross_attention`, `feed_forward`,
    their `..._dropout` and their `..._norm` (made when the block is built;
    a block built without an encoder sequence has no `cross_attention`,
    `cross_attention_dropout` and `cross_attention_norm`: they are None).
    The self-attention is masked so that position i attends only to
    positions <= i (section 3.1: "ensures that the predictions for position
    i can depend only on the known outputs at positions less than i"); the
    encoder-decoder attention masks padded source positions.

    `call` (training, teacher forcing) runs every position at once.
    `decode_step` runs one position with the same sublayers, taking the keys
    and values of the positions already decoded (updated in place) and those
    of the encoder output (`cross_attention_cache`, computed once per
    sentence): each step then costs one new position instead of the whole
    prefix. Both compute attention with `layers.attention`'s equation 1.
    `normalize_first=True` gives Pre-LN; `attention_dropout` (no dropout on
    attention weights in section 5.4) is 0 unless asked for; `activation` is
    the FFN's (ReLU in the paper).

    Example:
    >>> import numpy as np
    >>> block = DecoderBlock(intermediate_dim=16, num_heads=2)
    >>> y = np.random.rand(2, 3, 8).astype("float32")
    >>> x = np.random.rand(2, 5, 8).astype("float32")
    >>> tuple(block(y, x).shape)
    (2, 3, 8)
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

    def build(self, decoder_sequence_shape, encoder_sequence_shape=None):
        def attention(name, memory_shape):
            layer = MultiHeadAttention(
                self.num_heads, dropout=self.attention_dropout, dtype=self.dtype_policy, name=name
            )
            layer.build(decoder_sequence_shape, memory_shape)
            return layer

        def dropout(name):
            return keras.layers.Dropout(self.dropout, dtype=self.dtype_policy, name=name)

        self.self_attention = attention("self_attention", decoder_sequence_shape)
        self.self_attention_dropout = dropout("self_attention_dropout")
        self.self_attention_norm = layer_norm(self, decoder_sequence_shape, "self_attention_norm")
        self.cross_attention = self.cross_attention_dropout = self.cross_attention_norm = None
        if encoder_sequence_shape is not None:
            self.cross_attention = attention("cross_attention", encoder_sequence_shape)
            self.cross_attention_dropout = dropout("cross_attention_dropout")
            self.cross_attention_norm = layer_norm(self, decoder_sequence_shape, "cross_attention_norm")
        self.feed_forward = FeedForward(
            self.intermediate_dim, self.activation, dtype=self.dtype_policy, name="feed_forward"
        )
        self.feed_forward.build(decoder_sequence_shape)
        self.feed_forward_dropout = dropout("feed_forward_dropout")
        self.feed_forward_norm = layer_norm(self, decoder_sequence_shape, "feed_forward_norm")
        self.built = True

    def call(
        self,
        decoder_sequence,
        encoder_sequence=None,
        decoder_padding_mask=None,
        encoder_padding_mask=None,
        training=None,
        return_cross_attention_scores=False,
    ):
        """The block on `decoder_sequence` `(batch, length, d_model)`, every
        position at once (teacher forcing), attending to `encoder_sequence`.

        Args:
            decoder_padding_mask, encoder_padding_mask: `(batch, length)`,
                0 at padding: no position attends to a padded one.
            return_cross_attention_scores: also return the encoder-decoder
                attention weights `(batch, heads, length, source_length)`.
        """
        if (encoder_sequence is None) != (self.cross_attention is None):
            built = "without" if self.cross_attention is None else "with"
            raise ValueError(
                f"This DecoderBlock was built {built} an encoder-decoder attention; call it "
                f"{built} `encoder_sequence`, as when it was first called."
            )
        self_mask = causal_mask(ops.shape(decoder_sequence)[1])
        if decoder_padding_mask is not None:
            self_mask = ops.logical_and(self_mask, key_padding_mask(decoder_padding_mask))
        cross_mask = None if encoder_padding_mask is None else key_padding_mask(encoder_padding_mask)
        cross_weights = []

        def self_attention(h):
            return self.self_attention(h, h, self_mask, training=training)[0]

        def cross_attention(h):
            output, weights = self.cross_attention(h, encoder_sequence, cross_mask, training=training)
            cross_weights.append(weights)
            return output

        x = self._sublayers(decoder_sequence, self_attention, cross_attention, training)
        return (x, cross_weights[0]) if return_cross_attention_scores else x

    def cross_attention_cache(self, encoder_output) -> tuple:
        """Keys and values of the encoder output for the cross-attention,
        laid out as `cached_attention.cache_keys_values` returns them."""
        return cache_keys_values(self.cross_attention, encoder_output)

    def decode_step(
        self, x, index, self_attention_cache: tuple, cross_attention_cache: tuple, encoder_padding_mask, visible_slots
    ):
        """The block on one position `(rows, 1, d_model)`, for inference.

        The same sublayers and weights as `call` (without dropout), but the
        self-attention reads the keys and values of the decoded positions
        from `self_attention_cache` (writing this position's first) and the
        cross-attention reads `cross_attention_cache`; see
        `keras_transformer.layers.cached_attention` for the layout.

        Args:
            visible_slots: which slots of `self_attention_cache` each row
                may attend to (`cached_attention.visible_slots`).

        Returns:
            `(output (rows, 1, d_model), self_attention_cache)`.
        """
        keys, values = self_attention_cache
        beams = ops.shape(visible_slots)[2]

        def self_attention(h):
            nonlocal keys, values
            out, keys, values = attend_cached(self.self_attention, h, keys, values, visible_slots, beams, index)
            return out

        source_visible = ops.cast(encoder_padding_mask, "bool")[:, None, None, :]

        def cross_attention(h):
            return attend_cached(self.cross_attention, h, *cross_attention_cache, source_visible, beams)[0]

        x = self._sublayers(x, self_attention, cross_attention, dropout=False)
        return x, (keys, values)

    def _sublayers(self, x, self_attention, cross_attention, training=None, dropout: bool = True):
        """Section 3.1's three sublayers, given how to attend; their residual
        dropouts apply only when `training`, and are left out without `dropout`."""

        def sublayer(h, attend, residual_dropout, norm):
            kept_dropout = residual_dropout if dropout else None
            return residual_sublayer(h, attend, kept_dropout, norm, self.normalize_first, training)

        x = sublayer(x, self_attention, self.self_attention_dropout, self.self_attention_norm)
        if self.cross_attention is not None:
            x = sublayer(x, cross_attention, self.cross_attention_dropout, self.cross_attention_norm)
        return sublayer(x, self.feed_forward, self.feed_forward_dropout, self.feed_forward_norm)

    def get_config(self):
        config = super().get_config()
        config.update({name: getattr(self, name) for name in BLOCK_ARGUMENTS})
        config["activation"] = keras.activations.serialize(self.activation)
        return config
