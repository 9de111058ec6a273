"""Multi-head attention over cached keys and values, one decoding step at a time.

Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V (equation 1, section 3.2.1,
computed by `attention.scaled_dot_product_attention` as in training), with
the layer's own W^Q, W^K, W^V and W^O, where K and V of earlier positions
come from a cache instead of being recomputed.

Keys and values are separate tensors, values `(batch, heads, length,
head_dim)` and keys `(batch, heads, head_dim, length)` (transposed for `Q
K^T`), each updated at the step's position (`ops.slice_update`), so that a
step transposes no cached keys (unlike KerasHub's `CachedMultiHeadAttention`).
"""

from keras import ops

from keras_transformer.layers.attention import heads_first, keys_transposed, scaled_dot_product_attention


def cache_keys_values(attention, sequence) -> tuple:
    """`(sequence W^K, sequence W^V)`, keys `(batch, heads, head_dim, length)`
    and values `(batch, heads, length, head_dim)`: the cross-attention cache
    of an encoder output, computed once per sentence."""
    return keys_transposed(attention.key_projection(sequence)), heads_first(attention.value_projection(sequence))


def empty_keys_values(sentences: int, length: int, num_heads: int, head_dim: int, dtype) -> tuple:
    """Zero self-attention keys `(sentences, heads, head_dim, length)` and
    values `(sentences, heads, length, head_dim)` for `length` positions of
    one hypothesis per sentence; `expand_to_beams` makes room for more."""
    keys = ops.zeros((sentences, num_heads, head_dim, length), dtype=dtype)
    return keys, ops.zeros((sentences, num_heads, length, head_dim), dtype=dtype)


# Beam search: the beams of a sentence share its self-attention cache. Beam j
# writes the keys and values of position t into slot t * beams + j, and they
# never move. Each hypothesis keeps a row of `slot_owners` `(sentences *
# beams, length)`: for each position it has decoded, which beam's slot holds
# it (-1 where nothing is decoded yet). When beam search keeps a hypothesis
# grown from another beam, only that small table is reordered, not every
# layer's keys and values. The
# attention reads all the slots of its sentence and masks those that are not
# in the hypothesis' history, which also lets the beams of a sentence read
# its cache once, as query positions (as the cross-attention does).


def empty_slot_owners(rows: int, length: int):
    """A table for `rows` hypotheses with nothing decoded yet."""
    return ops.full((rows, length), -1, dtype="int32")


def record_position(slot_owners, index, beams: int):
    """Each hypothesis writes position `index` into its own beam's slot."""
    rows = ops.shape(slot_owners)[0]
    own_beam = ops.arange(rows, dtype="int32") % beams
    return ops.slice_update(slot_owners, (0, index), own_beam[:, None])


def visible_slots(slot_owners, beams: int):
    """Boolean `(sentences, 1, beams, length * beams)`: which slots of its
    sentence's cache hold the history of each hypothesis (as `attend_cached`
    lays out the scores of a sentence's beams)."""
    length = ops.shape(slot_owners)[1]
    owners = ops.reshape(slot_owners, (-1, beams, length, 1))
    is_owner = owners == ops.arange(beams, dtype="int32")[None, None, None, :]
    return ops.reshape(is_owner, (-1, 1, beams, length * beams))


def expand_to_beams(layer_caches: tuple, slot_owners, beams: int) -> tuple:
    """The `(keys, values)` of each layer and the `slot_owners` of one
    hypothesis per sentence, as those of `beams` hypotheses per sentence that
    all share its history (the start of beam search): every position's slot
    is repeated once per beam."""
    layer_caches = tuple(
        (ops.repeat(keys, beams, axis=3), ops.repeat(values, beams, axis=2)) for keys, values in layer_caches
    )
    return layer_caches, ops.repeat(slot_owners, beams, axis=0)


def attend_cached(attention, query_input, keys, values, mask, beams, update_index=None):
    """Multi-head attention of `query_input` `(rows, 1, d_model)` over cached
    `keys` `(sentences, heads, head_dim, slots)` and `values` `(sentences,
    heads, slots, head_dim)`.

    `rows` is `sentences * beams` (the beams of a sentence next to each
    other; one beam outside beam search): the beams of a sentence read its
    cache once, as `beams` query positions, instead of each beam reading its
    own copy.

    Args:
        attention: a built `MultiHeadAttention` (its projections).
        mask: boolean, broadcastable to `(sentences, heads, beams, slots)`:
            which cached slots each query may attend to.
        update_index: self-attention: the position of `query_input`; each
            beam's key and value are written into slot `update_index * beams
            + beam` first (see `visible_slots`). `None` for cross-attention
            (the caches are the encoder output's).

    Returns:
        `(output (rows, 1, d_model), keys, values)`.
    """
    rows_shape = ops.shape(query_input)
    # (sentences * beams, 1, d) -> (sentences, beams, d): beams as query positions.
    query_input = ops.reshape(query_input, (ops.shape(keys)[0], beams, rows_shape[-1]))
    if update_index is not None:
        slot = update_index * beams
        keys = ops.slice_update(keys, (0, 0, 0, slot), keys_transposed(attention.key_projection(query_input)))
        values = ops.slice_update(values, (0, 0, slot, 0), heads_first(attention.value_projection(query_input)))
    mixed, _ = scaled_dot_product_attention(heads_first(attention.query_projection(query_input)), keys, values, mask)
    output = attention.output_projection(heads_first(mixed))
    return ops.reshape(output, rows_shape), keys, values
