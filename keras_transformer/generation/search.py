"""Greedy and beam search with the paper's length penalty (section 6.1).

KerasHub's `BeamSampler` keeps no pool of finished hypotheses and has no length
penalty, both of which section 6.1 needs, so the search is written here, in
`keras.ops` only: one `while_loop` over fixed-size buffers, one traced graph.

Both take a `step_fn(token_ids, index, cache) -> (logits, cache)` scoring the
next token of every row given the token at `index` (`(rows, 1)`) and a cache
it updates; beam search also takes how to reorder the cache's rows. Greedy
search needs only the logits' order (no log-softmax); beam search normalises.
Their kernels (`SearchKernels`) are plain `keras.ops` unless given others
(`keras_transformer.speed_paths`).
"""

import dataclasses
from collections.abc import Callable

import keras

from keras_transformer.speed_paths import eager_ops as ops
from keras_transformer.speed_paths.in_place_cache_writes import slice_update

NEG_INF = -1e9


def length_penalty(length, alpha: float):
    """GNMT's lp(Y) = ((5 + |Y|) / 6)^alpha; beam scores are log P(Y) / lp(Y)."""
    return ops.power((5.0 + ops.cast(length, "float32")) / 6.0, alpha)


def _forced_end(scores, force, end_token_id):
    """Where `force` is true, all tokens but the end token get -inf (which keeps its score, ranked fairly)."""
    not_end = ops.arange(ops.shape(scores)[-1]) != end_token_id
    force = ops.reshape(force, ops.shape(force) + (1,) * (len(ops.shape(scores)) - len(ops.shape(force))))
    return ops.where(ops.logical_and(force, not_end), NEG_INF, scores)


def _never_generated(scores, banned_ids):
    """The start and padding tokens (`banned_ids`) are inputs only: never emit them."""
    vocab = ops.arange(ops.shape(scores)[-1])
    banned = vocab == banned_ids[0]
    for token in banned_ids[1:]:
        banned = banned | (vocab == token)
    return ops.where(banned, NEG_INF, scores)


def first_argmax(x):
    """`argmax(x, axis=-1)` as int32 (the first index of the maximum).

    Example:
    >>> import numpy as np
    >>> np.asarray(first_argmax(np.array([[0.0, 2.0, 2.0], [5.0, 1.0, 0.0]], "float32"))).tolist()
    [1, 0]
    """
    return ops.cast(ops.argmax(x, axis=-1), "int32")


def best_extensions(logits, alive_scores, count: int, banned_ids, forced, end_token_id: int):
    """The `count` best one-token extensions of the beams of every sentence.

    An extension's score is its beam's score plus the token's log-softmax
    over `logits` `(batch, beams, vocab)`, or NEG_INF for the `banned_ids`
    and, in the sentences `forced` `(batch,)` to end, for every token but
    the end token. Returns `ops.top_k` of those scores flattened to
    `(batch, beams * vocab)`: the values, and indices `beam * vocab + token`
    that resolve ties to the lowest (as `ops.top_k` does on TensorFlow and
    JAX; `torch.topk` promises no order among ties).

    Example:
    >>> import numpy as np
    >>> logits = np.log(np.array([[[0.1, 0.2, 0.3, 0.4], [0.4, 0.35, 0.15, 0.1]]], "float32"))
    >>> alive = np.log(np.array([[0.6, 0.4]], "float32"))
    >>> values, ids = best_extensions(logits, alive, 3, [0], np.array([False]), end_token_id=1)
    >>> np.asarray(ids).tolist()  # beam 0 tokens 3 and 2, beam 1 token 1 (token 0 is banned)
    [[3, 2, 5]]
    >>> np.exp(np.asarray(values, "float64")).round(2).tolist()
    [[0.24, 0.18, 0.14]]
    """
    logits, alive_scores = ops.convert_to_tensor(logits), ops.convert_to_tensor(alive_scores)
    batch, beams, vocab = ops.shape(logits)
    log_probs = ops.log_softmax(logits, axis=-1)
    log_probs = _forced_end(_never_generated(log_probs, sorted(set(banned_ids))), forced, end_token_id)
    return ops.top_k(ops.reshape(alive_scores[:, :, None] + log_probs, (batch, beams * vocab)), count)


def backbone_logits(backbone) -> Callable:
    """A search step's logits as the backbone computes them (`TransformerBackbone.logits`)."""
    return backbone.logits


@dataclasses.dataclass(frozen=True)
class SearchKernels:
    """The parts of a search that may be computed another way, each plain by
    default (`keras_transformer.speed_paths.search_kernels` picks faster ones).

    Attributes:
        step_logits: `backbone -> (hidden -> logits)`, called inside the
            traced search: how its steps project onto the vocabulary.
        argmax: greedy search's choice, as `first_argmax`.
        best_extensions: beam search's candidates, as `best_extensions`.
        compile_body: compiles the loop's body, one step of the search; `None`: as is.
    """

    step_logits: Callable = backbone_logits
    argmax: Callable = first_argmax
    best_extensions: Callable = best_extensions
    compile_body: Callable | None = None


def _limit_lengths(max_lengths, buffer_length: int, with_completion: bool):
    """The end token is forced at `max_lengths`, and at the buffer's end unless the caller checks completion."""
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
    compile_body: Callable | None = None,
    argmax: Callable = first_argmax,
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
        with_completion, compile_body: see `beam_search`.
        argmax: picks a row's token from its logits `(rows, vocab)`, the first
            largest (`first_argmax`; `SearchKernels`).

    Returns:
        `(batch, buffer_length)` int32 tokens: start token, the translation, the
        end token, then padding; with `with_completion`, also `complete`.
    """
    batch = ops.shape(first_logits)[0]
    max_lengths = _limit_lengths(max_lengths, buffer_length, with_completion)
    tokens = ops.full((batch, buffer_length), pad_token_id, dtype="int32")
    tokens = slice_update(tokens, (0, 0), ops.full((batch, 1), start_token_id, "int32"))

    def choose(logits, index, done):
        # The most probable token is the largest logit (no softmax needed); a forced ending is the end token.
        token = argmax(_never_generated(logits, (start_token_id, pad_token_id)))
        return ops.where(done, pad_token_id, ops.where(index >= max_lengths, end_token_id, token))

    done = ops.zeros((batch,), dtype="bool")
    token = choose(first_logits, 1, done)
    tokens = slice_update(tokens, (0, 1), token[:, None])
    done = token == end_token_id

    def cond(index, tokens, done, cache):
        return ops.logical_not(ops.all(done))

    def body(index, tokens, done, cache):
        # A gather: `torch.compile` traces it, and would stop at a slice that starts at a tensor.
        logits, cache = step_fn(ops.take(tokens, ops.reshape(index, (1,)), axis=1), index, cache)
        token = choose(logits, index + 1, done)
        tokens = slice_update(tokens, (0, index + 1), token[:, None])
        return index + 1, tokens, ops.logical_or(done, token == end_token_id), cache

    _, tokens, done, _ = ops.while_loop(
        cond,
        compile_body(body) if compile_body else body,
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
    num_hypotheses: int = 1,
    reorder_cache: Callable | None = None,
    expand_cache: Callable | None = None,
    compile_body: Callable | None = None,
    best_extensions: Callable = best_extensions,
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
        num_hypotheses: the finished hypotheses returned, best first (at most `beam_size`).
        reorder_cache: `(cache, rows, length) -> cache` with the rows of
            `cache` in the order `rows`; only the first `length` positions
            need to be right (the positions decoded so far). By default,
            every tensor of the cache is reordered whole.
        expand_cache: `(cache, beam_size) -> cache` for `batch * beam_size`
            rows that all continue the start token; by default every tensor
            of the cache is repeated along its first axis.
        compile_body: compiles the loop's body, one step of the search
            (on torch, `torch.compile`: `speed_paths.compiled_torch_step`).
        best_extensions: the best extensions of every beam, as
            `best_extensions` computes them (`SearchKernels`).

    Returns:
        `(tokens, scores)`: the best finished hypothesis of each sentence,
        `(batch, buffer_length)` int32 laid out as `greedy_search`'s, and its
        length-normalised log-probability `(batch,)`; with
        `with_completion`, `(tokens, scores, complete)`. With n = `num_hypotheses`
        > 1, tokens `(batch, n, buffer_length)` and scores `(batch, n)`, found
        until the n-th cannot improve; a score of `NEG_INF` marks one not finished.
    """
    if not 1 <= num_hypotheses <= beam_size:
        raise ValueError(f"num_hypotheses must be between 1 and the beam size {beam_size}; got {num_hypotheses}.")
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
        # Normalised over every token, as the model's P(Y) is; 2k candidates
        # always hold k that do not end here.
        top_scores, top_ids = best_extensions(
            logits, alive_scores, 2 * k, (start_token_id, pad_token_id), index >= max_lengths, end_token_id
        )
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
        """False for a sentence once its n-th best finished score beats any a live
        beam could still reach (log-probs only fall; lp grows with length)."""
        best_reachable = alive_scores[:, 0] / length_penalty(max_lengths, alpha)
        return (finished_scores[:, num_hypotheses - 1] < best_reachable) & (alive_scores[:, 0] > NEG_INF / 2)

    state = advance(1, first_logits, alive_tokens, alive_scores, finished_tokens, finished_scores)
    alive_tokens, alive_scores, finished_tokens, finished_scores, origin = state
    # After the first step all beams descend from beam 0: the repeated cache is right.

    def cond(index, alive_tokens, alive_scores, finished_tokens, finished_scores, cache):
        return ops.any(can_improve(alive_scores, finished_scores))

    def body(index, alive_tokens, alive_scores, finished_tokens, finished_scores, cache):
        rows = ops.reshape(alive_tokens, (batch * k, buffer_length))
        logits, cache = step_fn(ops.take(rows, ops.reshape(index, (1,)), axis=1), index, cache)  # as greedy's
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
        compile_body(body) if compile_body else body,
        (ops.convert_to_tensor(1, "int32"), alive_tokens, alive_scores, finished_tokens, finished_scores, cache),
        maximum_iterations=buffer_length - 2,
    )
    n = num_hypotheses  # one hypothesis keeps no axis of hypotheses
    best = (finished_tokens[:, :n], finished_scores[:, :n]) if n > 1 else (finished_tokens[:, 0], finished_scores[:, 0])
    if with_completion:
        return (*best, ops.logical_not(can_improve(alive_scores, finished_scores)))
    return best
