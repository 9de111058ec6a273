"""One encoder layer (section 3.1)."""

import keras
import keras_hub

from keras_transformer.layers.attention import key_padding_mask, multi_head_attention
from keras_transformer.layers.attention_dropout import attention_dropout_while_building
from keras_transformer.layers.products import accumulating_in_float32
from keras_transformer.layers.residual import residual_sublayer
from keras_transformer.training.recipe import TrainingRecipe
from keras_transformer.utils import library_internals


@keras.saving.register_keras_serializable(package="keras_transformer")
class EncoderBlock(keras_hub.layers.TransformerEncoder):
    """One of the N identical encoder layers of section 3.1.

    Two sublayers, each wrapped as in section 3.1 and regularised as in 5.4:

        x = LayerNorm(x + Dropout(MultiHeadSelfAttention(x)))   # 3.2.2
        x = LayerNorm(x + Dropout(FFN(x)))                       # 3.3
        FFN(x) = max(0, x W1 + b1) W2 + b2

    This is the Post-LN arrangement of the paper. `normalize_first=True` gives
    the Pre-LN variant, `x + Dropout(Sublayer(LayerNorm(x)))`, which trains
    more stably for deep stacks (the backbone then adds a final LayerNorm).

    KerasHub's `TransformerEncoder` makes the sublayers and their weights
    (Glorot-uniform W^Q, W^K, W^V, W^O drawn independently with fans taken
    from the d_model x d_model matrices); `call` computes the equations
    above with them, the attention through this package's one
    `layers.attention.multi_head_attention` (as cached decoding does).
    `intermediate_dim` is d_ff, `num_heads` is h, `dropout` is P_drop,
    `activation` is the FFN's (ReLU in the paper). Section 5.4 puts no
    dropout on the attention weights, so `attention_dropout` (KerasHub would
    use `dropout`) defaults to 0.

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
        dropout: float = TrainingRecipe.dropout,
        attention_dropout: float = 0.0,
        activation="relu",
        normalize_first: bool = False,
        layer_norm_epsilon: float = 1e-6,
        **kwargs,
    ):
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

    def build(self, inputs_shape):
        with attention_dropout_while_building(self, library_internals.ENCODER_RESIDUAL_DROPOUTS):
            super().build(inputs_shape)

    @accumulating_in_float32
    def call(self, inputs, padding_mask=None, training=None, return_attention_scores=False):
        """The block on `inputs` `(batch, length, d_model)`.

        Args:
            padding_mask: `(batch, length)`, 0 at padding: no position
                attends to a padded one.
            return_attention_scores: also return the self-attention weights
                `(batch, heads, length, length)`.
        """
        layers = library_internals.block_sublayers(self)
        mask = None if padding_mask is None else key_padding_mask(padding_mask)
        weights = []

        def self_attention(h):
            output, attention_weights = multi_head_attention(layers["self_attention"], h, h, mask, training)
            weights.append(attention_weights)
            return layers["self_attention_dropout"](output, training=training)

        def feed_forward(h):
            return layers["ffn_dropout"](layers["ffn_outer"](layers["ffn_inner"](h)), training=training)

        x = residual_sublayer(inputs, self_attention, layers["self_attention_norm"], self.normalize_first)
        x = residual_sublayer(x, feed_forward, layers["ffn_norm"], self.normalize_first)
        return (x, weights[0]) if return_attention_scores else x

    def attention_layers(self) -> list:
        """The block's `MultiHeadAttention` layer (built blocks only)."""
        return library_internals.attention_layers(self, library_internals.ENCODER_ATTENTION_LAYERS)

    def get_config(self):
        config = super().get_config()
        config["attention_dropout"] = self.attention_dropout
        return config
