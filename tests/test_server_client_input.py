"""Whatever a client sends, the server answers 2xx or a 4xx that says what
to change, never a 500: API keys of any JSON type, numbers and nesting
JSON's parser refuses, requests the queue can never hold, and `>>xxx<<` in
the text of models that have no such token."""

import json
import time

import pytest

pytest.importorskip("starlette", reason="the server's tests need the serve extra: pip install '.[serve]'")

from hypothesis import HealthCheck, given  # noqa: E402
from hypothesis import settings as hypothesis_settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from keras_transformer.server import Limits, ServiceSettings, TranslationService, app_of  # noqa: E402
from keras_transformer.server.batcher import Overloaded  # noqa: E402
from keras_transformer.server.routing import ServedModel  # noqa: E402
from server_stubs import StubEngine  # noqa: E402

KEY = "secret"
GOOD = {"q": "A dog runs.", "source": "en", "target": "de", "api_key": KEY}


def stub_client(engine=None, **settings) -> TestClient:
    settings = {"limits": Limits(api_keys=frozenset({KEY})), **settings}
    model = ServedModel("stub", engine or StubEngine(), ("en",), ("de",))
    return TestClient(app_of(TranslationService([model], ServiceSettings(**settings)), warm_up=False))


@pytest.fixture(scope="module")
def client():
    with stub_client() as client:
        yield client


def post(client, body: bytes | dict):
    if isinstance(body, dict):
        body = json.dumps(body).encode()
    return client.post("/translate", content=body, headers={"content-type": "application/json"})


@pytest.mark.parametrize("api_key", [[KEY], {KEY: KEY}, 7, None, True, 1.5], ids=repr)
def test_an_api_key_of_another_json_type_gets_403(client, api_key):
    response = post(client, {**GOOD, "api_key": api_key})
    assert response.status_code == 403 and "API key" in response.json()["error"]
    assert post(client, GOOD).json() == {"translatedText": "A DOG RUNS."}


# fmt: off
UNPARSABLE = [
    ("a 5,000-digit number", b'{"q": "a", "source": "en", "target": "de", "alternatives": ' + b"9" * 5000 + b"}",
     "too many digits"),
    ("JSON nested 100,000 deep", b'{"q": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
]
# fmt: on


@pytest.mark.parametrize(("body", "message"), [r[1:] for r in UNPARSABLE], ids=[r[0] for r in UNPARSABLE])
def test_json_the_parser_refuses_gets_400(client, body, message):
    response = post(client, body)
    assert response.status_code == 400 and message in response.json()["error"]
    assert post(client, GOOD).status_code == 200


@pytest.mark.parametrize("field", ["source", "target", "format", "alternatives"])
@pytest.mark.parametrize("value", [["de"], {"de": 1}, [[[]]], 3.5], ids=repr)
def test_a_field_of_another_type_gets_400(client, field, value):
    response = post(client, {**GOOD, field: value})
    assert response.status_code == 400, response.text
    assert field in response.json()["error"]


@pytest.mark.parametrize("field", ["q", "source", "target", "format", "alternatives", "api_key"])
@pytest.mark.parametrize("depth", [900, 2000])
def test_a_field_nested_about_as_deep_as_python_recurses_gets_a_4xx(client, field, depth):
    fields = json.dumps({**GOOD, field: 0}).encode()
    body = fields.replace(f'"{field}": 0'.encode(), f'"{field}": '.encode() + b"[" * depth + b"]" * depth)
    response = post(client, body)
    assert 400 <= response.status_code < 500, response.text


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


@hypothesis_settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    fields=st.dictionaries(
        st.sampled_from(["q", "source", "target", "format", "api_key", "alternatives", "other"]),
        JSON_VALUES | st.sampled_from(["en", "de", "text", KEY, "A dog.", "auto"]),
        max_size=7,
    ),
    keyed=st.booleans(),
)
def test_no_request_to_a_keyed_server_gets_a_500(client, fields, keyed):
    if keyed:
        fields = {**fields, "api_key": KEY}
    response = post(client, fields)
    assert response.status_code < 500, response.text
    assert response.status_code == 200 or "error" in response.json()
    assert client.get("/health").status_code == 200


def test_more_sentences_than_the_queue_holds_get_413_not_429_every_time():
    with stub_client(max_queue=4) as client:
        for _ in range(2):
            refused = post(client, {**GOOD, "q": "Go. " * 5})
            assert refused.status_code == 413 and "Retry-After" not in refused.headers
            assert "5 sentences" in refused.json()["error"] and "at most 4" in refused.json()["error"]
        assert post(client, {**GOOD, "q": "Go. " * 4}).json() == {"translatedText": "GO. GO. GO. GO."}


def test_retry_after_is_never_sooner_than_the_estimate():
    engine = StubEngine()
    with stub_client(engine) as client:
        batcher = client.app.state.service.models[0].batcher

        def busy(rows, timeout_s=None):
            raise Overloaded("The server is busy.", 1.2)

        batcher.submit = busy
        refused = post(client, GOOD)
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "2"


def test_a_model_without_language_tokens_translates_text_with_angle_brackets(client):
    answer = post(client, {**GOOD, "q": ["Press >>OK<< to continue.", ">>nld<< is no token here."]})
    assert answer.json() == {"translatedText": ["PRESS >>OK<< TO CONTINUE.", ">>NLD<< IS NO TOKEN HERE."]}


def test_a_multilingual_model_refuses_only_its_own_tokens_in_texts():
    engine = StubEngine(["deu", "nld"])
    model = ServedModel("stub", engine, ("en",), ("de", "nl"), {"de": "deu", "nl": "nld"}, frozenset(engine.languages))
    with TestClient(app_of(TranslationService([model]), warm_up=False)) as client:
        body = {"source": "en", "target": "de"}
        refused = post(client, {**body, "q": ["A dog.", "A >>nld<< dog."]})
        assert refused.status_code == 400 and "q[1] contains '>>nld<<'" in refused.json()["error"]
        assert post(client, {**body, "q": "Press >>OK<< to continue."}).status_code == 200


@pytest.fixture(scope="module")
def preset_client():
    import keras_transformer as kt
    from keras_transformer.generation.settings import SearchSettings
    from keras_transformer.server import build_app

    model = kt.Transformer.from_preset("multi30k_en_de")
    # Greedy, one shape: the first request compiles its search, within the deadline.
    options = {"search": SearchSettings(beam_size=None), "max_batch_size": 1, "max_source_bucket": 32}
    app = build_app({"multi30k_en_de": model}, ServiceSettings(timeout_s=600), engine_options=options, warm_up=False)
    with TestClient(app) as client:
        client.model = model
        yield client


def test_the_preset_refuses_1250_sentences_once_with_413(preset_client):
    """5,000 characters, within the character limit, in more
    sentences than the default queue of 1,024 holds."""
    started = time.monotonic()
    refused = post(preset_client, {"q": "Go. " * 1250, "source": "en", "target": "de"})
    assert refused.status_code == 413, refused.text
    assert "1250 sentences" in refused.json()["error"] and "at most 1024" in refused.json()["error"]
    assert time.monotonic() - started < 30  # refused, not decoded


def test_the_preset_translates_press_ok_to_continue(preset_client):
    text = "Press >>OK<< to continue."
    answer = post(preset_client, {"q": text, "source": "en", "target": "de"})
    assert answer.json() == {"translatedText": preset_client.model.translate(text, beam_size=None)}
