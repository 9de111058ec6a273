"""torch's decoding path: caches written in place under `torch.inference_mode`
(`speed_paths.in_place_cache_writes`), the same tokens as the reference search
(Keras' copying `slice_update`)."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer import speed_paths
from keras_transformer.generation.decoding import compiled_search, resolve_jit_compile, search_step
from keras_transformer.generation.settings import SearchSettings
from keras_transformer.speed_paths.in_place_cache_writes import slice_update

pytestmark = pytest.mark.skipif(keras.config.backend() != "torch", reason="torch's decoding path")


def test_auto_stays_eager_on_torch():
    assert resolve_jit_compile("auto") is False


def test_slice_update_in_place_writes_into_its_input():
    import torch

    with torch.inference_mode():
        inputs = ops.zeros((2, 4))
        output = slice_update(inputs, (0, ops.convert_to_tensor(1)), ops.ones((2, 2)))
    assert output is inputs
    assert ops.convert_to_numpy(inputs).tolist() == [[0, 1, 1, 0], [0, 1, 1, 0]]
    inputs = ops.zeros((2, 4))
    copied = slice_update(inputs, (0, 3), ops.ones((2, 1)))  # outside inference mode: Keras' copy
    assert copied is not inputs and ops.convert_to_numpy(inputs)[0, 3] == 0


@pytest.mark.parametrize("beam_size", [None, 3])
def test_in_place_search_finds_the_reference_tokens(tiny_model, beam_size):
    import torch

    rng = np.random.default_rng(0)
    backbone = tiny_model.backbone
    ids = rng.integers(4, backbone.vocabulary_size, size=(5, 9)).astype("int32")
    mask = np.ones_like(ids, dtype=bool)
    mask[1, 6:] = mask[3, 4:] = False
    inputs = {
        "encoder_token_ids": ops.convert_to_tensor(np.where(mask, ids, backbone.pad_token_id)),
        "encoder_padding_mask": ops.convert_to_tensor(mask),
        "decoder_token_ids": ops.zeros((5, 14), "int32"),
    }
    settings = SearchSettings(beam_size=beam_size)
    everything_but = speed_paths.Runtime("torch", "cpu", paths_off=frozenset({"in_place_cache_writes"}))
    speed_paths.attach(tiny_model, everything_but)
    with torch.no_grad():
        reference = search_step(backbone, inputs, beam_size=beam_size, alpha=settings.alpha)
    found = compiled_search(tiny_model, resolve_jit_compile(), settings)(inputs)
    assert "in_place_cache_writes" in speed_paths.attached_paths(tiny_model)
    for name in ("decoder_token_ids", "decoder_padding_mask"):
        np.testing.assert_array_equal(ops.convert_to_numpy(found[name]), ops.convert_to_numpy(reference[name]))


def test_slice_update_traces_under_torch_compile():
    import torch

    def write(inputs, index, updates):
        return slice_update(inputs, (0, index, 0), updates)

    inputs, updates = torch.zeros((2, 5, 3)), torch.ones((2, 2, 3))
    compiled = torch.compile(write, fullgraph=True, dynamic=False)  # a graph break would raise
    expected = ops.convert_to_numpy(write(inputs, torch.tensor(2), updates))
    np.testing.assert_array_equal(ops.convert_to_numpy(compiled(inputs, torch.tensor(2), updates)), expected)
    assert expected[:, 2:4].all() and not expected[:, :2].any() and not expected[:, 4:].any()


@pytest.mark.parametrize("beam_size", [None, 2])
def test_jit_compile_puts_each_step_of_the_search_through_torch_compile_with_the_eager_tokens(tiny_model, beam_size):
    from torch._dynamo.utils import counters

    sentences = ["a dog runs", "two men sit on a bench"]
    eager = tiny_model.generate(sentences, beam_size=beam_size, max_length=10)
    tiny_model.compile(jit_compile=True)
    counters.clear()
    assert tiny_model.generate(sentences, beam_size=beam_size, max_length=10) == eager
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 1  # it did compile
    assert not counters["graph_break"], dict(counters["graph_break"])  # one graph a step, decoding and choosing
    assert tiny_model.generate(sentences[::-1], beam_size=beam_size, max_length=10) == eager[::-1]
    assert counters["stats"]["unique_graphs"] == graphs  # the same shape: nothing compiled again
