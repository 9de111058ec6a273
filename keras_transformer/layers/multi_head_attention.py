"""Multi-head attention (section 3.2.2) as a layer: W^Q, W^K, W^V, W^O around equation 1."""

import keras
from keras import ops

from keras_transformer.layers.attention import heads_first, keys_transposed, scaled_dot_product_attention


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(keras.layers.Layer):
    """`MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O`, `head_i =
    Attention(Q W_i^Q, K W_i^K, V W_i^V)` (section 3.2.2), d_k = d_v = d_model / h.

    `query_projection`, `key_projection` and `value_projection` map d_model
    to `(heads, d_k)`, `output_projection` maps `(heads, d_v)` back to
    d_model: the weight shapes of Keras' `MultiHeadAttention`, each kernel
    Glorot-uniform with its own draw. Equation 1 is
    `attention.scaled_dot_product_attention`, as in cached decoding
    (`cached_attention`). `dropout` applies to the softmax weights
    (`weights_dropout`): none in section 5.4, so 0 by default.

    Example:
    >>> import numpy as np
    >>> attention = MultiHeadAttention(num_heads=2)
    >>> x = np.random.rand(1, 3, 8).astype("float32")
    >>> output, weights = attention(x, x)
    >>> tuple(output.shape), tuple(weights.shape)
    ((1, 3, 8), (1, 2, 3, 3))
    """

    def __init__(self, num_heads: int, dropout: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.dropout = dropout

    def build(self, query_shape, memory_shape=None):
        memory_shape = query_shape if memory_shape is None else memory_shape
        d_model = query_shape[-1]
        heads = (None, self.num_heads, d_model // self.num_heads)

        def projection(equation, output_shape, bias_axes, name, inputs_shape):
            layer = keras.layers.EinsumDense(
                equation, output_shape, bias_axes=bias_axes, dtype=self.dtype_policy, name=name
            )
            layer.build(inputs_shape)
            return layer

        self.query_projection = projection("abc,cde->abde", heads, "de", "query", query_shape)
        self.key_projection = projection("abc,cde->abde", heads, "de", "key", memory_shape)
        self.value_projection = projection("abc,cde->abde", heads, "de", "value", memory_shape)
        self.output_projection = projection(
            "abcd,cde->abe", (None, d_model), "e", "attention_output", (*query_shape[:-1], *heads[1:])
        )
        self.weights_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy, name="weights_dropout")
        self.built = True

    def call(self, query, memory, mask=None, training=None):
        """Attention of `query` `(batch, queries, d_model)` over `memory`
        `(batch, keys, d_model)` (the query itself for self-attention, the
        encoder output for the encoder-decoder attention); `mask`
        broadcastable to `(batch, queries, keys)`.

        Returns:
            `(output (batch, queries, d_model), weights (batch, heads, queries, keys))`.
        """
        mixed, weights = scaled_dot_product_attention(
            heads_first(self.query_projection(query)),
            keys_transposed(self.key_projection(memory)),
            heads_first(self.value_projection(memory)),
            mask=None if mask is None else ops.expand_dims(mask, 1),  # the same for every head
            weights_dropout=self.weights_dropout,
            training=training,
        )
        return self.output_projection(heads_first(mixed)), weights

    def get_config(self):
        config = super().get_config()
        config.update({"num_heads": self.num_heads, "dropout": self.dropout})
        return config
