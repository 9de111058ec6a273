"""The Ray Serve deployment on a local Ray: two replicas of the shipped preset
behind LibreTranslate's routes, and one of them killed under load.

Ray runs on loopback only: with its single-machine mode
(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, read when `ray` is imported) every Ray
process binds and advertises 127.0.0.1, and Serve's proxy listens on
127.0.0.1. So `ray` is imported in the fixture, after that is set.

The replicas skip warm-up: each compiles its two batch shapes (one source
width, batches of 1 and 2) on its first requests, which keeps the start of
the replicas, and of the one replacing the killed replica, short.
"""

import asyncio
import importlib.util
import itertools
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import NamedTuple

import pytest

httpx = pytest.importorskip("httpx")

import keras_transformer as kt  # noqa: E402
from keras_transformer.generation.settings import SearchSettings  # noqa: E402
from keras_transformer.server.ray_deployment import REPLICA_HEADER, _ReplicaMiddleware, deployment, run  # noqa: E402

needs_ray = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="the Ray Serve deployment needs the ray extra: pip install '.[ray]'"
)

SENTENCES = [
    "Two dogs play in the snow.",
    "A man rides a bike.",
    "A woman is singing.",
    "Children play football.",
    "A little girl eats an ice cream.",
    "The people are waiting for the bus.",
]
APP = "translation"
TIMEOUT_S = 120  # each request's: an answer or an error, never a hang
CLIENTS = 6


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    """`(ray, serve, url)`: two replicas of `multi30k_en_de` (greedy) on a
    two-CPU local Ray, shut down after the tests."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # one machine, on 127.0.0.1
        patch.setenv("RAY_USAGE_STATS_ENABLED", "0")  # nothing leaves the machine
        ray = pytest.importorskip("ray")
        serve = pytest.importorskip("ray.serve", reason="the deployment needs Ray Serve: pip install '.[ray]'")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            assert ray.util.get_node_ip_address() == "127.0.0.1"
            port = _free_port()
            app = deployment(
                ["multi30k_en_de"],
                search=SearchSettings(beam_size=None),
                engine_options={"max_batch_size": 2, "max_source_bucket": 16},
                warm_up=False,
                num_replicas=2,
                max_ongoing_requests=4,
                ray_actor_options={"num_cpus": 1},
                name=APP,
            )
            run(app, port=port, name=APP)
            yield ray, serve, f"http://127.0.0.1:{port}"
        finally:
            serve.shutdown()
            ray.shutdown()


@pytest.fixture(scope="module")
def expected() -> dict[str, str]:
    model = kt.Transformer.from_preset("multi30k_en_de")
    return dict(zip(SENTENCES, model.translate(SENTENCES, beam_size=None)))


class Answer(NamedTuple):
    sentence: str
    status: int | str  # "timeout" where no answer came in time
    replica: str | None
    text: str | None


def _translate(client: httpx.Client, url: str, sentence: str) -> Answer:
    try:
        response = client.post(f"{url}/translate", json={"q": sentence, "source": "en", "target": "de"})
    except httpx.TimeoutException:
        return Answer(sentence, "timeout", None, None)
    text = response.json().get("translatedText") if response.status_code == 200 else None
    return Answer(sentence, response.status_code, response.headers.get(REPLICA_HEADER), text)


def _replica_actor(ray, replica: str):
    """The actor of the replica whose id `X-Serve-Replica` gave (Serve names it `...#<id>`)."""
    names = [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].endswith(f"#{replica}")]
    assert len(names) == 1, f"no single actor of replica {replica!r} among {names}"
    return ray.get_actor(names[0]["name"], namespace=names[0]["namespace"])


@pytest.mark.slow
@needs_ray
def test_both_replicas_answer_as_translate_does(cluster, expected):
    _, _, url = cluster
    replicas = set()
    with httpx.Client(timeout=TIMEOUT_S) as client:
        for attempt in range(40):
            answer = _translate(client, url, SENTENCES[attempt % len(SENTENCES)])
            assert (answer.status, answer.text) == (200, expected[answer.sentence]), answer
            replicas.add(answer.replica)
            if len(replicas) == 2 and attempt >= len(SENTENCES):
                break
    assert None not in replicas and len(replicas) == 2, f"answers came from {replicas} only"


@pytest.mark.slow
@needs_ray
def test_a_killed_replica_is_replaced_and_only_its_requests_fail(cluster, expected):
    ray, serve, url = cluster
    answers, stop = [], threading.Event()

    def load(client_index: int) -> None:
        with httpx.Client(timeout=TIMEOUT_S) as client:
            for count in itertools.count():
                if stop.is_set():
                    return
                answers.append(_translate(client, url, SENTENCES[(client_index + count) % len(SENTENCES)]))

    def replicas() -> set:
        return {answer.replica for answer in answers if answer.replica}

    with ThreadPoolExecutor(CLIENTS) as pool:
        clients = [pool.submit(load, index) for index in range(CLIENTS)]
        try:
            assert _within(120, lambda: len(replicas()) == 2), "the two replicas did not both answer"
            before = replicas()
            ray.kill(_replica_actor(ray, next(iter(before))))
            # Ray starts a new replica (a new id) while the other answers everything.
            assert _within(150, lambda: replicas() - before), "no replacement replica answered"
        finally:
            stop.set()
            for client in clients:
                client.result()

    failed = [answer for answer in answers if answer.status != 200]
    assert failed, "no request was in flight on the killed replica"
    assert all(answer.status in range(500, 600) for answer in failed), failed
    assert [answer for answer in answers if answer.status == 200 and answer.text != expected[answer.sentence]] == []
    [translation] = serve.status().applications[APP].deployments.values()
    assert translation.replica_states.get("RUNNING") == 2, translation.replica_states
    # A 5xx is worth retrying: each failed request, sent again, is answered.
    with httpx.Client(timeout=TIMEOUT_S) as client:
        for answer in failed:
            retried = _translate(client, url, answer.sentence)
            assert (retried.status, retried.text) == (200, expected[answer.sentence]), retried


def _within(seconds: float, condition) -> bool:
    """Whether `condition()` holds at some point in the next `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


# A replica's start-up and answers, without Ray: the middleware over a stand-in app and service.


def test_a_replica_starts_once_its_service_is_ready():
    service, sent = SimpleNamespace(ready=False, warm_up_error=None), []

    async def app(scope, receive, send):
        await send({"type": "lifespan.startup.complete"})

    async def send(message):
        sent.append(message)

    async def start_up() -> list:
        task = asyncio.create_task(_ReplicaMiddleware(app, service, "r1")({"type": "lifespan"}, None, send))
        await asyncio.sleep(0.3)
        before_ready = list(sent)
        service.ready = True
        await asyncio.wait_for(task, 5)
        return before_ready

    assert asyncio.run(start_up()) == [], "the replica reported its start-up before its service was ready"
    assert sent == [{"type": "lifespan.startup.complete"}]


def test_a_replica_whose_warm_up_failed_fails_to_start():
    service = SimpleNamespace(ready=False, warm_up_error=None)

    async def fail_later():
        await asyncio.sleep(0.1)
        service.warm_up_error = RuntimeError("out of memory")

    sent = []

    async def app(scope, receive, send):
        await fail_later()
        await send({"type": "lifespan.startup.complete"})

    async def send(message):
        sent.append(message)

    asyncio.run(asyncio.wait_for(_ReplicaMiddleware(app, service, "r1")({"type": "lifespan"}, None, send), 5))
    assert sent == [{"type": "lifespan.startup.failed", "message": "Warming up failed: out of memory"}]


def test_a_replica_names_itself_in_each_answer():
    sent = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})

    async def send(message):
        sent.append(message)

    service = SimpleNamespace(ready=True, warm_up_error=None)
    asyncio.run(_ReplicaMiddleware(app, service, "r1")({"type": "http"}, None, send))
    assert sent[0]["headers"] == [(b"content-type", b"text/plain"), (REPLICA_HEADER.encode(), b"r1")]
    assert sent[1] == {"type": "http.response.body", "body": b"ok"}
