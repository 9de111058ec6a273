"""`keras-transformer serve` as users run it: a process on a port, LibreTranslate's
client, and SIGTERM answering every request in flight before exiting 0."""

import json
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


def _start(backend: str, log, *options: str) -> tuple[subprocess.Popen, str]:
    """A ready server whose output goes to the file `log`: a pipe nobody reads
    would fill with the access log and stall the server in its next write."""
    port = _free_port()
    command = [sys.executable, "-m", "keras_transformer.cli", "serve", "multi30k_en_de", "--port", str(port)]
    command += ["--backend", backend, "--max-batch-size", "1", "--max-source-tokens", "32", *options]
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while True:
        assert server.poll() is None, open(log.name, errors="replace").read()[-3000:]
        assert time.monotonic() < deadline, "the server did not get ready in 600 s"
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return server, url
        except httpx.TransportError:
            pass
        time.sleep(0.5)


def _held_body(release: threading.Event):
    """A /translate body of `MANY` whose second half is sent once `release` is
    set: the request is in flight until then, however fast the server decodes."""
    body = json.dumps({"q": MANY, "source": "en", "target": "de"}).encode()
    yield body[: len(body) // 2]
    release.wait(120)
    yield body[len(body) // 2 :]


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "options"), [("tensorflow", ()), ("jax", ("--greedy",)), ("torch", ("--greedy",))])
def test_serve_answers_libretranslate_s_client_and_drains_on_sigterm(backend, options, tmp_path):
    if backend != "tensorflow":
        pytest.importorskip(backend)
    with open(tmp_path / "server.log", "wb") as log:
        server, url = _start(backend, log, *options)
    release = threading.Event()
    try:
        assert libretranslatepy.LibreTranslateAPI(url + "/").translate(SENTENCE, "en", "de") == TRANSLATION
        answers = []

        def send():
            headers = {"content-type": "application/json"}
            answers.append(httpx.post(f"{url}/translate", content=_held_body(release), headers=headers, timeout=120))

        senders = [threading.Thread(target=send) for _ in range(3)]
        for sender in senders:
            sender.start()
        deadline = time.monotonic() + 60
        while "translate_requests_in_flight 3.0" not in httpx.get(f"{url}/metrics", timeout=5).text:
            assert time.monotonic() < deadline, "the requests never reached the server"
            time.sleep(0.05)
        server.send_signal(signal.SIGTERM)
        release.set()
        for sender in senders:
            sender.join(120)
        assert [answer.status_code for answer in answers] == [200] * 3
        assert all(answer.json()["translatedText"][1] == TRANSLATION for answer in answers)
        assert server.wait(60) == 0
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/health", timeout=5)
    finally:
        release.set()
        if server.poll() is None:
            server.kill()
        server.wait()
