"""A model loaded under `torch.inference_mode()`, as many torch servers load
one, translates as one loaded normally: its weights are inference tensors,
which count no in-place writes (`speed_paths.derived_tensors`)."""

import keras
import pytest

import keras_transformer as kt
from helpers import PAIRS, make_model

pytestmark = pytest.mark.skipif(keras.config.backend() != "torch", reason="torch's inference mode")

SENTENCES = [source for source, _ in PAIRS[:2]]
# Short greedy outputs: a random model's run to the buffer's end.
SHORT_GREEDY = kt.SearchSettings(beam_size=None, max_extra_length=4)


@pytest.mark.parametrize("precision", ["float32", "int8"])
def test_model_loaded_under_inference_mode_translates_as_one_loaded_normally(tokenizer, precision):
    import torch

    keras.utils.set_random_seed(7)
    model = make_model(tokenizer)
    weights = model.get_weights()
    with torch.inference_mode():
        loaded = make_model(tokenizer)
        loaded.set_weights(weights)
        if precision == "int8":
            loaded.quantize("int8")
    assert loaded.backbone.weights[0].value.is_inference()
    if precision == "int8":
        model.quantize("int8")
    assert loaded.translate(SENTENCES, search=SHORT_GREEDY) == model.translate(SENTENCES, search=SHORT_GREEDY)
