"""Multi-head attention over cached keys and values, one decoding step at a time.

Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V (equation 1, section 3.2.1),
with the layer's own W^Q, W^K, W^V and W^O, where K and V of earlier
positions come from a cache instead of being recomputed.

KerasHub's `CachedMultiHeadAttention` does this with keys and values stacked
in one `(batch, 2, length, heads, head_dim)` tensor that it slices apart and
stacks again at every step, and Keras' attention reads keys laid out
`(batch, length, heads, head_dim)`. Compiled by XLA, the stack copies every
layer's whole cache at every step and the layout makes it transpose the keys
again, so a step's cost grew with the output buffer far faster than the
attention itself. Here keys and values are separate tensors laid out
`(batch, heads, length, head_dim)`, each written in place at the step's
position (`ops.slice_update`), and equation 1 is two batched matrix products.
Measured on this CPU (24 greedy steps of the tiny benchmark model, batch 32,
one thread, TensorFlow with XLA, machine quiet): 0.073 s with a 25-token
buffer and 0.14 s with a 257-token one, against 0.105 s and 0.64 s through
KerasHub's layer (`benchmarks/README.md`, "Per-step cost").
"""

import math

from keras import ops

from keras_transformer import library_internals


def cache_keys_values(attention, sequence) -> tuple:
    """`(sequence W^K, sequence W^V)`, each `(batch, heads, length, head_dim)`:
    the cross-attention cache of an encoder output, computed once per sentence."""
    projections = library_internals.attention_projections(attention)
    return _heads_first(projections["key"](sequence)), _heads_first(projections["value"](sequence))


def _heads_first(x):
    """`(batch, length, heads, head_dim)` <-> `(batch, heads, length, head_dim)`."""
    return ops.transpose(x, (0, 2, 1, 3))


# Beam search reorders the caches in blocks of this many positions.
REORDER_BLOCK = 16


def empty_keys_values(batch_size: int, length: int, num_heads: int, head_dim: int, dtype) -> tuple:
    """Zero keys and values for at least `length` positions (rounded up to
    whole blocks for `reorder_rows`; positions not decoded yet are masked)."""
    blocks = -(-length // REORDER_BLOCK)
    shape = (batch_size, num_heads, blocks * REORDER_BLOCK, head_dim)
    return ops.zeros(shape, dtype=dtype), ops.zeros(shape, dtype=dtype)


def reorder_rows(tensors: tuple, rows, length) -> tuple:
    """`ops.take(t, rows, axis=0)` for each cache tensor of `tensors`, on its
    first `length` positions only (the later ones hold nothing yet).

    Beam search reorders the caches at every step to follow the surviving
    beams; reordering the whole buffer made a step's cost grow with the
    buffer instead of with the positions decoded. Block by block, each
    block is gathered and written back in place.
    """
    shape = ops.shape(tensors[0])
    rows_count, heads, buffer, head_dim = shape
    # Blocks need a static shape made by `empty_keys_values` (an exported
    # SavedModel's batch and buffer are dynamic): else reorder it whole.
    if not all(isinstance(d, int) for d in shape) or buffer % REORDER_BLOCK:
        return tuple(ops.take(t, rows, axis=0) for t in tensors)
    block_shape = (rows_count, heads, REORDER_BLOCK, head_dim)

    def reorder_block(block, tensors):
        start = (0, 0, block * REORDER_BLOCK, 0)
        return tuple(ops.slice_update(t, start, ops.take(ops.slice(t, start, block_shape), rows, axis=0)) for t in tensors)

    blocks = ops.minimum((length + REORDER_BLOCK - 1) // REORDER_BLOCK, buffer // REORDER_BLOCK)
    return ops.fori_loop(0, blocks, reorder_block, tuple(tensors))


def attend_cached(attention, query_input, keys, values, mask, update_index=None):
    """Multi-head attention of `query_input` `(rows, 1, d_model)` over cached
    `keys` and `values` `(batch, heads, length, head_dim)`.

    `rows` is `batch`, or for cross-attention in beam search `batch * beams`
    (the beams of a sentence next to each other): the beams of a sentence
    then read its one copy of the encoder's keys and values as if they were
    `beams` query positions (cross-attention has no causal mask), instead of
    each beam reading its own copy: a quarter of the cache reads at beam 4.

    Args:
        attention: a built Keras `MultiHeadAttention` (its projections).
        mask: boolean, broadcastable to `(batch, heads, 1, length)`: which
            cached positions may be attended to.
        update_index: self-attention: the position of `query_input`, whose key
            and value are written into the caches first; `None` for
            cross-attention (the caches are the encoder output's).

    Returns:
        `(output (rows, 1, d_model), keys, values)`.
    """
    projections = library_internals.attention_projections(attention)
    if update_index is not None:
        start = (0, 0, update_index, 0)
        keys = ops.slice_update(keys, start, _heads_first(projections["key"](query_input)))
        values = ops.slice_update(values, start, _heads_first(projections["value"](query_input)))
    rows_shape = ops.shape(query_input)
    if update_index is None:
        # (batch * beams, 1, d) -> (batch, beams, d): beams as query positions
        # (a no-op outside beam search).
        query_input = ops.reshape(query_input, (ops.shape(keys)[0], -1, rows_shape[-1]))
    query = _heads_first(projections["query"](query_input))
    scores = ops.einsum("bnth,bnsh->bnts", query, keys) / math.sqrt(ops.shape(query)[-1])
    scores = ops.where(mask, ops.cast(scores, "float32"), -1e9)
    weights = ops.cast(ops.softmax(scores, axis=-1), values.dtype)
    mixed = ops.einsum("bnts,bnsh->bnth", weights, values)
    output = projections["output"](_heads_first(mixed))
    return ops.reshape(output, rows_shape), keys, values
