"""Greedy and beam search on hand-made Markov models, checked by enumeration."""

import itertools

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer import beam_search, greedy_search, length_penalty

PAD, UNK, START, END = 0, 1, 2, 3
VOCAB = 6


def markov_table(seed):
    """log P(next | last) for a random first-order model over VOCAB tokens."""
    logits = np.random.RandomState(seed).normal(0, 2, (VOCAB, VOCAB)).astype("float32")
    return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


def run(table, search, batch=1, max_length=4, buffer_length=8, **kwargs):
    table_tensor = ops.convert_to_tensor(table)

    def step(token_ids, index, cache):
        # The cache counts calls per row, so that reordering it is exercised.
        return ops.take(table_tensor, token_ids[:, 0], axis=0), cache + 1

    first = ops.convert_to_tensor(np.repeat(table[START][None], batch, 0))
    cache = ops.zeros((batch, 1), "int32")
    max_lengths = ops.convert_to_tensor(np.full((batch,), max_length, "int32"))
    special = dict(start_token_id=START, end_token_id=END, pad_token_id=PAD)
    result = search(step, first, cache, max_lengths, buffer_length, **kwargs, **special)
    if isinstance(result, tuple):
        return tuple(ops.convert_to_numpy(r) for r in result)
    return ops.convert_to_numpy(result)


def brute_force_best(table, max_length, alpha):
    """The highest log P(Y) / lp(Y) over every Y that ends with END by max_length."""
    allowed = [t for t in range(VOCAB) if t not in (PAD, START)]
    best, best_score = None, -np.inf
    for length in range(1, max_length + 1):
        for body in itertools.product([t for t in allowed if t != END], repeat=length - 1):
            sequence = (*body, END)
            log_p, last = 0.0, START
            for token in sequence:
                # The search renormalises nothing: PAD/START just become impossible.
                log_p += table[last, token]
                last = token
            score = log_p / ((5 + length) / 6) ** alpha
            if score > best_score:
                best, best_score = sequence, score
    return best, best_score


def tokens_of(row):
    row = list(row)
    assert row[0] == START
    return tuple(row[1 : row.index(END) + 1])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_wide_beam_finds_the_best_hypothesis(seed, alpha):
    table = markov_table(seed)
    tokens, scores = run(table, beam_search, max_length=4, beam_size=40, alpha=alpha)
    best, best_score = brute_force_best(table, 4, alpha)
    assert tokens_of(tokens[0]) == best
    assert scores[0] == pytest.approx(best_score, rel=1e-4)


@pytest.mark.parametrize("seed", range(4))
def test_steps_may_return_logits_the_search_normalises_them(seed):
    """A constant added to every score of a row (logits instead of log P)
    changes neither the translations nor beam search's log P / lp scores."""
    table = markov_table(seed)
    logits = table + np.random.RandomState(seed).normal(0, 5, (VOCAB, 1)).astype("float32")
    np.testing.assert_array_equal(run(logits, greedy_search, batch=2), run(table, greedy_search, batch=2))
    tokens, scores = run(logits, beam_search, max_length=4, beam_size=40, alpha=0.6)
    best, best_score = brute_force_best(table, 4, 0.6)
    assert tokens_of(tokens[0]) == best
    assert scores[0] == pytest.approx(best_score, rel=1e-4)


@pytest.mark.parametrize("seed", range(6))
def test_beam_size_one_without_length_penalty_equals_greedy(seed):
    table = markov_table(seed)
    greedy = run(table, greedy_search, batch=2, max_length=6, buffer_length=8)
    beam, _ = run(table, beam_search, batch=2, max_length=6, buffer_length=8, beam_size=1, alpha=0.0)
    np.testing.assert_array_equal(greedy, beam)


def test_output_stops_at_the_maximum_length_with_an_end_token():
    table = markov_table(0)
    table[:, END] = -50.0  # the model never wants to stop
    for search, kwargs in [(greedy_search, {}), (beam_search, dict(beam_size=3, alpha=0.6))]:
        out = run(table, search, max_length=3, buffer_length=10, **kwargs)
        row = (out[0] if isinstance(out, tuple) else out)[0]
        assert row[3] == END and (row[4:] == PAD).all()


@pytest.mark.parametrize("seed", range(4))
def test_a_short_buffer_finds_what_a_long_one_does_or_says_it_did_not(seed):
    table = markov_table(seed)
    for search, kwargs in [(greedy_search, {}), (beam_search, dict(beam_size=3, alpha=0.6))]:
        full = run(table, search, batch=2, max_length=7, buffer_length=8, **kwargs)
        expected = tokens_of((full[0] if isinstance(full, tuple) else full)[0])
        for buffer_length in range(3, 9):
            *found, complete = run(
                table,
                search,
                batch=2,
                max_length=7,
                buffer_length=buffer_length,
                with_completion=True,
                **kwargs,
            )
            if complete[0]:
                assert tokens_of(found[0][0]) == expected, (search.__name__, buffer_length)
        assert complete.all()  # a buffer of max_length + 1 always suffices


def test_a_buffer_too_short_is_reported():
    table = markov_table(0)
    table[:, END] = -50.0  # the model never wants to stop before it must
    for search, kwargs in [(greedy_search, {}), (beam_search, dict(beam_size=3, alpha=0.6))]:
        *_, complete = run(table, search, max_length=7, buffer_length=5, with_completion=True, **kwargs)
        assert not complete[0], search.__name__


def test_length_penalty_is_gnmt():
    assert float(length_penalty(1, 0.6)) == pytest.approx(1.0)
    assert float(length_penalty(7, 0.6)) == pytest.approx(2.0**0.6)
    assert float(length_penalty(7, 0.0)) == pytest.approx(1.0)


def test_first_argmax_is_argmax_with_ties_to_the_first_index():
    from keras_transformer.generation.search import first_argmax

    rng = np.random.default_rng(0)
    scores = rng.normal(size=(64, 300)).astype("float32")
    scores[::3, 7] = scores[::3, 200] = 50.0  # ties: the first index wins, as with argmax
    scores[5] = -np.inf
    expected = np.argmax(scores, axis=-1)
    np.testing.assert_array_equal(ops.convert_to_numpy(first_argmax(scores)), expected)


def compiled(function):
    """`function` as the search runs it: one XLA program on TensorFlow and JAX."""
    if keras.config.backend() == "jax":
        import jax

        return jax.jit(function)
    if keras.config.backend() == "tensorflow":
        import tensorflow as tf

        return tf.function(function, jit_compile=True, autograph=False)
    return function


@pytest.mark.parametrize("vocab", [1000, 1009])  # chunks of 8; padded (a prime)
def test_best_extensions_are_the_top_k_of_every_extension(vocab):
    from keras_transformer.generation.search import NEG_INF, best_extensions

    rng = np.random.default_rng(vocab)
    banned, end, count = (0, 2, 9), 3, 8  # token 9 is banned inside the second chunk
    # Rounded logits: many ties, which must still resolve to the lowest index.
    logits = np.round(rng.normal(size=(6, 4, vocab)) * 3).astype("float32")
    logits[1, :, -5:] = 20.0  # the best tokens in the last (padded) chunk
    logits[2] = 0.0  # all tied
    logits[4, :, 9] = 30.0  # a banned token is the largest logit
    alive = (rng.normal(size=(6, 4)) * 3).astype("float32")
    alive[3, 1:] = NEG_INF  # as at the first step: only beam 0 is live
    forced = np.array([False, True, False, False, False, False])  # a sentence at its length limit

    def every_extension(logits, alive, forced):
        log_probs = ops.log_softmax(logits, axis=-1)
        vocabulary = ops.arange(vocab)
        is_banned = (vocabulary == 0) | (vocabulary == 2) | (vocabulary == 9)
        is_banned = is_banned | (forced[:, None, None] & (vocabulary != end))
        scores = alive[:, :, None] + ops.where(is_banned, NEG_INF, log_probs)
        return ops.top_k(ops.reshape(scores, (6, 4 * vocab)), count)

    def in_chunks(logits, alive, forced):
        return best_extensions(logits, alive, count, banned, forced, end, chunk=8)

    arguments = [ops.convert_to_tensor(a) for a in (logits, alive, forced)]
    expected = [ops.convert_to_numpy(t) for t in compiled(every_extension)(*arguments)]
    found = [ops.convert_to_numpy(t) for t in compiled(in_chunks)(*arguments)]
    np.testing.assert_array_equal(found[0].view("int32"), expected[0].view("int32"))  # to the bit
    if keras.config.backend() != "torch":  # torch.topk does not promise an order among ties
        np.testing.assert_array_equal(found[1], expected[1])
    assert set(found[1][4] % vocab).isdisjoint(banned)
    np.testing.assert_array_equal(found[1][1][:4] % vocab, [end] * 4)  # each beam's end token first


def test_beam_search_finds_the_same_with_or_without_chunks(monkeypatch):
    """The search with `best_extensions` in chunks (its default on a large
    vocabulary) and over every extension: the same tokens and scores, to the bit."""
    from keras_transformer.generation import search

    vocab, batch, beam_size = 1500, 3, 4
    table = np.random.RandomState(0).normal(0, 3, (vocab, vocab)).astype("float32")
    table[:, END] -= 4.0  # translations of a few tokens, some ending before their limit

    def translate(table, first, max_lengths):
        def step(token_ids, index, cache):
            return ops.take(table, token_ids[:, 0], axis=0), cache

        special = dict(start_token_id=START, end_token_id=END, pad_token_id=PAD)
        cache = ops.zeros((batch, 1), "int32")
        return beam_search(step, first, cache, max_lengths, 10, beam_size, 0.6, **special)

    arguments = [ops.convert_to_tensor(a) for a in (table, table[[5, 6, 7]], np.array([4, 6, 9], "int32"))]
    chunked = [ops.convert_to_numpy(t) for t in compiled(translate)(*arguments)]
    in_chunks = search.best_extensions
    monkeypatch.setattr(search, "best_extensions", lambda *args: in_chunks(*args, chunk=vocab))
    whole = [ops.convert_to_numpy(t) for t in compiled(translate)(*arguments)]
    np.testing.assert_array_equal(chunked[0], whole[0])
    np.testing.assert_array_equal(chunked[1].view("int32"), whole[1].view("int32"))
    assert (chunked[0] == END).any(axis=1).all()
