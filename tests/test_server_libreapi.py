"""The rest of LibreTranslate's API, on the backend under test: `/detect` and
`source: "auto"` (a real language identifier), `alternatives` (the beam's n
best), `format: "html"`, `/translate_file` and `/download_file`, `/suggest`
and `/frontend/settings`; each answer in LibreTranslate's shape, and its
client (`libretranslatepy`) detecting and translating with `"auto"`.

The model is the tiny one that has memorised PAIRS (English into German).
"""

import html
import threading

import pytest

pytest.importorskip("starlette", reason="the server's tests need the serve extra: pip install '.[serve]'")

from starlette.testclient import TestClient  # noqa: E402

from helpers import PAIRS  # noqa: E402
from keras_transformer.generation.settings import SearchSettings  # noqa: E402
from keras_transformer.server import ModelEngine, ServiceSettings, TranslationService, app_of, served_model  # noqa: E402
from keras_transformer.server.api import Limits  # noqa: E402

ENGLISH = [source for source, _ in PAIRS]
GERMAN = [target for _, target in PAIRS]
BEAM = SearchSettings(beam_size=4)


def serving(model, search: SearchSettings, settings: ServiceSettings | None = None) -> TestClient:
    # One source width and small batches: few shapes to compile.
    engine = ModelEngine(model, name="tiny_en_de", search=search, max_batch_size=4, max_source_bucket=16)
    service = TranslationService([served_model("tiny_en_de", engine)], settings or ServiceSettings())
    return TestClient(app_of(service, warm_up=False))


@pytest.fixture(scope="module")
def client(trained_model):
    """A server of the tiny model with section 6.1's beam search."""
    with serving(trained_model, BEAM) as client:
        yield client


@pytest.fixture(scope="module")
def greedy_client(trained_model):
    with serving(trained_model, SearchSettings(beam_size=None)) as client:
        yield client


def test_detect_answers_languages_likeliest_first(client):
    for english, german in PAIRS:
        for text, language in ((english, "en"), (german, "de")):
            found = client.post("/detect", json={"q": text}).json()
            assert found[0]["language"] == language, (text, found)
            confidences = [detection["confidence"] for detection in found]
            assert confidences == sorted(confidences, reverse=True) and all(0 < c <= 100 for c in confidences)
            assert {detection["language"] for detection in found} <= {"en", "de"}  # the served languages only
    # A list q: one list per text; a text of no language falls back to the first at confidence 0.
    both = client.post("/detect", data={"q": [ENGLISH[1], "12345"]}).json()
    assert both[0][0]["language"] == "en" and both[1] == [{"confidence": 0.0, "language": "en"}]


def test_auto_routes_each_text_by_its_detected_language(client, trained_model):
    answer = client.post("/translate", json={"q": ENGLISH[1], "source": "auto", "target": "de"}).json()
    assert answer["translatedText"] == trained_model.translate(ENGLISH[1])
    assert answer["detectedLanguage"]["language"] == "en"
    # A list may mix languages: the German text is already in the target language and comes back as it is.
    mixed = client.post("/translate", json={"q": [ENGLISH[2], GERMAN[3]], "source": "auto", "target": "de"}).json()
    assert mixed["translatedText"] == [trained_model.translate(ENGLISH[2]), GERMAN[3]]
    assert [detected["language"] for detected in mixed["detectedLanguage"]] == ["en", "de"]
    # German detected, but this server translates nothing from German into English.
    refused = client.post("/translate", json={"q": GERMAN[1], "source": "auto", "target": "en"})
    assert refused.status_code == 400 and "reads as German (de)" in refused.json()["error"]


def test_alternatives_are_the_beam_s_other_hypotheses(client, trained_model):
    text = ENGLISH[5]
    hypotheses = trained_model.generate([text], num_hypotheses=4)[0]
    answer = client.post("/translate", json={"q": text, "source": "en", "target": "de", "alternatives": 3}).json()
    assert answer["translatedText"] == hypotheses[0] == trained_model.translate(text)
    others = [h for h in dict.fromkeys(hypotheses[1:]) if h != hypotheses[0]]
    assert answer["alternatives"] == others and len(others) >= 1
    # A list q gets a list of alternatives per text; a form gives the count as a string.
    listed = client.post("/translate", data={"q": ENGLISH[:2], "source": "en", "target": "de", "alternatives": "1"})
    assert listed.json()["translatedText"] == trained_model.translate(ENGLISH[:2])
    assert [len(alternatives) for alternatives in listed.json()["alternatives"]] == [1, 1]
    # Without alternatives the answer has none, and is the plain search's.
    plain = client.post("/translate", json={"q": text, "source": "en", "target": "de", "alternatives": 0}).json()
    assert plain == {"translatedText": hypotheses[0]}


@pytest.mark.parametrize(
    ("alternatives", "message"),
    [(4, "at most 3: the other hypotheses of its beam of 4"), (-1, "whole number"), ("two", "whole number")],
)
def test_alternatives_beyond_the_beam_are_refused(client, alternatives, message):
    answer = client.post("/translate", json={"q": "a", "source": "en", "target": "de", "alternatives": alternatives})
    assert answer.status_code == 400 and message in answer.json()["error"]


def test_a_greedy_server_refuses_alternatives_and_says_why(greedy_client):
    answer = greedy_client.post("/translate", json={"q": "a", "source": "en", "target": "de", "alternatives": 1})
    assert answer.status_code == 400 and "decodes greedily" in answer.json()["error"]


def test_html_keeps_the_markup_and_translates_the_text(client, trained_model):
    document = (
        '<!doctype html><p class="intro" title="a dog runs .">{0}</p>\n'
        "<ul><li>{1}</li><li><b>{2}</b></li></ul><script>if (a < b) run();</script>"
        "<code>a dog runs .</code><!-- a dog runs . -->"
    )
    # Entities are decoded before translation and the translation escaped again.
    texts = [ENGLISH[0], f"{ENGLISH[1]} & {ENGLISH[3]}", ENGLISH[2]]
    translated = [html.escape(text, quote=False) for text in trained_model.translate(texts)]
    html_texts = [html.escape(text, quote=False) for text in texts]
    answer = client.post(
        "/translate", json={"q": document.format(*html_texts), "source": "en", "target": "de", "format": "html"}
    )
    # Attributes, code, scripts and comments stay as written.
    assert answer.json() == {"translatedText": document.format(*translated)}


def test_a_text_file_is_translated_line_by_line_and_downloaded(client, trained_model):
    content = f"{ENGLISH[0]}\n\n  {ENGLISH[1]}\n"
    answer = client.post(
        "/translate_file", files={"file": ("notes.txt", content.encode())}, data={"source": "en", "target": "de"}
    )
    assert answer.status_code == 200, answer.text
    url = answer.json()["translatedFileUrl"]
    assert url.startswith("http://testserver/download_file/")
    downloaded = client.get(url)
    first, second = trained_model.translate(ENGLISH[:2])
    assert downloaded.text == f"{first}\n\n  {second}\n"
    assert 'filename="notes.txt"' in downloaded.headers["content-disposition"]


def test_an_html_file_is_translated_as_html(client, trained_model):
    answer = client.post(
        "/translate_file",
        files={"file": ("page.html", f"<h1>{ENGLISH[4]}</h1>".encode())},
        data={"source": "auto", "target": "de"},
    )
    assert client.get(answer.json()["translatedFileUrl"]).text == f"<h1>{trained_model.translate(ENGLISH[4])}</h1>"


@pytest.mark.parametrize(
    ("files", "data", "status", "message"),
    [
        ({"file": ("slides.pdf", b"%PDF")}, {"source": "en", "target": "de"}, 400, "'.pdf' are not supported"),
        ({"file": ("notes.txt", b"\xff\xfe")}, {"source": "en", "target": "de"}, 400, "not UTF-8"),
        ({"file": ("notes.txt", b"a dog runs .")}, {"source": "en"}, 400, "missing target"),
        ({"file": ("notes.txt", b"a dog runs .")}, {"source": "en", "target": "xx"}, 400, "not supported"),
        ({"other": ("notes.txt", b"a dog runs .")}, {"source": "en", "target": "de"}, 400, "missing file"),
        (None, {"source": "en", "target": "de"}, 415, "multipart/form-data"),
    ],
)
def test_bad_files_get_a_clear_error(client, files, data, status, message):
    answer = client.post("/translate_file", files=files, data=data)
    assert answer.status_code == status and message in answer.json()["error"]


def test_files_are_held_to_the_character_limit_and_unknown_downloads_are_404(trained_model):
    with serving(trained_model, BEAM, ServiceSettings(limits=Limits(char_limit=20))) as client:
        answer = client.post(
            "/translate_file",
            files={"file": ("long.txt", b"a dog runs .\n" * 3)},
            data={"source": "en", "target": "de"},
        )
        assert answer.status_code == 400 and "text limit of 20" in answer.json()["error"]
        for name in ("0" * 32 + ".notes.txt", "..%2Fsecrets.txt"):
            missing = client.get(f"/download_file/{name}")
            assert missing.status_code == 404 and "error" in missing.json()


def test_suggest_and_frontend_settings_answer_as_libretranslate(client):
    suggestion = client.post("/suggest", data={"q": "a", "s": "b", "source": "en", "target": "de"})
    assert suggestion.status_code == 403 and suggestion.json() == {"error": "Suggestions are disabled on this server."}
    assert client.get("/frontend/settings").json() == {
        "charLimit": 5000,
        "batchLimit": 64,
        "frontendTimeout": 500,
        "apiKeys": False,
        "keyRequired": False,
        "suggestions": False,
        "filesTranslation": True,
        "supportedFilesFormat": [".txt", ".html", ".htm"],
        "language": {"source": {"code": "auto", "name": "Auto Detect"}, "target": {"code": "de", "name": "German"}},
    }


def test_libretranslate_s_client_detects_and_translates_auto(trained_model):
    libretranslatepy = pytest.importorskip("libretranslatepy")
    import uvicorn

    from test_server import _free_port, _until

    app = serving(trained_model, BEAM).app
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        _until(lambda: server.started and app.state.service.ready)
        api = libretranslatepy.LibreTranslateAPI(f"http://127.0.0.1:{port}/")
        assert api.detect(GERMAN[0])[0]["language"] == "de"
        assert api.translate(ENGLISH[0], "auto", "de") == trained_model.translate(ENGLISH[0])
    finally:
        server.should_exit = True
        thread.join(30)
