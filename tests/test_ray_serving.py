"""The Ray Serve deployment on a local Ray: two replicas of the shipped preset
behind LibreTranslate's routes, and one of them killed under load.

Ray runs on loopback only: with its single-machine mode
(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, read when `ray` is imported) every Ray
process binds and advertises 127.0.0.1, and Serve's proxy listens on
127.0.0.1. So `ray` is imported in the fixture, after that is set.

The replicas run as `keras-transformer serve` does, whatever backend the
tests run on: on JAX, warmed up before they take requests, with a
compilation cache on disk (a folder of the tests' own). The first two fill
it; the replica replacing the killed one finds it warm, and must answer
within issue 54's target for a restart with warm caches, plus what Ray
itself adds and a margin for a shared machine (`REPLACED_WITHIN_S`).
"""

import asyncio
import importlib.util
import itertools
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import pytest

httpx = pytest.importorskip("httpx")

import keras_transformer as kt  # noqa: E402
from keras_transformer.generation.settings import SearchSettings  # noqa: E402
from keras_transformer.server.ray_deployment import (  # noqa: E402
    HEALTH_CHECK_PERIOD_S,
    REPLICA_HEADER,
    BuilderArgs,
    _ReplicaMiddleware,
    deployment,
    replica_actor_options,
    run,
)

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
# After the kill each client waits this long between requests: the replacement
# starts on the two cores that the clients, Serve's proxy and the surviving
# replica share, where on a cluster it would have a node of its own.
PACE_AFTER_KILL_S = 0.25
# Issue 54's target: with warm caches, a restarted server is ready in at most 10 s (one model).
READY_TARGET_S = 10
# What Ray adds to the replica's own start, measured step by step on these 2
# cores (shared with other work): Serve finds the dead replica at its next
# health check (within 1.1 periods), Ray starts a worker process that imports
# Ray (1.7 s), Serve sets its replica up (1.7 s), marks the ready replica
# running and routes a request to it (1.2 s).
RAY_OVERHEAD_S = 1.1 * HEALTH_CHECK_PERIOD_S + 5
# A test bounds the replacement; the speed itself is a benchmark's to measure.
# Under a load of 7-15 on these 2 cores the replacement answered 18.5-22.8 s
# after the kill: the margin keeps a busy CI machine from failing the test.
SHARED_MACHINE_MARGIN_S = 15
REPLACED_WITHIN_S = READY_TARGET_S + RAY_OVERHEAD_S + SHARED_MACHINE_MARGIN_S


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """`(ray, serve, url)`: two replicas of `multi30k_en_de` (greedy) on a
    local Ray of three CPUs, shut down after the tests."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # one machine, on 127.0.0.1
        patch.setenv("RAY_USAGE_STATS_ENABLED", "0")  # nothing leaves the machine
        # The replicas' compilation cache (`deployment` reads where): empty, the first replicas fill it.
        patch.setenv("KERAS_TRANSFORMER_COMPILE_CACHE", str(tmp_path_factory.mktemp("compiled")))
        patch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
        ray = pytest.importorskip("ray")
        serve = pytest.importorskip("ray.serve", reason="the deployment needs Ray Serve: pip install '.[ray]'")
        # A CPU more than the replicas take: the replacement is scheduled as soon as
        # Ray has seen the killed replica's CPU free, whatever else Ray starts.
        ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
        try:
            assert ray.util.get_node_ip_address() == "127.0.0.1"
            port = _free_port()
            app = deployment(
                ["multi30k_en_de"],
                search=SearchSettings(beam_size=None),
                engine_options={"max_batch_size": 2, "max_source_bucket": 16},
                backend="jax",  # the server's default, whatever the tests' backend
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
    at: float  # `time.monotonic()` when it came


def _translate(client: httpx.Client, url: str, sentence: str) -> Answer:
    try:
        response = client.post(f"{url}/translate", json={"q": sentence, "source": "en", "target": "de"})
    except httpx.TimeoutException:
        return Answer(sentence, "timeout", None, None, time.monotonic())
    text = response.json().get("translatedText") if response.status_code == 200 else None
    return Answer(sentence, response.status_code, response.headers.get(REPLICA_HEADER), text, time.monotonic())


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
def test_a_killed_replica_is_replaced_and_only_its_requests_fail_retriably(cluster, expected):
    ray, serve, url = cluster
    answers, stop, killed = [], threading.Event(), threading.Event()

    def load(client_index: int) -> None:
        with httpx.Client(timeout=TIMEOUT_S) as client:
            for count in itertools.count():
                if stop.is_set():
                    return
                if killed.is_set():
                    time.sleep(PACE_AFTER_KILL_S)
                answers.append(_translate(client, url, SENTENCES[(client_index + count) % len(SENTENCES)]))

    def replicas() -> set:
        return {answer.replica for answer in answers if answer.replica}

    with ThreadPoolExecutor(CLIENTS) as pool:
        clients = [pool.submit(load, index) for index in range(CLIENTS)]
        try:
            assert _within(120, lambda: len(replicas()) == 2), "the two replicas did not both answer"
            before = replicas()
            ray.kill(_replica_actor(ray, next(iter(before))))
            killed_at = time.monotonic()
            killed.set()
            # Ray starts a new replica (a new id) while the other answers everything.
            assert _within(REPLACED_WITHIN_S + 60, lambda: replicas() - before), "no replacement replica answered"
        finally:
            stop.set()
            for client in clients:
                client.result()

    # Ray Serve sends a request again to another replica where the killed one
    # had not yet taken it, so how many fail depends on the moment of the kill.
    failed = [answer for answer in answers if answer.status != 200]
    assert all(answer.status in range(500, 600) for answer in failed), failed
    assert [answer for answer in answers if answer.status == 200 and answer.text != expected[answer.sentence]] == []
    [translation] = serve.status().applications[APP].deployments.values()
    assert translation.replica_states.get("RUNNING") == 2, translation.replica_states
    # A 5xx is worth retrying: each failed request, sent again, is answered.
    with httpx.Client(timeout=TIMEOUT_S) as client:
        for answer in failed:
            retried = _translate(client, url, answer.sentence)
            assert (retried.status, retried.text) == (200, expected[answer.sentence]), retried
    # Last, so that a slow machine shows that all else held.
    replaced_after = min(answer.at for answer in answers if answer.replica not in before | {None}) - killed_at
    print(f"replaced {replaced_after:.1f} s after the kill; {len(failed)} of {len(answers)} requests failed")
    assert replaced_after <= REPLACED_WITHIN_S, (
        f"the replacement answered {replaced_after:.1f} s after the kill; the target is {REPLACED_WITHIN_S:.1f} s"
    )


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


# What each replica's process is given before Keras starts.


def test_each_replica_runs_on_jax_with_the_compile_cache_unless_told_otherwise(monkeypatch, tmp_path):
    monkeypatch.setenv("KERAS_TRANSFORMER_COMPILE_CACHE", str(tmp_path))
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    runtime_env = replica_actor_options({"num_cpus": 1})["runtime_env"]
    variables = runtime_env["env_vars"]
    assert variables["KERAS_BACKEND"] == "jax"
    # As `serve` on JAX, the replica's process keeps TensorFlow out.
    assert runtime_env["worker_process_setup_hook"] == "keras_transformer.cli.startup.keep_text_libraries_out"
    if importlib.util.find_spec("jaxlib") is not None:
        folder = Path(variables["JAX_COMPILATION_CACHE_DIR"])
        assert folder.parent == tmp_path and folder.is_dir()

    own = {"num_cpus": 1, "runtime_env": {"env_vars": {"KERAS_BACKEND": "torch", "A": "1"}, "pip": ["x"]}}
    options = replica_actor_options(own, backend="tensorflow")
    assert options["num_cpus"] == 1 and options["runtime_env"]["pip"] == ["x"]
    assert options["runtime_env"]["env_vars"]["KERAS_BACKEND"] == "torch"  # the runtime_env's own comes first
    assert options["runtime_env"]["env_vars"]["A"] == "1"
    assert "worker_process_setup_hook" in options["runtime_env"]  # a torch replica keeps TensorFlow out too
    assert "worker_process_setup_hook" not in replica_actor_options(None, backend="tensorflow")["runtime_env"]
    assert own["runtime_env"]["env_vars"] == {"KERAS_BACKEND": "torch", "A": "1"}, "the caller's options changed"
    assert BuilderArgs.parse({"presets": "multi30k_en_de", "backend": "torch"}).backend == "torch"
    with pytest.raises(ValueError, match="backend must be one of"):
        replica_actor_options(None, backend="numpy")
