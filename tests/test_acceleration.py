"""The search's backend- and CPU-specific ways (its rows, a step's logits) give the same results."""

import threading

import keras
import numpy as np
import pytest
from keras import ops

import keras_transformer as kt
from helpers import PAIRS, TINY_CONFIG
from keras_transformer.generation import acceleration


def test_logits_by_parts_are_the_logits_of_the_whole_vocabulary():
    rng = np.random.default_rng(0)
    hidden = rng.normal(size=(130, 1, 16)).astype("float32")
    embeddings = rng.normal(size=(1001, 16)).astype("float32")  # parts of 250 and 251 tokens
    np.testing.assert_allclose(
        ops.convert_to_numpy(acceleration.logits_by_parts(hidden, embeddings, parts=4)),
        hidden @ embeddings.T,
        rtol=1e-5,
        atol=1e-4,
    )


def test_a_search_steps_logits_are_the_backbones_logits_for_any_rows(monkeypatch):
    # 128 rows and 16,000 tokens: on JAX the step computes them by parts.
    backbone = kt.TransformerBackbone(vocabulary_size=16_000, use_logits_bias=True, **TINY_CONFIG)
    backbone.logits_bias.bias.assign(np.linspace(-1, 1, 16_000).astype("float32"))
    logits_of = acceleration.step_logits(backbone)
    by_parts = []
    original = acceleration.logits_by_parts
    monkeypatch.setattr(acceleration, "logits_by_parts", lambda *args: by_parts.append(len(args[0])) or original(*args))
    for rows in (8, 128):
        hidden = np.random.default_rng(rows).normal(size=(rows, 1, 16)).astype("float32")
        np.testing.assert_allclose(
            ops.convert_to_numpy(logits_of(hidden)),
            ops.convert_to_numpy(backbone.logits(hidden)),
            rtol=1e-5,
            atol=1e-5,
        )
    assert by_parts == ([128] if keras.config.backend() == "jax" else [])


def test_a_quantized_or_small_model_takes_the_backbones_logits():
    small = kt.TransformerBackbone(vocabulary_size=100, **TINY_CONFIG)
    # On torch, a float32 model's steps read E^T from a transposed copy.
    assert (acceleration.step_logits(small) == small.logits) == (keras.config.backend() != "torch")
    large = kt.TransformerBackbone(vocabulary_size=16_000, **TINY_CONFIG)
    large.quantize("int8")
    assert acceleration.step_logits(large) == large.logits


@pytest.mark.skipif(keras.config.backend() != "torch", reason="the transposed copy of E is torch's")
def test_the_transposed_embeddings_are_kept_and_made_again_after_the_weights_change():
    backbone = kt.TransformerBackbone(vocabulary_size=100, **TINY_CONFIG)
    embeddings = backbone.decoder_token_embedding.embeddings
    first = acceleration.torch_transposed(embeddings)
    assert first.is_contiguous() and acceleration.torch_transposed(embeddings) is first
    np.testing.assert_array_equal(ops.convert_to_numpy(first), ops.convert_to_numpy(embeddings).T)
    embeddings.assign(ops.convert_to_numpy(embeddings) + 1.0)  # as training or loading weights would
    again = acceleration.torch_transposed(embeddings)
    assert again is not first
    np.testing.assert_array_equal(ops.convert_to_numpy(again), ops.convert_to_numpy(embeddings).T)


def _recording_searches(model, monkeypatch) -> list:
    """Records the thread and rows of each search `model` runs."""
    searches = []
    search_function = model._search_function

    def recording(settings, with_completion=False, num_hypotheses=1):
        function = search_function(settings, with_completion, num_hypotheses)

        def run(inputs):
            searches.append((threading.current_thread().name, int(inputs["encoder_token_ids"].shape[0])))
            return function(inputs)

        return run

    monkeypatch.setattr(model, "_search_function", recording)
    return searches


def test_under_xla_one_sentence_is_greedily_searched_as_two_rows(tiny_model, monkeypatch):
    searches = _recording_searches(tiny_model, monkeypatch)
    sentences = ["a dog runs", "two men sit"]  # each of fewer tokens than the tiny model takes: one segment
    alone = [tiny_model.generate(sentence, beam_size=None, max_length=12) for sentence in sentences]
    assert [rows for _, rows in searches] == [1 if keras.config.backend() == "torch" else 2] * 2
    assert alone == tiny_model.generate(sentences, beam_size=None, max_length=12)
    searches.clear()
    tiny_model.generate(sentences[0], beam_size=2, max_length=12)
    assert [rows for _, rows in searches] == [1]


def test_a_small_model_is_searched_in_parts_at_once_under_xla_on_a_cpu_with_the_cores(monkeypatch):
    monkeypatch.setattr(acceleration, "_cores", lambda: 2)
    monkeypatch.setattr(acceleration, "computes_on_xla_cpu", lambda: True)
    at_once = acceleration.searches_at_once
    assert at_once(32, 2_000_000, greedy=True, under_xla=True) == 2
    assert at_once(4, 2_000_000, greedy=True, under_xla=True) == 2  # two rows a part
    assert at_once(3, 2_000_000, greedy=True, under_xla=True) == 1
    assert at_once(2, 2_000_000, greedy=False, under_xla=True) == 2
    assert at_once(32, 60_000_000, greedy=True, under_xla=True) == 1  # base size: weights streamed twice
    assert at_once(32, 2_000_000, greedy=True, under_xla=False) == 1  # torch, or eager operators
    monkeypatch.setattr(acceleration, "_cores", lambda: 1)
    assert at_once(32, 2_000_000, greedy=True, under_xla=True) == 1


def test_only_tensorflow_and_jax_search_in_parts():
    assert acceleration.computes_on_xla_cpu() == (keras.config.backend() in ("tensorflow", "jax"))


@pytest.mark.skipif(keras.config.backend() == "torch", reason="searches run in parts under XLA")
@pytest.mark.parametrize("beam_size", [None, 2])
def test_a_batch_searched_in_two_parts_at_once_translates_as_one_search(trained_model, beam_size, monkeypatch):
    monkeypatch.setattr(acceleration, "_cores", lambda: 2)
    sources = [source for source, _ in PAIRS][:5]  # in parts: 3 rows each, the last sentence twice
    searches = _recording_searches(trained_model, monkeypatch)
    with monkeypatch.context() as whole:
        whole.setattr(acceleration, "SMALL_MODEL_PARAMETERS", 0)
        one_search = trained_model.generate(sources, beam_size=beam_size, max_length=16)
    assert [rows for _, rows in searches] == [5]
    searches.clear()
    for _ in range(2):  # the first call of a shape compiles it, one part after the other
        assert trained_model.generate(sources, beam_size=beam_size, max_length=16) == one_search
    assert [rows for _, rows in searches] == [3] * 4
    assert sum(name.startswith("search part") for name, _ in searches) == 1


def test_a_searched_batch_keeps_its_sentences_in_order_whole_or_in_parts():
    halves = acceleration.search_in_parts(lambda part: {"x": np.asarray(part["x"]) + 1}, {"x": np.arange(6)}, 2)
    assert halves["x"].tolist() == [1, 2, 3, 4, 5, 6]
