"""One decoder layer (section 3.1)."""

import keras
import keras_hub
from keras import ops

from keras_transformer.layers.attention import causal_mask, key_padding_mask, multi_head_attention
from keras_transformer.layers.attention_dropout import attention_dropout_while_building
from keras_transformer.layers.products import accumulating_in_float32
from keras_transformer.layers.cached_attention import attend_cached, cache_keys_values
from keras_transformer.layers.residual import residual_sublayer
from keras_transformer.training.recipe import TrainingRecipe
from keras_transformer.utils import library_internals


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

    KerasHub's `TransformerDecoder` makes the sublayers and their weights;
    `call` (training, teacher forcing) and `decode_step` (one position,
    cached keys and values) compute the equations above with them through
    the same `_sublayers`, and both compute attention with this package's
    one `layers.attention.scaled_dot_product_attention`.
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
        dropout: float = TrainingRecipe.dropout,
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

    @accumulating_in_float32
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
        layers = library_internals.block_sublayers(self)
        if (encoder_sequence is None) != ("cross_attention" not in layers):
            built = "with" if "cross_attention" in layers else "without"
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
            return multi_head_attention(layers["self_attention"], h, h, self_mask, training)[0]

        def cross_attention(h):
            output, weights = multi_head_attention(layers["cross_attention"], h, encoder_sequence, cross_mask, training)
            cross_weights.append(weights)
            return output

        x = self._sublayers(decoder_sequence, self_attention, cross_attention, layers, training)
        return (x, cross_weights[0]) if return_cross_attention_scores else x

    @accumulating_in_float32
    def cross_attention_cache(self, encoder_output) -> tuple:
        """Keys and values of the encoder output for the cross-attention,
        laid out as `cached_attention.cache_keys_values` returns them."""
        return cache_keys_values(self.attention_layers()[1], encoder_output)

    @accumulating_in_float32
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

        x = self._sublayers(x, self_attention, cross_attention, layers)
        return x, (keys, values)

    def _sublayers(self, x, self_attention, cross_attention, layers: dict, training=None):
        """Section 3.1's three sublayers, given how to attend; their residual
        dropouts apply only when `training`."""

        def dropped(sublayer, dropout: str):
            if not training:
                return sublayer
            return lambda h: layers[dropout](sublayer(h), training=training)

        def feed_forward(h):
            return layers["ffn_outer"](layers["ffn_inner"](h))

        x = residual_sublayer(
            x, dropped(self_attention, "self_attention_dropout"), layers["self_attention_norm"], self.normalize_first
        )
        if "cross_attention" in layers:
            x = residual_sublayer(
                x,
                dropped(cross_attention, "cross_attention_dropout"),
                layers["cross_attention_norm"],
                self.normalize_first,
            )
        return residual_sublayer(x, dropped(feed_forward, "ffn_dropout"), layers["ffn_norm"], self.normalize_first)

    def get_config(self):
        config = super().get_config()
        config["attention_dropout"] = self.attention_dropout
        return config
