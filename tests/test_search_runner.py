"""A model's searches run with the rows the runtime runs fastest (one sentence
as two rows, a small model's batch as two halves at once), and translate as
one plain search."""

import dataclasses
import threading

import keras
import numpy as np
import pytest

from helpers import PAIRS
from keras_transformer.generation import search_runner
from keras_transformer.speed_paths import Runtime, describe_runtime
from keras_transformer.speed_paths.two_halves import SMALL_MODEL_PARAMETERS, parts_to_search, search_in_parts

UNDER_XLA = keras.config.backend() in ("tensorflow", "jax")


@pytest.fixture
def searching_on(monkeypatch):
    """Runs a model's searches on another runtime: `searching_on(model, runtime)`;
    the model's searches are forgotten before and after."""
    models = []

    def switch(model, runtime: Runtime) -> None:
        monkeypatch.setattr(search_runner, "describe_runtime", lambda: runtime)
        model.forget_compiled_searches()
        models.append(model)

    yield switch
    monkeypatch.undo()
    for model in models:
        model.forget_compiled_searches()


@pytest.fixture
def searches(monkeypatch) -> list:
    """`(thread name, rows)` of every compiled search the runners call."""
    recorded, compiled_search = [], search_runner.compiled_search

    def recording(*args, **kwargs):
        function = compiled_search(*args, **kwargs)

        def run(inputs):
            recorded.append((threading.current_thread().name, int(inputs["encoder_token_ids"].shape[0])))
            return function(inputs)

        return run

    monkeypatch.setattr(search_runner, "compiled_search", recording)
    return recorded


def on_two_cores(**changes) -> Runtime:
    return dataclasses.replace(describe_runtime(), cores=2, **changes)


def test_under_xla_one_sentence_is_greedily_searched_as_two_rows(tiny_model, searches, searching_on):
    searching_on(tiny_model, on_two_cores())
    sentences = ["a dog runs", "two men sit"]  # each of fewer tokens than the tiny model takes: one segment
    alone = [tiny_model.generate(sentence, beam_size=None, max_length=12) for sentence in sentences]
    assert [rows for _, rows in searches] == [2 if UNDER_XLA else 1] * 2
    assert alone == tiny_model.generate(sentences, beam_size=None, max_length=12)
    searches.clear()
    tiny_model.generate(sentences[0], beam_size=2, max_length=12)
    assert [rows for _, rows in searches] == [1]


def test_a_small_model_is_searched_in_parts_on_a_cpu_of_two_cores_under_xla():
    runtime = Runtime("jax", "cpu", cores=2)
    assert parts_to_search(32, 2_000_000, smallest_part=2, runtime=runtime) == 2
    assert parts_to_search(4, 2_000_000, smallest_part=2, runtime=runtime) == 2  # two rows a part
    assert parts_to_search(3, 2_000_000, smallest_part=2, runtime=runtime) == 1
    assert parts_to_search(2, 2_000_000, smallest_part=1, runtime=runtime) == 2  # beam search
    assert parts_to_search(32, 60_000_000, smallest_part=2, runtime=runtime) == 1  # base size: weights read twice
    assert parts_to_search(32, SMALL_MODEL_PARAMETERS, smallest_part=2, runtime=runtime) == 2
    for elsewhere in (Runtime("torch", "cpu", cores=2), Runtime("jax", "gpu", cores=2), Runtime("jax", "cpu")):
        assert parts_to_search(32, 2_000_000, smallest_part=2, runtime=elsewhere) == 1


@pytest.mark.skipif(not UNDER_XLA, reason="searches run in parts under XLA")
@pytest.mark.parametrize("beam_size", [None, 2])
def test_a_batch_searched_in_two_parts_at_once_translates_as_one_search(
    trained_model, beam_size, searches, searching_on
):
    sources = [source for source, _ in PAIRS][:5]  # in parts: 3 rows each, the last sentence twice
    searching_on(trained_model, on_two_cores(paths_off=frozenset({"two_halves"})))
    one_search = trained_model.generate(sources, beam_size=beam_size, max_length=16)
    assert [rows for _, rows in searches] == [5]
    searches.clear()
    searching_on(trained_model, on_two_cores())
    for _ in range(2):  # the first call of a shape compiles it, one part after the other
        assert trained_model.generate(sources, beam_size=beam_size, max_length=16) == one_search
    assert [rows for _, rows in searches] == [3] * 4
    assert sum(name.startswith("search part") for name, _ in searches) == 1


def test_a_searched_batch_keeps_its_sentences_in_order_whole_or_in_parts():
    halves = search_in_parts(lambda part: {"x": np.asarray(part["x"]) + 1}, {"x": np.arange(6)}, 2)
    assert halves["x"].tolist() == [1, 2, 3, 4, 5, 6]
