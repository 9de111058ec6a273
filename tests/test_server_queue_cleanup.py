"""Sentences nobody waits for leave the queue: those of a request whose
batch failed, and those of a client that disconnected."""

import json
import socket
import threading
import time

import pytest

pytest.importorskip("starlette", reason="the server's tests need the serve extra: pip install '.[serve]'")

import httpx  # noqa: E402

from keras_transformer.server import ServiceSettings, TranslationService, app_of  # noqa: E402
from keras_transformer.server.batcher import Batcher  # noqa: E402
from keras_transformer.server.routing import ServedModel  # noqa: E402
from server_stubs import StubEngine  # noqa: E402


def _until(condition, limit: float = 10) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def test_a_failed_batch_takes_its_requests_other_sentences_out_of_the_queue():
    engine = StubEngine(rows_per_batch=2, fail_first=True)
    batcher = Batcher(engine, max_wait_ms=0)
    batcher.start()
    failed = batcher.submit([[ord(c)] for c in "abcde"])  # 5 sentences: batches of 2, 2 and 1
    with pytest.raises(RuntimeError, match="first batch fails"):
        failed.result(30)
    assert batcher.queue_depth == 0
    assert batcher.submit([[ord("f")]]).result(30) == ["F"]  # the worker goes on
    batcher.stop(30)
    assert engine.batches == [["a", "b"], ["f"]]


def test_a_client_that_disconnects_takes_its_sentences_out_of_the_queue():
    import uvicorn

    engine = StubEngine()
    engine.gate.clear()  # the first request's batch holds the worker
    settings = ServiceSettings(max_wait_ms=0, timeout_s=60)
    service = TranslationService([ServedModel("stub", engine, ("en",), ("de",))], settings)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(app_of(service, warm_up=False), host="127.0.0.1", port=port, log_level="error")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}/translate"
    answers = {}
    try:
        _until(lambda: server.started and service.ready)
        first = threading.Thread(
            target=lambda: answers.update(first=httpx.post(url, json={"q": "One.", "source": "en", "target": "de"}))
        )
        first.start()
        engine.decoding.wait(10)
        body = json.dumps({"q": "Two. Three.", "source": "en", "target": "de"}).encode()
        with socket.create_connection(("127.0.0.1", port)) as leaving:
            leaving.sendall(
                b"POST /translate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            batcher = service.models[0].batcher
            _until(lambda: batcher.queue_depth == 2)
        _until(lambda: batcher.queue_depth == 0)  # long before its 60 s deadline
        engine.gate.set()
        first.join(30)
        assert answers["first"].json() == {"translatedText": "ONE."}
        assert engine.batches == [["One."]]  # the departed client's sentences were never decoded
    finally:
        engine.gate.set()
        server.should_exit = True
        thread.join(30)
