"""`keras-transformer serve` as users run it: a process on a port, LibreTranslate's
client, and SIGTERM answering every request in flight before exiting 0."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("starlette", reason="the server's tests need the serve extra: pip install '.[serve]'")
httpx = pytest.importorskip("httpx")
libretranslatepy = pytest.importorskip("libretranslatepy")

SENTENCE = "Two dogs play in the snow."
# Shipped preset, greedy and beam: the README's example answer.
TRANSLATION = "Zwei Hunde spielen im Schnee."
MANY = ["A man rides a bike.", "Two dogs play in the snow.", "A woman is singing.", "Children play football."] * 4


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start(backend: str, *options: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    command = [sys.executable, "-m", "keras_transformer.cli", "serve", "multi30k_en_de", "--port", str(port)]
    command += ["--backend", backend, "--max-batch-size", "1", "--max-source-tokens", "32", *options]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while True:
        assert server.poll() is None, server.stdout.read().decode(errors="replace")[-3000:]
        assert time.monotonic() < deadline, "the server did not get ready in 600 s"
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return server, url
        except httpx.TransportError:
            pass
        time.sleep(0.5)


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "options"), [("tensorflow", ()), ("jax", ("--greedy",)), ("torch", ("--greedy",))])
def test_serve_answers_libretranslate_s_client_and_drains_on_sigterm(backend, options):
    if backend != "tensorflow":
        pytest.importorskip(backend)
    server, url = _start(backend, *options)
    try:
        assert libretranslatepy.LibreTranslateAPI(url + "/").translate(SENTENCE, "en", "de") == TRANSLATION
        answers = []

        def send():
            body = {"q": MANY, "source": "en", "target": "de"}
            answers.append(httpx.post(f"{url}/translate", json=body, timeout=120))

        senders = [threading.Thread(target=send) for _ in range(3)]
        for sender in senders:
            sender.start()
        deadline = time.monotonic() + 60
        while "translate_requests_in_flight 3.0" not in httpx.get(f"{url}/metrics", timeout=5).text:
            assert time.monotonic() < deadline, "the requests never reached the server"
            time.sleep(0.01)
        server.send_signal(signal.SIGTERM)
        for sender in senders:
            sender.join(120)
        assert [answer.status_code for answer in answers] == [200] * 3
        assert all(answer.json()["translatedText"][1] == TRANSLATION for answer in answers)
        assert server.wait(60) == 0
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/health", timeout=5)
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()
