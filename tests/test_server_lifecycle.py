"""The server's start and stop, in process: a failed warm-up said alike by
`/health` and `/translate`, a warm-up that a stop ends, and bodies that never
arrive (a read deadline, and the cut at a shutdown's deadline)."""

import asyncio
import threading
import time

import pytest

pytest.importorskip("starlette", reason="the server's tests need the serve extra: pip install '.[serve]'")

from starlette.testclient import TestClient  # noqa: E402

from keras_transformer.generation.translation import Segment  # noqa: E402
from keras_transformer.server import ServiceSettings, TranslationService, app_of, served_model  # noqa: E402

REQUEST = {"q": "Two dogs play in the snow.", "source": "en", "target": "de"}


class WarmUpEngine:
    """An engine whose warm-up runs `warm_up()`; it translates every sentence as "x"."""

    def __init__(self, warm_up=lambda: None):
        self._warm_up = warm_up
        self.warm_ups = 0

    def target_languages(self):
        return []

    def segments(self, texts, target_language=None, source_language=None):
        return [Segment(index, [1]) for index in range(len(texts))]

    def bucket_of(self, row):
        return 16

    def rows_per_batch(self, bucket):
        return 1

    def translate_rows(self, rows):
        return ["x"] * len(rows)

    def warm_up(self, on_shape=None):
        self.warm_ups += 1
        self._warm_up()

    def warm_up_later(self, on_shape=None, stop=None):
        pass


def _service(*engines, settings: ServiceSettings | None = None) -> TranslationService:
    names = ["first_en_de", "second_en_fr"]
    served = [served_model(name, engine) for name, engine in zip(names, engines)]
    return TranslationService(served, settings or ServiceSettings())


def test_after_a_failed_warm_up_translate_says_what_health_says():
    def out_of_memory():
        raise MemoryError("out of memory while compiling")

    service = _service(WarmUpEngine(out_of_memory))
    with TestClient(app_of(service, warm_up=True)) as client:
        deadline = time.monotonic() + 10
        while (health := client.get("/health")).json()["status"] == "warming up":
            assert time.monotonic() < deadline, "the warm-up never ended"
            time.sleep(0.01)
        answer = client.post("/translate", json=REQUEST)
    assert health.status_code == 500 and health.json()["status"] == "failed"
    assert "out of memory while compiling" in health.json()["error"]
    # Not "warming up, retry in 5 s": the same failure, and no promise that retrying helps.
    assert answer.status_code == health.status_code
    assert answer.json()["error"] == health.json()["error"]
    assert "Retry-After" not in answer.headers


def test_a_stop_during_warm_up_compiles_no_further_model():
    compiling, release = threading.Event(), threading.Event()
    first = WarmUpEngine(lambda: (compiling.set(), release.wait(10)))
    second = WarmUpEngine()
    service = _service(first, second)
    thread = service.start_in_background()
    assert compiling.wait(10)
    service.stop()
    release.set()
    thread.join(10)
    assert not thread.is_alive()
    assert (first.warm_ups, second.warm_ups) == (1, 0)
    assert not service.ready


def _stalled_request(app, *, cancel_after_s: float | None = None) -> tuple[list[dict], float]:
    """Sends `app` the headers of a 1000-byte body and 10 bytes of it, then
    nothing; cancels the request after `cancel_after_s` (as uvicorn does at
    its graceful-shutdown deadline). The messages the app sent, and when."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/translate",
        "raw_path": b"/translate",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"1000")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 5000),
    }
    sent = []

    async def main():
        parts = [{"type": "http.request", "body": b'{"q": "Two', "more_body": True}]

        async def receive():
            if parts:
                return parts.pop()
            await asyncio.Event().wait()  # the rest never comes

        async def send(message):
            sent.append(message)

        request = asyncio.ensure_future(app(scope, receive, send))
        if cancel_after_s is not None:
            await asyncio.sleep(cancel_after_s)
            request.cancel()
        # Far past the deadlines under test: a request still open then is held for good.
        await asyncio.wait_for(request, 20)

    started = time.monotonic()
    asyncio.run(main())
    return sent, time.monotonic() - started


def test_a_body_that_stops_arriving_gets_408_at_its_deadline():
    service = _service(WarmUpEngine(), settings=ServiceSettings(body_timeout_s=0.5))
    sent, seconds = _stalled_request(app_of(service, warm_up=False))
    assert sent[0]["status"] == 408
    assert b"did not arrive within 0.5 s" in sent[1]["body"]
    assert seconds < 10


def test_a_request_cut_off_by_the_shutdown_gets_503_not_500():
    service = _service(WarmUpEngine(), settings=ServiceSettings(body_timeout_s=60))
    sent, _ = _stalled_request(app_of(service, warm_up=False), cancel_after_s=0.5)
    assert sent[0]["status"] == 503
    assert b"shut down before answering" in sent[1]["body"]
