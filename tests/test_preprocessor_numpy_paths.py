"""The preprocessor's NumPy paths (`pack_sources`, `generate_postprocess` of
arrays) against KerasHub's TensorFlow ones, for this package's tokenizer and
a Marian checkpoint's (which packs sources without a start token)."""

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.utils.text_libraries import tf

ROWS = [[67, 1143, 5], [9], [], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52]]


@pytest.fixture(scope="module", params=["transformer", "marian"])
def model(request, tmp_path_factory):
    if request.param == "transformer":
        return kt.Transformer.from_preset("multi30k_en_de")
    pytest.importorskip("transformers", reason="the Marian fixture is written by transformers")
    from marian_fixtures import write_multilingual_repo

    folder = write_multilingual_repo(tmp_path_factory.mktemp("marian") / "gmw")["folder"]
    return kt.Transformer.from_preset(str(folder))


@pytest.fixture
def preprocessor(model):
    return model.preprocessor


@pytest.mark.parametrize("rows", [ROWS, ROWS[:1], [[5] * 30]], ids=["mixed", "one", "wide"])
def test_sources_are_packed_as_keras_hubs_packer_packs_them(preprocessor, rows):
    packed = preprocessor.pack_sources(rows)
    width = packed["encoder_token_ids"].shape[1]
    token_ids, padding_mask = preprocessor.pack_source_tensor(tf.ragged.constant(rows, "int32", ragged_rank=1), width)
    np.testing.assert_array_equal(packed["encoder_token_ids"], keras.ops.convert_to_numpy(token_ids))
    np.testing.assert_array_equal(packed["encoder_padding_mask"], keras.ops.convert_to_numpy(padding_mask))
    assert packed["encoder_token_ids"].dtype == np.int32 and packed["encoder_padding_mask"].dtype == bool


def test_no_sources_pack_to_an_empty_batch(preprocessor):
    packed = preprocessor.pack_sources([])
    assert packed["encoder_token_ids"].shape == (0, 16) and packed["encoder_padding_mask"].shape == (0, 16)


def test_arrays_are_detokenized_as_keras_hub_detokenizes_tensors(model):
    backbone = model.backbone
    # A search's outputs: the start token, a translation, the end token, then
    # padding, under which anything may lie.
    token_ids = np.full((4, 10), 7, "int32")
    token_ids[:, 0] = backbone.start_token_id
    lengths = [3, 1, 6, 2]
    for row, length in enumerate(lengths):
        token_ids[row, 1 : 1 + length] = np.arange(5, 5 + length)
        token_ids[row, 1 + length] = backbone.end_token_id
    padding_mask = np.arange(10)[None, :] < np.array(lengths)[:, None] + 2
    token_ids[1, 2 + 1] = backbone.end_token_id  # a special token under the mask's end too
    arrays = {"decoder_token_ids": token_ids, "decoder_padding_mask": padding_mask}
    tensors = {name: tf.constant(value) for name, value in arrays.items()}
    assert model.preprocessor.generate_postprocess(arrays) == model.preprocessor.generate_postprocess(tensors)
    assert model.preprocessor.generate_postprocess({name: value[:0] for name, value in arrays.items()}) == []
