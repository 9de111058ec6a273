"""A model set to `run_eagerly` searches eagerly: one row per sentence, in
one piece (what speeds up XLA's compiled searches slows eager operators), and
its searches are kept apart from the compiled ones."""

import dataclasses

import keras
import numpy as np
import pytest

from keras_transformer.generation import search_runner
from keras_transformer.speed_paths import describe_runtime

SENTENCES = ["a dog runs", "two dogs play", "a cat sleeps .", "a man walks ."]
# Under XLA on a CPU, a compiled search of the tiny model runs in two parts at once.
COMPILED_PARTS = 2 if keras.config.backend() in ("tensorflow", "jax") else 1


@pytest.fixture
def searches(monkeypatch):
    """`(function, rows, parts)` of each search the models run, on a CPU of two cores."""
    two_cores = dataclasses.replace(describe_runtime(), cores=2)
    monkeypatch.setattr(search_runner, "describe_runtime", lambda: two_cores)
    recorded, search_in_parts = [], search_runner.search_in_parts

    def recording(function, inputs, parts, at_once=True):
        recorded.append((function, len(inputs["encoder_token_ids"]), parts))
        return search_in_parts(function, inputs, parts, at_once)

    monkeypatch.setattr(search_runner, "search_in_parts", recording)
    return recorded


def test_an_eager_greedy_search_runs_one_row_a_sentence_in_one_piece(tiny_model, searches):
    tiny_model.run_eagerly = True
    tiny_model.generate(SENTENCES[0], beam_size=None, max_length=12)
    tiny_model.generate(SENTENCES, beam_size=None, max_length=12)
    assert [(rows, parts) for _, rows, parts in searches] == [(1, 1), (4, 1)]


def test_eager_and_compiled_searches_are_kept_apart(tiny_model, searches):
    tiny_model.run_eagerly = True
    eager = tiny_model.generate(SENTENCES, beam_size=None, max_length=12)
    tiny_model.run_eagerly = False
    for _ in range(2):  # the second call runs the parts at once
        compiled = tiny_model.generate(SENTENCES, beam_size=None, max_length=12)
    tiny_model.run_eagerly = True
    tiny_model.generate(SENTENCES, beam_size=None, max_length=12)
    (eager_function, _, _), (compiled_function, _, parts), _, (eager_again, _, _) = searches
    assert compiled_function is not eager_function and eager_again is eager_function
    assert parts == COMPILED_PARTS
    np.testing.assert_array_equal(np.asarray(compiled), np.asarray(eager))
