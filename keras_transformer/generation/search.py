"""Greedy and beam search with the paper's length penalty (section 6.1).

KerasHub's `BeamSampler` keeps no pool of finished hypotheses and has no length
penalty, both of which section 6.1 needs, so the search is written here, in
`keras.ops` only: one `while_loop` over fixed-size buffers, so that it traces
to a single graph (XLA on TensorFlow, `jax.jit` on JAX) with bounded shapes.

Both functions take a `step_fn(token_ids, index, cache) -> (logits, cache)`
that scores the next token of every row given the token at `index` (shape
`(rows, 1)`) and a cache of keys/values that it updates; beam search also
takes how to reorder that cache's rows. The scores are logits, log P up to a
constant per row: greedy search needs only their order (so it spends no
log-softmax over the vocabulary at every step), and beam search normalises
them itself.
"""

from collections.abc import Callable

import keras
from keras import ops

NEG_INF = -1e9


def length_penalty(length, alpha: float):
    """GNMT's lp(Y) = ((5 + |Y|) / 6)^alpha; beam scores are log P(Y) / lp(Y)."""
    return ops.power((5.0 + ops.cast(length, "float32")) / 6.0, alpha)


def _forced_end(scores, force, end_token_id):
    """Where `force` is true, every token but the end token gets -inf (the end
    token keeps its own score, so forced endings are ranked fairly)."""
    vocab = ops.shape(scores)[-1]
    not_end = ops.arange(vocab) != end_token_id
    force = ops.reshape(force, ops.shape(force) + (1,) * (len(ops.shape(scores)) - len(ops.shape(force))))
    return ops.where(ops.logical_and(force, not_end), NEG_INF, scores)


def _never_generated(scores, start_token_id, pad_token_id):
    """The start and padding tokens are inputs only: never emit them."""
    vocab = ops.arange(ops.shape(scores)[-1])
    return ops.where((vocab == pad_token_id) | (vocab == start_token_id), NEG_INF, scores)


def first_argmax(x):
    """`argmax(x, axis=-1)` as int32 (the first index of the maximum).

    Written as a max and a min over the indices holding it, because XLA
    computes `argmax` on a CPU as one index-tracking reduction, several
    times slower than these two plain reductions, and a noticeable part of a
    small model's greedy step.

    Example:
    >>> import numpy as np
    >>> np.asarray(first_argmax(np.array([[0.0, 2.0, 2.0], [5.0, 1.0, 0.0]], "float32"))).tolist()
    [1, 0]
    """
    vocab = ops.shape(x)[-1]
    is_max = x == ops.max(x, axis=-1, keepdims=True)
    return ops.min(ops.where(is_max, ops.arange(vocab, dtype="int32"), vocab), axis=-1)


def _chunk_length(length: int, preferred: int) -> int:
    """The divisor of `length` closest to `preferred`, within a factor of 2
    of it, or `preferred` if there is none. Scores of a length the chunks
    do not divide are padded, and XLA writes the padded copy out (4 beams x
    58,101 Opus-MT tokens divide into chunks of 107, not of 128)."""
    divisors = [c for c in range(preferred // 2, 2 * preferred + 1) if length % c == 0]
    return min(divisors, key=lambda c: abs(c - preferred), default=preferred)


def top_k(x, k: int, chunk: int = 128):
    """`ops.top_k(x, k)` for a 2-D `x`: the same values and indices (ties
    to the lower index where `ops.top_k` resolves them so, as on TensorFlow
    and JAX; `torch.topk` promises no order among ties).

    Beam search picks the best candidates of every sentence among beams x
    vocabulary scores, and XLA's top-k over that many scores is slow on a
    CPU, a sizeable part of a decoding step. The k best values lie
    in the k chunks of about `chunk` values whose maxima are the highest, so
    one vectorised pass finds those chunks and only they are searched.

    Example:
    >>> import numpy as np
    >>> x = (np.arange(1000) * 37 % 1000).astype("float32")[None]  # 0..999, shuffled
    >>> values, indices = top_k(x, 3, chunk=16)
    >>> np.asarray(values).tolist(), np.asarray(indices).tolist()
    ([[999.0, 998.0, 997.0]], [[27, 54, 81]])
    """
    length = ops.shape(x)[-1]
    if length <= 4 * k * chunk:
        return ops.top_k(x, k)
    chunk = _chunk_length(length, chunk)
    padding = -length % chunk
    if padding:
        x = ops.pad(x, ((0, 0), (0, padding)), constant_values=float("-inf"))
    chunks = ops.reshape(x, (-1, (length + padding) // chunk, chunk))
    _, best_chunks = ops.top_k(ops.max(chunks, axis=-1), k)
    # In index order, so that the final top-k still resolves ties to the
    # lowest index.
    best_chunks = ops.sort(best_chunks, axis=-1)
    candidates = ops.take_along_axis(chunks, best_chunks[:, :, None], axis=1)
    values, position = ops.top_k(ops.reshape(candidates, (-1, k * chunk)), k)
    indices = best_chunks[:, :, None] * chunk + ops.arange(chunk, dtype=best_chunks.dtype)[None, None, :]
    return values, ops.take_along_axis(ops.reshape(indices, (-1, k * chunk)), position, axis=1)


def _limit_lengths(max_lengths, buffer_length: int, with_completion: bool):
    """The end token is forced at `max_lengths`, or at the buffer's end
    unless the caller checks completion and searches again if needed."""
    max_lengths = ops.cast(max_lengths, "int32")
    return max_lengths if with_completion else ops.minimum(max_lengths, buffer_length - 1)


def _reorder_whole(cache, rows, length):
    return keras.tree.map_structure(lambda c: ops.take(c, rows, axis=0), cache)


def _repeat_rows(cache, beams):
    return keras.tree.map_structure(lambda c: ops.repeat(c, beams, axis=0), cache)


def _gather_rows(x, indices):
    """`x[b, indices[b, j]]` for every batch row b: picks beams per sentence."""
    expanded = ops.reshape(indices, ops.shape(indices) + (1,) * (len(ops.shape(x)) - 2))
    return ops.take_along_axis(x, expanded, axis=1)


def greedy_search(
    step_fn: Callable,
    first_logits,
    cache,
    max_lengths,
    buffer_length: int,
    start_token_id: int,
    end_token_id: int,
    pad_token_id: int,
    *,
    with_completion: bool = False,
):
    """Picks the most probable token at every step.

    Args:
        step_fn: see the module docstring.
        first_logits: `(batch, vocab)`, the scores of the first token.
        cache: the state of `step_fn` after the start token.
        max_lengths: `(batch,)` int, the most tokens to generate for each
            sentence, end token included (the end token is forced there).
        buffer_length: static size of the output, start token included.
        start_token_id, end_token_id, pad_token_id: special token ids.
        with_completion: see `beam_search`.

    Returns:
        `(batch, buffer_length)` int32 tokens: start token, the translation, the
        end token, then padding; with `with_completion`, also `complete`.
    """
    batch = ops.shape(first_logits)[0]
    max_lengths = _limit_lengths(max_lengths, buffer_length, with_completion)
    tokens = ops.full((batch, buffer_length), pad_token_id, dtype="int32")
    tokens = ops.slice_update(tokens, (0, 0), ops.full((batch, 1), start_token_id, "int32"))

    def choose(logits, index, done):
        # The most probable token is the largest logit: no softmax needed.
        logits = _never_generated(logits, start_token_id, pad_token_id)
        logits = _forced_end(logits, index >= max_lengths, end_token_id)
        token = first_argmax(logits)
        return ops.where(done, pad_token_id, token)

    done = ops.zeros((batch,), dtype="bool")
    token = choose(first_logits, 1, done)
    tokens = ops.slice_update(tokens, (0, 1), token[:, None])
    done = token == end_token_id

    def cond(index, tokens, done, cache):
        return ops.logical_not(ops.all(done))

    def body(index, tokens, done, cache):
        logits, cache = step_fn(ops.slice(tokens, (0, index), (batch, 1)), index, cache)
        token = choose(logits, index + 1, done)
        tokens = ops.slice_update(tokens, (0, index + 1), token[:, None])
        return index + 1, tokens, ops.logical_or(done, token == end_token_id), cache

    _, tokens, done, _ = ops.while_loop(
        cond,
        body,
        (ops.convert_to_tensor(1, "int32"), tokens, done, cache),
        maximum_iterations=buffer_length - 2,
    )
    return (tokens, done) if with_completion else tokens


def beam_search(
    step_fn: Callable,
    first_logits,
    cache,
    max_lengths,
    buffer_length: int,
    beam_size: int,
    alpha: float,
    start_token_id: int,
    end_token_id: int,
    pad_token_id: int,
    *,
    with_completion: bool = False,
    reorder_cache: Callable | None = None,
    expand_cache: Callable | None = None,
):
    """Beam search as in section 6.1: keeps `beam_size` live hypotheses and a
    pool of the `beam_size` best finished ones, scored by log P(Y) / lp(Y),
    and stops as soon as no live hypothesis can beat the best finished one.

    Args:
        step_fn: see the module docstring; it is called on `batch * beam_size`
            rows, beams of one sentence next to each other.
        first_logits: `(batch, vocab)`, the scores of the first token.
        cache: the state of `step_fn` after the start token, for `batch` rows;
            `expand_cache` makes it one for every beam.
        max_lengths: `(batch,)` int, the most tokens to generate for each
            sentence, end token included; the end token is forced there, so
            every sentence ends with finished hypotheses.
        buffer_length: static size of the output, start token included.
        beam_size: live hypotheses per sentence.
        alpha: length penalty exponent (0.6 in the paper; 0 for none).
        start_token_id, end_token_id, pad_token_id: special token ids.
        with_completion: let `max_lengths` exceed the buffer, and also return
            `complete` `(batch,)`: which sentences the search finished within
            the buffer. Their results are those of a buffer of
            `max(max_lengths) + 1`; the others need a longer buffer. (A
            shorter buffer is faster: every step reads all of it.)
        reorder_cache: `(cache, rows, length) -> cache` with the rows of
            `cache` in the order `rows`; only the first `length` positions
            need to be right (the positions decoded so far). By default,
            every tensor of the cache is reordered whole.
        expand_cache: `(cache, beam_size) -> cache` for `batch * beam_size`
            rows that all continue the start token; by default every tensor
            of the cache is repeated along its first axis.

    Returns:
        `(tokens, scores)`: the best finished hypothesis of each sentence,
        `(batch, buffer_length)` int32 laid out as `greedy_search`'s, and its
        length-normalised log-probability `(batch,)`; with
        `with_completion`, `(tokens, scores, complete)`.
    """
    batch, vocab = ops.shape(first_logits)[0], ops.shape(first_logits)[1]
    k = beam_size
    reorder_cache = reorder_cache or _reorder_whole
    expand_cache = expand_cache or _repeat_rows
    max_lengths = _limit_lengths(max_lengths, buffer_length, with_completion)
    positions = ops.arange(buffer_length)[None, None, :]

    # Every beam starts as the start token; only beam 0 is live at first, so
    # that the first step does not pick the same token k times.
    alive_tokens = ops.full((batch, k, buffer_length), pad_token_id, dtype="int32")
    alive_tokens = ops.where(positions == 0, start_token_id, alive_tokens)
    alive_scores = ops.tile(ops.convert_to_tensor([[0.0] + [NEG_INF] * (k - 1)], "float32"), (batch, 1))
    finished_tokens = alive_tokens
    finished_scores = ops.full((batch, k), NEG_INF, dtype="float32")
    cache = expand_cache(cache, k)
    first_logits = ops.repeat(first_logits[:, None, :], k, axis=1)

    def advance(index, logits, alive_tokens, alive_scores, finished_tokens, finished_scores):
        """Extends every live beam by every token; returns the new state and
        which old beam each new live beam came from."""
        # Normalised over every token, as the model's P(Y) is.
        log_probs = ops.log_softmax(logits, axis=-1)
        log_probs = _never_generated(log_probs, start_token_id, pad_token_id)
        log_probs = _forced_end(log_probs, index >= max_lengths, end_token_id)
        scores = ops.reshape(alive_scores[:, :, None] + log_probs, (batch, k * vocab))
        # 2k candidates always hold k that do not end here.
        top_scores, top_ids = top_k(scores, 2 * k)
        origin, token = top_ids // vocab, ops.cast(top_ids % vocab, "int32")
        tokens = _gather_rows(alive_tokens, origin)
        tokens = ops.where(positions == index, token[:, :, None], tokens)
        # As in fairseq, only an ending among the k best candidates is
        # finished: one ranked lower would not have survived in a beam of k.
        # (tensor2tensor finishes all 2k; then beam 1 is no longer greedy.)
        ends = (token == end_token_id) & (ops.arange(2 * k)[None, :] < k)

        # Finished pool: the best k of the old pool and the hypotheses ending now.
        ended_scores = ops.where(ends, top_scores / length_penalty(index, alpha), NEG_INF)
        pool_scores = ops.concatenate([finished_scores, ended_scores], axis=1)
        pool_tokens = ops.concatenate([finished_tokens, tokens], axis=1)
        finished_scores, best = ops.top_k(pool_scores, k)
        finished_tokens = _gather_rows(pool_tokens, best)

        # Live beams: the best k that do not end here.
        alive_scores, best = ops.top_k(ops.where(token == end_token_id, NEG_INF, top_scores), k)
        alive_tokens = _gather_rows(tokens, best)
        origin = ops.take_along_axis(origin, best, axis=1)
        return alive_tokens, alive_scores, finished_tokens, finished_scores, origin

    def can_improve(alive_scores, finished_scores):
        """False for a sentence once its best finished score beats any score a
        live beam could still reach (log-probs only fall; lp grows with length)."""
        best_reachable = alive_scores[:, 0] / length_penalty(max_lengths, alpha)
        return (finished_scores[:, 0] < best_reachable) & (alive_scores[:, 0] > NEG_INF / 2)

    state = advance(1, first_logits, alive_tokens, alive_scores, finished_tokens, finished_scores)
    alive_tokens, alive_scores, finished_tokens, finished_scores, origin = state
    # After the first step all beams descend from beam 0: the repeated cache is right.

    def cond(index, alive_tokens, alive_scores, finished_tokens, finished_scores, cache):
        return ops.any(can_improve(alive_scores, finished_scores))

    def body(index, alive_tokens, alive_scores, finished_tokens, finished_scores, cache):
        rows = ops.reshape(alive_tokens, (batch * k, buffer_length))
        logits, cache = step_fn(ops.slice(rows, (0, index), (batch * k, 1)), index, cache)
        logits = ops.reshape(ops.cast(logits, "float32"), (batch, k, vocab))
        alive_tokens, alive_scores, finished_tokens, finished_scores, origin = advance(
            index + 1, logits, alive_tokens, alive_scores, finished_tokens, finished_scores
        )
        # Reorder the self-attention cache to follow the surviving beams.
        flat_origin = ops.reshape(origin + ops.arange(batch)[:, None] * k, (-1,))
        cache = reorder_cache(cache, flat_origin, index + 1)
        return index + 1, alive_tokens, alive_scores, finished_tokens, finished_scores, cache

    _, _, alive_scores, finished_tokens, finished_scores, _ = ops.while_loop(
        cond,
        body,
        (ops.convert_to_tensor(1, "int32"), alive_tokens, alive_scores, finished_tokens, finished_scores, cache),
        maximum_iterations=buffer_length - 2,
    )
    best = finished_tokens[:, 0, :], finished_scores[:, 0]
    if with_completion:
        return (*best, ops.logical_not(can_improve(alive_scores, finished_scores)))
    return best
