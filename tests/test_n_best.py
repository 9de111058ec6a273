"""The beam's n best (`generate(num_hypotheses=n)`, CTranslate2's `num_hypotheses`),
which the server's `alternatives` are made of, on the backend under test."""

import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.generation.settings import SearchSettings

SOURCES = ["a dog runs .", "two cats play .", "a woman sings ."]


def test_the_first_hypothesis_is_the_translation_and_the_others_differ(trained_model):
    # One output buffer (max_length), so that each search compiles once.
    best = trained_model.generate(SOURCES, max_length=24)
    n_best = trained_model.generate(SOURCES, max_length=24, num_hypotheses=4)
    assert [hypotheses[0] for hypotheses in n_best] == best
    for hypotheses in n_best:
        # The search goes on until four hypotheses are finished, each a different token sequence.
        assert len(hypotheses) == 4 and len(set(hypotheses)) > 1


def test_token_ids_come_with_which_hypotheses_were_found(trained_model):
    packed = trained_model.preprocessor.pack_sources(
        [trained_model.preprocessor.tokenizer(text).tolist() for text in SOURCES[:2]]
    )
    without_text = kt.Transformer(backbone=trained_model.backbone, preprocessor=None)
    plain = without_text.generate(dict(packed), max_length=24)
    outputs = without_text.generate(dict(packed), max_length=24, num_hypotheses=3)
    token_ids = np.asarray(outputs["decoder_token_ids"])
    assert token_ids.shape[:2] == (2, 3) and np.asarray(outputs["hypothesis_found"]).all()
    np.testing.assert_array_equal(token_ids[:, 0], plain["decoder_token_ids"])


def test_greedy_search_and_too_many_hypotheses_are_refused(trained_model):
    with pytest.raises(ValueError, match="needs beam search"):
        trained_model.generate(SOURCES, search=SearchSettings(beam_size=None), num_hypotheses=2)
    with pytest.raises(ValueError, match="between 1 and the beam size 4"):
        trained_model.generate(SOURCES, num_hypotheses=5)
