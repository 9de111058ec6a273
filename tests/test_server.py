"""The translation server: LibreTranslate's API, batching across requests,
overload, deadlines, bad input and API keys, on the backend under test.

The model is the tiny one that has memorised PAIRS, served greedily with
small batch shapes, so every answer can be compared with `model.translate`.
"""

import asyncio
import json
import socket
import threading
import time

import pytest

pytest.importorskip("starlette", reason="the server's tests need the serve extra: pip install '.[serve]'")

import httpx  # noqa: E402
from hypothesis import HealthCheck, given  # noqa: E402
from hypothesis import settings as hypothesis_settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from helpers import PAIRS  # noqa: E402
from keras_transformer.generation.settings import SearchSettings  # noqa: E402
from keras_transformer.server import (  # noqa: E402
    Limits,
    ModelEngine,
    ServiceSettings,
    TranslationService,
    app_of,
    served_model,
)
from keras_transformer.server.routing import Router, RoutingError, ServedModel  # noqa: E402

GREEDY = SearchSettings(beam_size=None)
SOURCES = [source for source, _ in PAIRS]


class RecordingEngine:
    """A `ModelEngine` whose batches are recorded, and held while `gate` is clear."""

    def __init__(self, engine: ModelEngine):
        self.engine = engine
        self.batches = []
        self.threads = set()
        self.gate = threading.Event()
        self.gate.set()

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def translate_rows(self, rows):
        self.threads.add(threading.current_thread().name)
        self.gate.wait(30)
        self.batches.append(len(rows))
        return self.engine.translate_rows(rows)


def make_service(model, settings=None, **engine_options) -> tuple[TranslationService, RecordingEngine]:
    settings = settings or ServiceSettings()
    options = {"search": GREEDY, "max_batch_size": 4, **engine_options}
    engine = RecordingEngine(ModelEngine(model, name="tiny_en_de", **options))
    return TranslationService([served_model("tiny_en_de", engine)], settings), engine


@pytest.fixture(scope="module")
def expected(trained_model):
    """Each source's translation by `model.translate` alone."""
    return dict(zip(SOURCES, trained_model.translate(SOURCES, beam_size=None)))


@pytest.fixture
def client(trained_model):
    service, engine = make_service(trained_model)
    with TestClient(app_of(service, warm_up=False)) as client:
        _wait_ready(client)
        client.engine = engine
        yield client


def _wait_ready(client, limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while client.get("/health").status_code != 200:
        assert time.monotonic() < deadline, client.get("/health").json()
        time.sleep(0.05)


def test_translates_a_string_and_a_list_as_model_translate_does(client, expected):
    one = client.post("/translate", json={"q": SOURCES[0], "source": "en", "target": "de"})
    assert one.status_code == 200 and one.json() == {"translatedText": expected[SOURCES[0]]}
    many = client.post("/translate", json={"q": SOURCES[:3], "source": "en", "target": "de", "format": "text"})
    assert many.json() == {"translatedText": [expected[s] for s in SOURCES[:3]]}


def test_takes_form_fields_and_source_auto(client, expected):
    answer = client.post("/translate", data={"q": SOURCES[1], "source": "auto", "target": "de"}).json()
    assert answer["translatedText"] == expected[SOURCES[1]]
    assert answer["detectedLanguage"]["language"] == "en" and 50 < answer["detectedLanguage"]["confidence"] <= 100


def test_languages_health_metrics_and_page(client):
    assert client.get("/languages").json() == [
        {"code": "en", "name": "English", "targets": ["de"]},
        {"code": "de", "name": "German", "targets": []},
    ]
    assert client.get("/health").json() == {"status": "ok"}
    client.post("/translate", json={"q": SOURCES[0], "source": "en", "target": "de"})
    metrics = client.get("/metrics").text
    for name in ("translate_request_seconds_bucket", "translate_queue_sentences", "translate_batch_sentences_count"):
        assert name in metrics
    assert 'translate_request_seconds_count{status="200"} 1.0' in metrics
    page = client.get("/")
    assert page.status_code == 200 and "<textarea" in page.text
    for wrong in (client.get("/translate"), client.get("/nowhere")):
        assert wrong.status_code in (404, 405) and "error" in wrong.json()


def test_the_model_runs_only_in_the_batcher_thread(client):
    client.post("/translate", json={"q": SOURCES[:2], "source": "en", "target": "de"})
    assert client.engine.threads == {"batcher"}


def test_concurrent_requests_share_one_batch_and_get_their_own_sentences(trained_model, expected):
    # The batch goes when full (4 sentences) long before its wait is over.
    service, engine = make_service(trained_model, ServiceSettings(max_wait_ms=10_000))
    requests = [SOURCES[0], [SOURCES[1], SOURCES[2]], SOURCES[3]]

    async def send_all():
        transport = httpx.ASGITransport(app=app_of(service, warm_up=False))
        async with httpx.AsyncClient(transport=transport, base_url="http://server") as http:
            bodies = [{"q": q, "source": "en", "target": "de"} for q in requests]
            return await asyncio.gather(*(http.post("/translate", json=body, timeout=60) for body in bodies))

    service.start(warm_up=False)
    try:
        started = time.monotonic()
        answers = [response.json()["translatedText"] for response in asyncio.run(send_all())]
    finally:
        service.stop()
    assert engine.batches == [4]
    assert time.monotonic() - started < 10
    assert answers == [expected[SOURCES[0]], [expected[SOURCES[1]], expected[SOURCES[2]]], expected[SOURCES[3]]]


def test_a_long_text_is_split_into_sentences_that_fit(client, expected):
    text = " ".join(SOURCES[:6])  # more tokens than the model's 14
    answer = client.post("/translate", json={"q": text, "source": "en", "target": "de"}).json()
    assert answer["translatedText"] == " ".join(expected[s] for s in SOURCES[:6])


def test_a_full_queue_answers_429_with_retry_after_and_loses_nothing_accepted(trained_model, expected):
    service, engine = make_service(trained_model, ServiceSettings(max_queue=2, max_wait_ms=0))
    engine.gate.clear()  # the worker holds its first batch
    results = {}

    def send(client, key, q):
        results[key] = client.post("/translate", json={"q": q, "source": "en", "target": "de"})

    with TestClient(app_of(service, warm_up=False)) as client:
        _wait_ready(client)
        first = threading.Thread(target=send, args=(client, "first", SOURCES[0]))
        first.start()
        _until(lambda: _held(engine))
        queued = threading.Thread(target=send, args=(client, "queued", SOURCES[1:3]))
        queued.start()
        _until(lambda: service.models[0].batcher.queue_depth == 2)
        refused = client.post("/translate", json={"q": SOURCES[3], "source": "en", "target": "de"})
        assert refused.status_code == 429
        assert "busy" in refused.json()["error"] and int(refused.headers["Retry-After"]) >= 1
        engine.gate.set()
        first.join(30)
        queued.join(30)
        assert results["first"].json()["translatedText"] == expected[SOURCES[0]]
        assert results["queued"].json()["translatedText"] == [expected[s] for s in SOURCES[1:3]]
        assert 'translate_rejected_requests_total{reason="overloaded"} 1.0' in client.get("/metrics").text


def _held(engine: RecordingEngine) -> bool:
    return "batcher" in engine.threads


def _until(condition, limit: float = 30) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def test_a_request_past_its_deadline_gets_504_and_leaves_the_queue(trained_model, expected):
    service, engine = make_service(trained_model, ServiceSettings(timeout_s=0.5, max_wait_ms=0))
    engine.warm_up()  # the 0.5 s deadline is for decoding: nothing may compile in it
    engine.gate.clear()
    with TestClient(app_of(service, warm_up=False)) as client:
        _wait_ready(client)
        held = threading.Thread(
            target=client.post, args=("/translate",), kwargs={"json": {"q": SOURCES[0], "source": "en", "target": "de"}}
        )
        held.start()
        _until(lambda: _held(engine))
        late = client.post("/translate", json={"q": SOURCES[1], "source": "en", "target": "de"})
        assert late.status_code == 504 and "deadline" in late.json()["error"]
        assert service.models[0].batcher.queue_depth == 0
        engine.gate.set()
        held.join(30)
        again = client.post("/translate", json={"q": SOURCES[2], "source": "en", "target": "de"})
        assert again.json() == {"translatedText": expected[SOURCES[2]]}
    assert engine.batches == [1, 1]  # the late request's sentence was never decoded


# fmt: off
BAD_REQUESTS = [
    ("malformed JSON", b'{"q": "a dog runs .", ', "application/json", 400, "malformed JSON"),
    ("JSON that is not an object", b'["a dog runs ."]', "application/json", 400, "must be an object"),
    ("no q", b'{"source": "en", "target": "de"}', "application/json", 400, "missing q"),
    ("empty q", b'{"q": "  ", "source": "en", "target": "de"}', "application/json", 400, "q is empty"),
    ("q of numbers", b'{"q": [1, 2], "source": "en", "target": "de"}', "application/json", 400, "list of strings"),
    ("invalid UTF-8", b'{"q": "\xff\xfe", "source": "en", "target": "de"}', "application/json", 400, "UTF-8"),
    ("a lone surrogate", b'{"q": "\\ud800", "source": "en", "target": "de"}', "application/json", 400, "surrogate"),
    ("unknown target", b'{"q": "a", "source": "en", "target": "xx"}', "application/json", 400, "not supported"),
    ("unknown source", b'{"q": "a", "source": "fr", "target": "de"}', "application/json", 400, "not supported"),
    ("a target number", b'{"q": "a", "source": "en", "target": 7}', "application/json", 400, "language code"),
    ("xml", b'{"q": "a", "source": "en", "target": "de", "format": "xml"}', "application/json", 400, "'html'"),
    ("alternatives", b'{"q": "a", "source": "en", "target": "de", "alternatives": 3}', "application/json", 400, "alt"),
    ("over the char limit", json.dumps({"q": "a" * 5001, "source": "en", "target": "de"}).encode(), "application/json",
     400, "text limit"),
    ("over the batch limit", json.dumps({"q": ["a"] * 65, "source": "en", "target": "de"}).encode(),
     "application/json", 400, "batch limit"),
    ("a 1 MB text", json.dumps({"q": "a " * 600_000, "source": "en", "target": "de"}).encode(), "application/json",
     413, "larger than"),
    ("plain text", b"a dog runs .", "text/plain", 415, "content type"),
]
# fmt: on


@pytest.mark.parametrize(
    ("body", "content_type", "status", "message"), [r[1:] for r in BAD_REQUESTS], ids=[r[0] for r in BAD_REQUESTS]
)
def test_bad_requests_get_a_clear_4xx_and_the_next_request_is_answered(
    client, expected, body, content_type, status, message
):
    response = client.post("/translate", content=body, headers={"content-type": content_type})
    assert response.status_code == status, response.text
    assert message in response.json()["error"]
    good = client.post("/translate", json={"q": SOURCES[0], "source": "en", "target": "de"})
    assert good.json() == {"translatedText": expected[SOURCES[0]]}


def test_a_body_without_content_length_is_cut_off_at_the_limit(trained_model):
    service, _ = make_service(trained_model, ServiceSettings(limits=Limits(max_body_bytes=1000)))
    with TestClient(app_of(service, warm_up=False)) as client:
        _wait_ready(client)
        chunks = (b'{"q": "' + b"a" * 600 + b'"' for _ in range(3))  # streamed: no Content-Length
        response = client.post("/translate", content=chunks, headers={"content-type": "application/json"})
        assert response.status_code == 413


def test_api_keys_gate_translation(trained_model, expected):
    settings = ServiceSettings(limits=Limits(api_keys=frozenset({"secret"})))
    service, _ = make_service(trained_model, settings)
    with TestClient(app_of(service, warm_up=False)) as client:
        _wait_ready(client)
        body = {"q": SOURCES[0], "source": "en", "target": "de"}
        assert client.post("/translate", json=body).status_code == 403
        assert client.post("/translate", json={**body, "api_key": "guess"}).status_code == 403
        assert (
            client.post("/translate", json={**body, "api_key": "secret"}).json()["translatedText"]
            == expected[SOURCES[0]]
        )
        assert client.get("/frontend/settings").json()["keyRequired"] is True


def test_every_batch_shape_fits_the_token_limit(trained_model):
    engine = ModelEngine(trained_model, max_batch_size=32, max_batch_tokens=256)
    assert engine.length_buckets == (16,) and engine.rows_per_batch(16) == 16
    assert engine.shapes() == [(1, 16), (4, 16), (16, 16)]


def test_health_is_503_until_one_batch_size_of_every_width_is_compiled(trained_model):
    service, engine = make_service(trained_model, max_batch_size=4)
    started = threading.Event()
    release = threading.Event()
    programs = engine.programs
    compile_program = programs.compile
    shapes = []

    def slow_compile(size, width):
        started.set()
        release.wait(30)
        shapes.append((size, width))
        return compile_program(size, width)

    programs.compile = slow_compile
    try:
        with TestClient(app_of(service, warm_up=True)) as client:
            started.wait(30)
            warming = client.get("/health")
            assert warming.status_code == 503 and warming.json()["status"] == "warming up"
            refused = client.post("/translate", json={"q": SOURCES[0], "source": "en", "target": "de"})
            assert refused.status_code == 503
            release.set()
            _wait_ready(client, limit=300)
            assert shapes[0] == (1, 16)  # ready with batches of one; the larger sizes follow
            deadline = time.monotonic() + 300
            while engine.rows_per_batch(16) < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        del programs.compile
    assert shapes == engine.shapes() == [(1, 16), (4, 16)]


@hypothesis_settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.one_of(
        st.binary(max_size=200),
        st.dictionaries(
            st.sampled_from(["q", "source", "target", "format", "api_key", "alternatives", "other"]),
            st.recursive(
                st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
                lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                max_leaves=8,
            ),
            max_size=6,
        ).map(lambda fields: json.dumps(fields).encode()),
    ),
    content_type=st.sampled_from(["application/json", "application/x-www-form-urlencoded", "text/plain", ""]),
)
def test_no_client_input_gets_a_500_or_stops_the_server(client, body, content_type):
    response = client.post("/translate", content=body, headers={"content-type": content_type})
    assert response.status_code < 500, response.text
    assert response.status_code == 200 or "error" in response.json()
    assert client.get("/health").status_code == 200


def test_libretranslate_s_own_client_translates(trained_model, expected):
    libretranslatepy = pytest.importorskip("libretranslatepy")
    import uvicorn

    service, _ = make_service(trained_model)
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(app_of(service, warm_up=False), host="127.0.0.1", port=port, log_level="error")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        _until(lambda: server.started and service.ready)
        api = libretranslatepy.LibreTranslateAPI(f"http://127.0.0.1:{port}/")
        assert api.translate(SOURCES[0], "en", "de") == expected[SOURCES[0]]
        assert api.languages()[0]["targets"] == ["de"]
    finally:
        server.should_exit = True
        thread.join(30)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class FakeEngine:
    def __init__(self, languages=()):
        self.languages = list(languages)

    def target_languages(self):
        return self.languages


def test_routes_by_pair_and_multilingual_targets():
    bilingual = served_model("opus-mt-hi-en", FakeEngine())
    group = served_model("opus-mt-tc-big-gmw-gmw", FakeEngine(["deu", "eng", "nld"]))
    router = Router([bilingual, group])
    assert router.route("hi", "en").model is bilingual and router.route("hi", "en").target_language is None
    to_dutch = router.route("en", "nl")
    assert to_dutch.model is group and to_dutch.target_language == "nld"
    assert router.route("deu", "eng").target_language == "eng"  # ISO 639-3 spellings work too
    with pytest.raises(RoutingError, match="does not translate 'hi' into 'nl'"):
        router.route("hi", "nl")
    with pytest.raises(ValueError, match="languages"):
        served_model("my_model", FakeEngine())


def test_a_model_s_languages_can_be_given():
    model = served_model("mine", FakeEngine(), (["en", "fr"], ["de"]))
    assert isinstance(model, ServedModel) and model.pairs() == [("en", "de"), ("fr", "de")]


def test_a_multilingual_model_serves_each_target_through_its_token(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    import keras_transformer as kt
    from marian_fixtures import SOURCE_SENTENCES, write_multilingual_repo

    model = kt.Transformer.from_preset(str(write_multilingual_repo(tmp_path / "gmw")["folder"]))
    engine = ModelEngine(model, search=GREEDY, max_batch_size=2, max_source_bucket=32)
    served = served_model("opus-mt-tc-big-gmw-gmw", engine, (["en"], ["de", "nl"]))
    assert served.target_languages == {"de": "deu", "nl": "nld"}
    with TestClient(app_of(TranslationService([served]), warm_up=False)) as client:
        _wait_ready(client)
        for target, language in served.target_languages.items():
            answer = client.post("/translate", json={"q": SOURCE_SENTENCES[:2], "source": "en", "target": target})
            assert answer.json()["translatedText"] == model.translate(
                SOURCE_SENTENCES[:2], beam_size=None, target_language=language
            )
        injected = client.post("/translate", json={"q": ">>nld<< A dog.", "source": "en", "target": "de"})
        assert injected.status_code == 400


def test_compile_searches_compiles_what_generate_then_runs(tiny_model):
    import numpy as np

    token_ids = np.ones((2, 16), "int32")
    tiny_model.compile_searches(
        {"encoder_token_ids": token_ids, "encoder_padding_mask": token_ids.astype(bool)}, GREEDY
    )
    compiled = dict(tiny_model.compiled_searches)
    assert set(compiled) == {(GREEDY, True), (GREEDY, False)}
    tiny_model.translate(SOURCES[:2], search=GREEDY)
    assert tiny_model.compiled_searches == compiled  # generate needed no search it had not built
