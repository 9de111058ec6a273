"""Routes of multilingual models: a one-to-many model translates from its
source only, script-tagged tokens (`>>cmn_Hans<<`) serve their ISO 639 code,
and a model without language tokens serves one target."""

import pytest

pytest.importorskip("starlette", reason="the server's tests need the serve extra: pip install '.[serve]'")

from starlette.testclient import TestClient  # noqa: E402

from keras_transformer.server import TranslationService, app_of, served_model  # noqa: E402
from keras_transformer.server.routing import Router, RoutingError  # noqa: E402
from server_stubs import StubEngine  # noqa: E402

ROMANCE = ["cat", "fra", "ita", "por", "ron", "spa"]
CHINESE = ["cmn_Hans", "cmn_Hant", "yue_Hant"]


def test_a_one_to_many_model_translates_from_its_source_only():
    model = served_model("hf://Helsinki-NLP/opus-mt-en-ROMANCE", StubEngine(ROMANCE))
    router = Router([model])
    assert model.sources == ("en",) and model.targets == ("ca", "fr", "it", "pt", "ro", "es")
    assert router.route("en", "fr").target_language == "fra"
    with pytest.raises(RoutingError, match="source 'fr' is not supported"):
        router.route("fr", "es")


@pytest.mark.parametrize("name", ["opus-mt-tc-big-en-cat_oci_spa", "hf://Helsinki-NLP/opus-mt-tc-big-en-cat_oci_spa"])
def test_an_opus_mt_name_s_joined_targets_are_targets_of_its_one_source(name):
    # In Opus-MT's names `-` parts the source from the targets and `_` joins languages: not Occitan -> Spanish.
    model = served_model(name, StubEngine(["cat", "oci", "spa"]))
    assert model.sources == ("en",) and model.targets == ("ca", "oc", "es")


def test_a_one_to_many_model_s_target_reaches_the_engine_as_its_token():
    engine = StubEngine(ROMANCE)
    service = TranslationService([served_model("opus-mt-tc-big-en-itc", engine)])
    with TestClient(app_of(service, warm_up=False)) as client:
        answer = client.post("/translate", json={"q": "A dog.", "source": "en", "target": "pt"})
        assert answer.json() == {"translatedText": "A DOG."}
        refused = client.post("/translate", json={"q": "Un chien.", "source": "fr", "target": "es"})
        assert refused.status_code == 400 and "not supported" in refused.json()["error"]
    assert engine.segment_languages == ["por"]


@pytest.mark.parametrize("languages", [None, (["en"], ["zh"]), (["eng"], ["zho"])], ids=["by name", "zh", "zho"])
def test_script_tagged_tokens_serve_their_iso_639_code(languages):
    model = served_model("Helsinki-NLP/opus-mt-en-zh", StubEngine(CHINESE), languages)
    assert model.pairs() == [("en", "zh")]
    assert model.target_languages == {"zh": "cmn_Hans"}  # Mandarin in its usual, simplified, script


def test_a_group_model_s_script_tagged_tokens_serve_their_codes():
    model = served_model("opus-mt-tc-big-zhx-zhx", StubEngine(CHINESE))
    assert model.target_languages == {"zh": "cmn_Hans", "yue": "yue_Hant"}


def test_more_than_one_target_for_a_model_without_language_tokens_is_refused_at_start_up():
    with pytest.raises(ValueError, match="one language"):
        served_model("multi30k_en_de", StubEngine(), (["en"], ["de", "fr"]))
    assert served_model("multi30k_en_de", StubEngine(), (["en", "fr"], ["de"])).pairs() == [("en", "de"), ("fr", "de")]


def test_a_target_without_a_token_is_refused_at_start_up():
    with pytest.raises(ValueError, match="no target token for 'de'"):
        served_model("opus-mt-en-ROMANCE", StubEngine(ROMANCE), (["en"], ["fr", "de"]))


@pytest.mark.slow
def test_a_multilingual_model_translates_a_text_that_starts_with_a_token_it_lacks(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    import keras_transformer as kt
    from keras_transformer.generation.settings import SearchSettings
    from keras_transformer.server import ModelEngine
    from marian_fixtures import write_multilingual_repo

    model = kt.Transformer.from_preset(str(write_multilingual_repo(tmp_path / "gmw")["folder"]))
    engine = ModelEngine(model, search=SearchSettings(beam_size=None), max_batch_size=1, max_source_bucket=32)
    service = TranslationService([served_model("opus-mt-tc-big-gmw-gmw", engine, (["en"], ["de", "nl"]))])
    with TestClient(app_of(service, warm_up=False)) as client:
        text = ">>OK<< A dog."
        answer = client.post("/translate", json={"q": text, "source": "en", "target": "nl"})
        assert answer.json() == {"translatedText": model.translate(f">>nld<< {text}", beam_size=None)}
        refused = client.post("/translate", json={"q": ">>deu<< A dog.", "source": "en", "target": "nl"})
        assert refused.status_code == 400 and "'>>deu<<'" in refused.json()["error"]
