"""One decoder layer (section 3.1)."""

import keras
import keras_hub
from keras import ops

from keras_transformer.utils import library_internals
from keras_transformer.layers.attention_dropout import attention_dropout_while_building
from keras_transformer.layers.cached_attention import attend_cached, cache_keys_values


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderBlock(keras_hub.layers.TransformerDecoder):
    """One of the N identical decoder layers of section 3.1.

    Three sublayers:

        x = LayerNorm(x + Dropout(MaskedSelfAttention(x)))          # causal
        x = LayerNorm(x + Dropout(Attention(q=x, k=v=encoder_out)))  # 3.2.3
        x = LayerNorm(x + Dropout(FFN(x)))

    The self-attention is masked so that position i attends only to positions
    <= i (section 3.1: "ensures that the predictions for position i can depend
    only on the known outputs at positions less than i"); the encoder-decoder
    attention masks padded source positions.

    For incremental decoding, `decode_step` takes the keys and values of the
    positions already decoded (updated in place) and those of the encoder
    output (`cross_attention_cache`, computed once per sentence): each step
    then costs one new position instead of the whole prefix.

    KerasHub's `TransformerDecoder` implements these equations; this class
    fixes the paper's defaults and adds `decode_step`, the same sublayers on
    one position with this package's cached attention.
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
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        activation="relu",
        normalize_first: bool = False,
        layer_norm_epsilon: float = 1e-6,
        **kwargs,
    ):
        # KerasHub builds the layer inside its constructor when the config
        # holds the build shapes (`from_config` of a built block), which
        # would be before `attention_dropout` exists; build afterwards.
        decoder_sequence_shape = kwargs.pop("decoder_sequence_shape", None)
        encoder_sequence_shape = kwargs.pop("encoder_sequence_shape", None)
        super().__init__(
            intermediate_dim=intermediate_dim,
            num_heads=num_heads,
            dropout=dropout,
            activation=activation,
            normalize_first=normalize_first,
            layer_norm_epsilon=layer_norm_epsilon,
            **kwargs,
        )
        self.attention_dropout = attention_dropout
        if decoder_sequence_shape:
            self.build(decoder_sequence_shape, encoder_sequence_shape)

    def build(self, decoder_sequence_shape, encoder_sequence_shape=None):
        with attention_dropout_while_building(self, library_internals.DECODER_RESIDUAL_DROPOUTS):
            super().build(decoder_sequence_shape, encoder_sequence_shape)

    def attention_layers(self) -> list:
        """Self-attention, then cross-attention if built with an encoder."""
        return library_internals.attention_layers(self, library_internals.DECODER_ATTENTION_LAYERS)

    def cross_attention_cache(self, encoder_output) -> tuple:
        """Keys and values of the encoder output for the cross-attention,
        laid out as `cached_attention.cache_keys_values` returns them."""
        return cache_keys_values(self.attention_layers()[1], encoder_output)

    def decode_step(
        self, x, index, self_attention_cache: tuple, cross_attention_cache: tuple, encoder_padding_mask, visible_slots
    ):
        """The block on one position `(rows, 1, d_model)`, for inference.

        The same sublayers and weights as `call` (without dropout), but the
        self-attention reads the keys and values of the decoded positions
        from `self_attention_cache` (writing this position's first) and the
        cross-attention reads `cross_attention_cache`; see
        `keras_transformer.layers.cached_attention` for the layout and for
        why these are not KerasHub's cached attention.

        Args:
            visible_slots: which slots of `self_attention_cache` each row
                may attend to (`cached_attention.visible_slots`).

        Returns:
            `(output (rows, 1, d_model), self_attention_cache)`.
        """
        layers = library_internals.block_sublayers(self)
        keys, values = self_attention_cache
        beams = ops.shape(visible_slots)[2]

        def self_attention(h):
            nonlocal keys, values
            out, keys, values = attend_cached(
                layers["self_attention"], h, keys, values, visible_slots, beams, update_index=index
            )
            return out

        source_visible = ops.cast(encoder_padding_mask, "bool")[:, None, None, :]

        def cross_attention(h):
            return attend_cached(layers["cross_attention"], h, *cross_attention_cache, source_visible, beams)[0]

        x = self._residual(x, layers["self_attention_norm"], self_attention)
        x = self._residual(x, layers["cross_attention_norm"], cross_attention)
        x = self._residual(x, layers["ffn_norm"], lambda h: layers["ffn_outer"](layers["ffn_inner"](h)))
        return x, (keys, values)

    def _residual(self, x, norm, sublayer):
        """Post-LN `LayerNorm(x + Sublayer(x))` (section 5.4), or Pre-LN."""
        if self.normalize_first:
            return x + sublayer(norm(x))
        return norm(x + sublayer(x))

    def get_config(self):
        config = super().get_config()
        config["attention_dropout"] = self.attention_dropout
        return config
