"""Greedy and beam search on hand-made Markov models, checked by enumeration."""

import itertools

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
