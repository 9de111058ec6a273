"""Scaled dot-product attention (section 3.2.1), the one place it is computed.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V        (equation 1)

`scaled_dot_product_attention` is equation 1 with its masking; the layer
`multi_head_attention.MultiHeadAttention` is section 3.2.2 around it.
Training and encoding (the blocks' `call`), cached decoding
(`cached_attention.attend_cached`) and the attention pictures
(`generation.attention_maps`, which asks the blocks for their weights) all
go through `scaled_dot_product_attention`.

Tensors are laid out heads first, `(batch, heads, length, d_k)`, and the
keys come already transposed, `(batch, heads, d_k, length)`: the decoding
cache stores them so (see `cached_attention`), which makes `Q K^T` a plain
batched matrix product.

Example:
>>> import numpy as np
>>> from keras import ops
>>> query = np.ones((1, 1, 2, 4), "float32")            # (batch, heads, queries, d_k)
>>> keys = np.ones((1, 1, 4, 3), "float32")             # K^T: (batch, heads, d_k, keys)
>>> values = np.arange(6, dtype="float32").reshape(1, 1, 3, 2)
>>> mask = np.array([True, True, False])                # the third key is padding
>>> output, weights = scaled_dot_product_attention(query, keys, values, mask)
>>> ops.convert_to_numpy(weights)[0, 0, 0].round(2).tolist()   # equal scores: equal weights
[0.5, 0.5, 0.0]
>>> ops.convert_to_numpy(output)[0, 0, 0].tolist()             # the mean of the first two values
[1.0, 2.0]
"""

import math

from keras import ops

# What a masked score becomes before the softmax: exp(-1e9 - max) is 0 in float32.
MASKED_SCORE = -1e9


def scaled_dot_product_attention(query, keys_transposed, values, mask=None, weights_dropout=None, training=None):
    """Equation 1: `(softmax(Q K^T / sqrt(d_k)) V, the softmax weights)`.

    Args:
        query: Q, `(..., queries, d_k)`.
        keys_transposed: K^T, `(..., d_k, keys)`.
        values: V, `(..., keys, d_v)`.
        mask: boolean (or 0/1), broadcastable to `(..., queries, keys)`:
            which keys each query may attend to; `None` for all. A masked key
            gets weight 0 (a query with every key masked averages them all).
        weights_dropout: a dropout layer for the weights (no dropout there
            in section 5.4, so rate 0 unless asked for), or `None`.
        training: passed to `weights_dropout`.

    Returns:
        `(output (..., queries, d_v), weights (..., queries, keys))`; the
        weights are those before dropout.
    """
    scores = ops.matmul(query, keys_transposed) / math.sqrt(ops.shape(query)[-1])
    # Masked and normalised in float32, whatever the compute precision: a
    # bfloat16 softmax over long rows loses the small weights.
    scores = ops.cast(scores, "float32")
    if mask is not None:
        scores = ops.where(ops.cast(mask, "bool"), scores, MASKED_SCORE)
    weights = ops.cast(ops.softmax(scores, axis=-1), values.dtype)
    dropped = weights if weights_dropout is None else weights_dropout(weights, training=training)
    return ops.matmul(dropped, values), weights


def key_padding_mask(padding_mask):
    """`(batch, keys)` 1 for a token, 0 for padding -> boolean `(batch, 1,
    keys)`: every query may attend to every key that is not padding."""
    return ops.expand_dims(ops.cast(padding_mask, "bool"), 1)


def causal_mask(length):
    """Boolean `(1, length, length)`: position i may attend to positions <= i
    only (section 3.2.3, "preserve the auto-regressive property")."""
    positions = ops.arange(length)
    return ops.expand_dims(ops.expand_dims(positions, 1) >= ops.expand_dims(positions, 0), 0)


def heads_first(x):
    """`(batch, length, heads, head_dim)` <-> `(batch, heads, length, head_dim)`."""
    return ops.transpose(x, (0, 2, 1, 3))


def keys_transposed(x):
    """`(batch, length, heads, head_dim)` -> K^T `(batch, heads, head_dim, length)`."""
    return ops.transpose(x, (0, 2, 3, 1))
