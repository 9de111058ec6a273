"""Issue 54's motivating case, offline: one server with a Hindi to English and an
English to German Opus-MT model, written by `transformers` and loaded by
`hf://` handles from a Hub cache. With `source: "auto"`, a complaint in
Devanagari goes through hi->en and an English one through en->de.

Both checkpoints have random weights: the test checks where each text
goes (each answer is its model's own translation), not how well it is translated.
"""

import pytest

pytest.importorskip("starlette", reason="the server's tests need the serve extra: pip install '.[serve]'")
pytest.importorskip("transformers")
pytest.importorskip("torch")

from starlette.testclient import TestClient  # noqa: E402

from keras_transformer.generation.settings import SearchSettings  # noqa: E402
from keras_transformer.server import ServiceSettings, TranslationService, app_of, load_served_models  # noqa: E402
from marian_fixtures import (  # noqa: E402
    HINDI_SENTENCES,
    SOURCE_SENTENCES,
    TARGET_SENTENCES,
    publish,
    write_untrained_repo,
)

HINDI = "hf://Helsinki-NLP/opus-mt-hi-en"
ENGLISH_GERMAN = "hf://Helsinki-NLP/opus-mt-en-de"
HINDI_COMPLAINT = "मेरा ऑर्डर अभी तक नहीं आया है। कृपया मेरी मदद करें।"
ENGLISH_COMPLAINT = "My order has still not arrived. Please help me."
# Random weights write to the length limit: a short one keeps the test fast.
SEARCH = SearchSettings(beam_size=None, max_extra_length=8)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """`{handle: Transformer}` and the server's client, both models loaded offline from a Hub cache."""
    from huggingface_hub import constants

    root = tmp_path_factory.mktemp("hindi")
    hindi = write_untrained_repo(root / "hi-en", HINDI_SENTENCES, SOURCE_SENTENCES, "hi", "en")
    publish(hindi["folder"], root / "hub", HINDI.removeprefix("hf://"))
    german = write_untrained_repo(root / "en-de", SOURCE_SENTENCES, TARGET_SENTENCES, "en", "de", seed=1)
    publish(german["folder"], root / "hub", ENGLISH_GERMAN.removeprefix("hf://"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setattr(constants, "HF_HUB_CACHE", str(root / "hub"))
        patch.setattr(constants, "HF_HUB_OFFLINE", True)
        # Sources up to 128 positions: the Devanagari complaint, whole, as `translate` takes it.
        served = load_served_models([HINDI, ENGLISH_GERMAN], search=SEARCH, max_batch_size=2, max_source_bucket=128)
    # A deadline that leaves room for compiling each search at its first request.
    service = TranslationService(served, ServiceSettings(timeout_s=600))
    with TestClient(app_of(service, warm_up=False)) as client:
        yield {model.name: model.engine.model for model in served}, client


def test_the_server_serves_hindi_into_english_and_english_into_german(models):
    _, client = models
    assert client.get("/languages").json() == [
        {"code": "hi", "name": "Hindi", "targets": ["en"]},
        {"code": "en", "name": "English", "targets": ["de"]},
        {"code": "de", "name": "German", "targets": []},
    ]
    assert client.post("/detect", json={"q": HINDI_COMPLAINT}).json()[0] == {"confidence": 100.0, "language": "hi"}


def test_a_devanagari_complaint_goes_through_hi_en_and_an_english_one_through_en_de(models):
    loaded, client = models
    hindi = client.post("/translate", json={"q": HINDI_COMPLAINT, "source": "auto", "target": "en"}).json()
    assert hindi["detectedLanguage"]["language"] == "hi"
    assert hindi["translatedText"] == loaded[HINDI].translate(HINDI_COMPLAINT, search=SEARCH)
    english = client.post("/translate", json={"q": ENGLISH_COMPLAINT, "source": "auto", "target": "de"}).json()
    assert english["detectedLanguage"]["language"] == "en"
    assert english["translatedText"] == loaded[ENGLISH_GERMAN].translate(ENGLISH_COMPLAINT, search=SEARCH)
    # Into English, one list: the Hindi text is translated, the English one is already English.
    both = client.post(
        "/translate", json={"q": [HINDI_COMPLAINT, ENGLISH_COMPLAINT], "source": "auto", "target": "en"}
    ).json()
    assert both["translatedText"] == [hindi["translatedText"], ENGLISH_COMPLAINT]
    assert [detected["language"] for detected in both["detectedLanguage"]] == ["hi", "en"]


def test_hindi_into_german_is_refused_with_what_the_server_does(models):
    _, client = models
    answer = client.post("/translate", json={"q": HINDI_COMPLAINT, "source": "auto", "target": "de"})
    assert answer.status_code == 400
    assert "reads as Hindi (hi)" in answer.json()["error"] and "into ['en']" in answer.json()["error"]
