"""`keras-transformer serve`'s exits, as a service manager sees them: exit 0
after SIGTERM while warming up or draining a stalled client (within the drain
deadline), the shell's signal code when a second signal cuts the drain short,
and exit 1 with one line on stderr when the port is in use."""

import signal
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("starlette", reason="the server's tests need the serve extra: pip install '.[serve]'")
httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.slow

# Headers that announce a 1000-byte body, and 10 bytes of it: then the client waits.
STALLED_REQUEST = (
    b"POST /translate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    b"Content-Length: 1000\r\n\r\n" + b'{"q": "Two'
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _command(port: int, backend: str, *options: str) -> list[str]:
    return [sys.executable, "-m", "keras_transformer.cli", "serve", "multi30k_en_de", "--port", str(port)] + [
        "--backend",
        backend,
        *options,
    ]


def _start(status: str, backend: str, *options: str) -> tuple[subprocess.Popen, int]:
    """A server whose /health has said `status` ("warming up" or "ok")."""
    port = _free_port()
    server = subprocess.Popen(_command(port, backend, *options), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while True:
        assert server.poll() is None, server.stdout.read().decode(errors="replace")[-3000:]
        assert time.monotonic() < deadline, f"/health never said {status!r} in 600 s"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()["status"] == status:
                return server, port
        except httpx.TransportError:
            pass
        time.sleep(0.2)


def _stalled_client(port: int) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", port))
    client.sendall(STALLED_REQUEST)
    time.sleep(0.5)  # the server has read the headers: a request is open
    return client


def _exit(server: subprocess.Popen, within_s: float) -> tuple[int, str, float]:
    """The server's exit code, its output, and the seconds it took to exit."""
    started = time.monotonic()
    try:
        code = server.wait(within_s)
    except subprocess.TimeoutExpired:
        server.kill()
        pytest.fail(f"still running {within_s} s later:\n{server.communicate()[0].decode(errors='replace')[-3000:]}")
    return code, server.stdout.read().decode(errors="replace"), time.monotonic() - started


def _kill(server: subprocess.Popen) -> None:
    if server.poll() is None:
        server.kill()
    server.wait()


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_sigterm_while_warming_up_exits_0_at_once(backend):
    if backend != "tensorflow":
        pytest.importorskip(backend)
    # Many shapes to compile: the warm-up is still running when SIGTERM comes.
    server, _ = _start("warming up", backend, "--greedy", "--max-batch-size", "64", "--max-source-tokens", "128")
    try:
        server.send_signal(signal.SIGTERM)
        code, output, seconds = _exit(server, 60)
        assert code == 0, output[-3000:]
        assert "terminate called" not in output and "Traceback" not in output, output[-3000:]
        assert seconds < 20, f"{seconds:.1f} s to exit"
    finally:
        _kill(server)


def test_a_port_in_use_is_one_line_on_stderr_and_exit_1():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(_command(port, "tensorflow"), capture_output=True, text=True, timeout=600)
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"keras-transformer serve: error: cannot listen on 127.0.0.1:{port}: address already in use; "
        "stop what uses it or choose another --port."
    ]


def test_sigterm_cuts_a_stalled_body_at_the_drain_deadline_and_exits_0():
    options = ("--greedy", "--no-warm-up", "--max-batch-size", "1", "--body-timeout", "300", "--drain-timeout", "3")
    server, port = _start("ok", "tensorflow", *options)
    try:
        body = {"q": "Two dogs play in the snow.", "source": "en", "target": "de"}
        assert httpx.post(f"http://127.0.0.1:{port}/translate", json=body, timeout=300).status_code == 200
        with _stalled_client(port) as client:
            server.send_signal(signal.SIGTERM)
            code, output, seconds = _exit(server, 60)
            client.settimeout(10)
            answer = client.recv(4096)
        assert code == 0, output[-3000:]
        assert 2 < seconds < 20, f"{seconds:.1f} s to exit with a 3 s drain deadline"
        # A retryable refusal, not the 500 of a cancelled request.
        assert answer.startswith(b"HTTP/1.1 503"), answer
        assert "Traceback" not in output, output[-3000:]
    finally:
        _kill(server)


def test_a_second_signal_ends_the_drain_at_once():
    server, port = _start("ok", "tensorflow", "--greedy", "--no-warm-up", "--body-timeout", "300")
    try:
        with _stalled_client(port):
            server.send_signal(signal.SIGTERM)
            time.sleep(2)
            assert server.poll() is None, "the server did not wait for the open request"
            server.send_signal(signal.SIGINT)
            code, output, _ = _exit(server, 10)
        assert code == 128 + signal.SIGINT, output[-3000:]
    finally:
        _kill(server)
