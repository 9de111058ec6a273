"""`chunked_top_k`: beam search's best extensions found from chunks of the vocabulary.

Scoring all beams x vocabulary extensions and taking a top-k of them would
be most of a small model's traced search on a CPU. The best scores lie in
the `count` chunks of about `chunk` consecutive tokens of one beam whose
best scores are the highest; and log-softmax and adding the beam's score
keep the order of a beam's logits, in floating point too (each step rounds
monotonically). So a chunk's best score is that of its largest logit: only
the chunks' maxima, each beam's log-sum-exp and the scores of the chosen
chunks are computed, the same values to the bit as
`generation.search.best_extensions` where `(x - max) - log(sum(exp(x - max)))`
rounds as `ops.log_softmax` does (traced for XLA).

Example:
>>> import numpy as np
>>> logits = np.linspace(0, 1, 2 * 64, dtype="float32").reshape(1, 2, 64)  # 2 beams of 64 tokens
>>> alive = np.log(np.array([[0.6, 0.4]], "float32"))
>>> values, ids = best_extensions_in_chunks(logits, alive, 2, [0], np.array([False]), end_token_id=1, chunk=8)
>>> np.asarray(ids).tolist()  # beam 0's tokens 63 and 62: its score is the higher
[[63, 62]]
"""

import numpy as np

from keras_transformer.generation import search
from keras_transformer.speed_paths import eager_ops as ops
from keras_transformer.speed_paths.registry import SpeedPath, register

PATH = register(
    SpeedPath(
        "chunked_top_k",
        "a traced search's top-k over every beam x vocabulary extension costs more than over a few chunks",
        lambda runtime: runtime.compiles_with_xla,
    )
)


def best_extensions_in_chunks(logits, alive_scores, count: int, banned_ids, forced, end_token_id: int, chunk: int = 32):
    """`generation.search.best_extensions`, the same values and indices, from
    chunks of about `chunk` tokens; a vocabulary too small for chunks to pay
    takes the plain way."""
    logits, alive_scores, forced = (ops.convert_to_tensor(x) for x in (logits, alive_scores, forced))
    batch, beams, vocab = ops.shape(logits)
    if beams * vocab <= 4 * count * chunk:
        return search.best_extensions(logits, alive_scores, count, banned_ids, forced, end_token_id)
    banned_ids = sorted(set(banned_ids))
    chunk = chunk_length(vocab, chunk)
    per_beam = -(-vocab // chunk)
    padding = per_beam * chunk - vocab
    padded = ops.pad(logits, ((0, 0), (0, 0), (0, padding)), constant_values=float("-inf")) if padding else logits
    chunks = ops.reshape(padded, (batch, beams, per_beam, chunk))
    chunk_ids = np.arange(per_beam)
    chunk_max = ops.max(chunks, axis=-1)
    # A chunk holding a banned token: its best allowed logit, and NEG_INF
    # (the banned tokens' score) as a floor of its best score.
    banned_chunks = sorted({token // chunk for token in banned_ids})
    for j in banned_chunks:
        allowed = ~np.isin(np.arange(j * chunk, (j + 1) * chunk), banned_ids)
        best_allowed = ops.max(ops.where(allowed, chunks[:, :, j, :], float("-inf")), axis=-1)
        chunk_max = ops.where(chunk_ids == j, best_allowed[:, :, None], chunk_max)
    # log_softmax(x) = (x - max) - log(sum(exp(x - max))) in these steps, as
    # the backends compute it. A maximum is exact whichever way it is taken:
    # that of the chunks' and the banned tokens' maxima needs no other pass
    # over the logits.
    banned_max = ops.max(ops.take(logits, banned_ids, axis=-1), axis=-1, keepdims=True)
    row_max = ops.maximum(ops.max(chunk_max, axis=-1, keepdims=True), banned_max)
    log_total = ops.log(ops.sum(ops.exp(logits - row_max), axis=-1, keepdims=True))
    best = (chunk_max - row_max) - log_total
    best = ops.where(np.isin(chunk_ids, banned_chunks), ops.maximum(best, search.NEG_INF), best)
    # A sentence forced to end: its end token's score, NEG_INF elsewhere.
    end_log_prob = (logits[:, :, end_token_id : end_token_id + 1] - row_max) - log_total
    forced_best = ops.where(
        chunk_ids == end_token_id // chunk, ops.maximum(end_log_prob, search.NEG_INF), search.NEG_INF
    )
    best = ops.where(forced[:, None, None], forced_best, best)
    _, best_chunks = ops.top_k(ops.reshape(alive_scores[:, :, None] + best, (batch, beams * per_beam)), count)
    # In index order, so that the final top-k still resolves ties to the lowest index.
    best_chunks = ops.sort(best_chunks, axis=-1)
    beam = best_chunks // per_beam
    tokens = (best_chunks % per_beam)[:, :, None] * chunk + ops.arange(chunk, dtype=best_chunks.dtype)
    all_chunks = ops.reshape(chunks, (batch, beams * per_beam, chunk))
    candidates = ops.take_along_axis(all_chunks, best_chunks[:, :, None], axis=1)

    def of_beam(x):
        return ops.take_along_axis(ops.reshape(x, (batch, beams)), beam, axis=1)[:, :, None]

    log_probs = (candidates - of_beam(row_max)) - of_beam(log_total)
    banned = forced[:, None, None] & (tokens != end_token_id)
    for token in banned_ids:
        banned = banned | (tokens == token)
    scores = of_beam(alive_scores) + ops.where(banned, search.NEG_INF, log_probs)
    if padding:
        scores = ops.where(tokens < vocab, scores, float("-inf"))
    values, position = ops.top_k(ops.reshape(scores, (batch, count * chunk)), count)
    ids = ops.reshape(beam[:, :, None] * vocab + tokens, (batch, count * chunk))
    return values, ops.take_along_axis(ids, position, axis=1)


def chunk_length(length: int, preferred: int) -> int:
    """The divisor of `length` closest to `preferred` (by ratio), from half to 8 times it, or
    `preferred` if none: logits the chunks do not divide are padded, which XLA writes out as a copy.

    Example:
    >>> chunk_length(8000, 32), chunk_length(58101, 32), chunk_length(8009, 32)
    (32, 107, 32)
    """
    divisors = [c for c in range(preferred // 2, 8 * preferred + 1) if length % c == 0]
    return min(divisors, key=lambda c: max(c / preferred, preferred / c), default=preferred)
