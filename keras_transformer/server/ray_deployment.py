"""The translation server on Ray Serve: replicas of the same models and batcher, placed across a cluster.

Each replica loads the models (`load_served_models`), holds a
`TranslationService` with its batchers, and answers LibreTranslate's routes
with the same Starlette app (`app_of`). Ray Serve's proxies spread requests
over the replicas, hold at most `max_queued_requests` waiting for a free
slot (503 beyond that), and replace a replica that dies; its in-flight
requests get a 5xx, which a client may retry. A replica takes traffic only
once its models are warm, and names itself in each answer's
`X-Serve-Replica` header.

Each replica's process is set up as `keras-transformer serve` sets up its
own before Keras starts (`replica_actor_options`): JAX by default, and the
compiled programs kept on disk (`cli.startup.compile_cache_variables`), so
that a replica replacing another on a node finds them there: it warms up
in seconds.

Needs the `ray` extra (`pip install "keras-transformer[ray]"`), imported
only when an application is built; the package must be installed on every
node of the cluster.

Usage (one machine; on a cluster, `ray.init(address="auto")` first):

    from keras_transformer.server.ray_deployment import deployment, run
    run(deployment(["multi30k_en_de"], num_replicas=2), port=5000)

or from a shell, with Ray's own command line:

    serve run keras_transformer.server.ray_deployment:app_builder presets=multi30k_en_de num_replicas=2
"""

import asyncio
import dataclasses
from typing import TYPE_CHECKING

from keras_transformer.cli.startup import BACKENDS, compile_cache_variables, keep_text_libraries_out
from keras_transformer.generation.settings import SearchSettings
from keras_transformer.server import ServiceSettings, TranslationService, app_of, load_served_models

REPLICA_HEADER = "x-serve-replica"
READY_POLL_S = 0.1
# Serve finds a dead replica only at its next health check of it (Ray's default
# period: 10 s), and starts its replacement then: a check costs the replica a
# call, a later one seconds more of its load on the others.
HEALTH_CHECK_PERIOD_S = 2.0

if TYPE_CHECKING:
    from ray.serve import Application


class TranslationReplica:
    """One replica: the models of `presets` and a `TranslationService` behind
    LibreTranslate's routes (`deployment` makes it a Serve deployment).

    Args:
        presets: `PRESET[=SOURCES:TARGETS]` specs (see `parse_model_spec`).
        settings: batching, load shedding and request limits of the replica.
        precision, search, engine_options: as `load_served_models` takes them.
        warm_up: compile every batch shape before the replica takes requests.
    """

    def __init__(
        self,
        presets: list[str],
        settings: ServiceSettings,
        precision: str,
        search: SearchSettings | None,
        engine_options: dict,
        warm_up: bool,
    ):
        models = load_served_models(presets, precision=precision, search=search, **engine_options)
        self.service = TranslationService(models, settings)
        self.warm_up = warm_up

    def __serve_build_asgi_app__(self):
        """Serve's hook for an app built in the replica: the server's own, named after the replica."""
        from ray import serve

        app = app_of(self.service, warm_up=self.warm_up)
        app.add_middleware(_ReplicaMiddleware, service=self.service, replica=serve.get_replica_context().replica_tag)
        return app


class _ReplicaMiddleware:
    """Finishes the app's start-up only once its service is ready, so that Ray
    routes no request to a replica still compiling; and names the replica in
    each answer."""

    def __init__(self, app, service: TranslationService, replica: str):
        self.app = app
        self.service = service
        self.replica_header = (REPLICA_HEADER.encode(), replica.encode())

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            await self.app(scope, receive, self._ready_before_started(send))
        elif scope["type"] == "http":
            await self.app(scope, receive, self._named(send))
        else:
            await self.app(scope, receive, send)

    def _ready_before_started(self, send):
        async def send_when_ready(message):
            if message["type"] == "lifespan.startup.complete":
                while not self.service.ready and self.service.warm_up_error is None:
                    await asyncio.sleep(READY_POLL_S)
                if self.service.warm_up_error is not None:
                    error = self.service.warm_up_error
                    message = {"type": "lifespan.startup.failed", "message": f"Warming up failed: {error}"}
            await send(message)

        return send_when_ready

    def _named(self, send):
        async def send_named(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.replica_header]}
            await send(message)

        return send_named


def deployment(
    presets: list[str],
    *,
    settings: ServiceSettings | None = None,
    precision: str = "float32",
    search: SearchSettings | None = None,
    engine_options: dict | None = None,
    warm_up: bool = True,
    backend: str = "jax",
    num_replicas: int | None = None,
    autoscaling_config: dict | None = None,
    max_ongoing_requests: int = 64,
    max_queued_requests: int = 256,
    health_check_period_s: float = HEALTH_CHECK_PERIOD_S,
    ray_actor_options: dict | None = None,
    name: str = "translation",
) -> "Application":
    """The Serve application of replicas each serving `presets` (start it with `run` or `serve.run`).

    Args:
        presets, settings, precision, search, engine_options, warm_up: see `TranslationReplica`
            (`settings`: `ServiceSettings()` by default).
        backend: the replicas' Keras backend (JAX by default, as `serve`'s:
            its compiled programs are the smallest in memory).
        num_replicas: a fixed number of replicas (Ray's default, 1, where
            neither this nor `autoscaling_config` is given).
        autoscaling_config: Ray Serve's, e.g. `{"min_replicas": 1,
            "max_replicas": 4, "target_ongoing_requests": 16}`, instead of
            `num_replicas`.
        max_ongoing_requests: requests one replica holds at once; its batcher
            shares batches among these only, so give it room to fill them.
        max_queued_requests: requests waiting for a free replica beyond which
            Ray Serve answers 503 (-1 for no limit).
        health_check_period_s: how often Serve asks each replica whether it
            lives: a dead replica is found, and replaced, at the next check.
        ray_actor_options: each replica's resources and runtime environment,
            e.g. `{"num_cpus": 4, "runtime_env": {"env_vars": {"KERAS_TRANSFORMER_COMPILE_CACHE": "/shared"}}}`
            (see `replica_actor_options` for what is added).
        name: the deployment's name in Ray's dashboard and `serve.status()`.
    """
    from ray import serve

    if num_replicas is not None and autoscaling_config is not None:
        raise ValueError("Give num_replicas or autoscaling_config, not both: autoscaling sets the replica count.")
    options = {"num_replicas": num_replicas, "autoscaling_config": autoscaling_config}
    options = {key: value for key, value in options.items() if value is not None}
    replicas = serve.deployment(
        serve.ingress()(TranslationReplica),
        name=name,
        max_ongoing_requests=max_ongoing_requests,
        max_queued_requests=max_queued_requests,
        health_check_period_s=health_check_period_s,
        ray_actor_options=replica_actor_options(ray_actor_options, backend),
        **options,
    )
    settings = settings or ServiceSettings()
    return replicas.bind(list(presets), settings, precision, search, dict(engine_options or {}), warm_up)


def replica_actor_options(ray_actor_options: dict | None, backend: str = "jax") -> dict:
    """`ray_actor_options` with what `keras-transformer serve` sets up before
    Keras starts (`cli.startup.prepare`), as environment variables of each
    replica's new process: `backend` as `KERAS_BACKEND`, and the on-disk
    compilation caches (`compile_cache_variables`: the folders this process
    finds, so on a cluster a path every node can write), keeping every
    program the replica compiles; on JAX and torch, TensorFlow kept out
    (`keep_text_libraries_out`, as the worker's setup hook). The
    runtime_env's own `env_vars` and hook come first.

    E.g. `replica_actor_options({"num_cpus": 1})` is `{"num_cpus": 1,
    "runtime_env": {"env_vars": {"KERAS_BACKEND": "jax", "JAX_COMPILATION_CACHE_DIR": ..., ...}}}`.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}.")
    options = dict(ray_actor_options or {})
    runtime_env = dict(options.get("runtime_env") or {})
    env_vars = {
        "KERAS_BACKEND": backend,
        **compile_cache_variables(),  # every program kept, as `serve` keeps them
        **runtime_env.get("env_vars", {}),
    }
    options["runtime_env"] = {**runtime_env, "env_vars": env_vars}
    if env_vars["KERAS_BACKEND"] != "tensorflow" and "worker_process_setup_hook" not in runtime_env:
        # As `serve`: TensorFlow, most of a replica's memory and seconds of its
        # start, stays out of a JAX or torch replica.
        hook = f"{keep_text_libraries_out.__module__}.{keep_text_libraries_out.__name__}"
        options["runtime_env"]["worker_process_setup_hook"] = hook
    return options


def run(
    app: "Application", *, host: str = "127.0.0.1", port: int = 5000, name: str = "translation", blocking: bool = False
):
    """Starts Serve's HTTP proxies on `host:port` (Serve keeps those of a
    running instance) and deploys `app` at `/`; returns its `DeploymentHandle`."""
    from ray import serve

    serve.start(http_options={"host": host, "port": port})
    return serve.run(app, name=name, route_prefix="/", blocking=blocking)


@dataclasses.dataclass(frozen=True)
class BuilderArgs:
    """The arguments of `serve run ...:app_builder key=value ...`, or of a
    Serve config file's `args`: presets separated by spaces."""

    presets: tuple[str, ...]
    num_replicas: int = 1
    max_ongoing_requests: int = 64
    max_queued_requests: int = 256
    precision: str = "float32"
    engine: str = "keras"
    greedy: bool = False
    max_batch_size: int = 32
    max_source_tokens: int = 64
    warm_up: bool = True
    backend: str = "jax"

    @classmethod
    def parse(cls, args: dict) -> "BuilderArgs":
        """The arguments of `args`, each given as its type or, as `serve run` passes them, a string."""
        types = {field.name: field.type for field in dataclasses.fields(cls)}
        unknown = sorted(set(args) - set(types))
        if unknown:
            raise ValueError(f"Unknown arguments {unknown}: app_builder takes {sorted(types)}.")
        if "presets" not in args:
            raise ValueError("Give the models to serve: presets='PRESET[=SOURCES:TARGETS] ...'.")
        return cls(**{name: _converted(name, types[name], value) for name, value in args.items()})


def _converted(name: str, kind, value):
    if not isinstance(value, str):
        return tuple(value) if name == "presets" else value
    if name == "presets":
        return tuple(value.split())
    if kind is bool:
        if value.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"{name} must be true or false; got {value!r}.")
        return value.lower() in ("true", "1")
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{name} must be {kind.__name__}; got {value!r}.") from None


def app_builder(args: dict) -> "Application":
    """The application of `serve run` and `serve deploy` (see `BuilderArgs`), e.g.
    `serve run keras_transformer.server.ray_deployment:app_builder presets=multi30k_en_de num_replicas=2`."""
    parsed = BuilderArgs.parse(args)
    return deployment(
        list(parsed.presets),
        precision=parsed.precision,
        search=SearchSettings(beam_size=None) if parsed.greedy else None,
        engine_options={
            "engine": parsed.engine,
            "max_batch_size": parsed.max_batch_size,
            "max_source_bucket": parsed.max_source_tokens,
        },
        warm_up=parsed.warm_up,
        backend=parsed.backend,
        num_replicas=parsed.num_replicas,
        max_ongoing_requests=parsed.max_ongoing_requests,
        max_queued_requests=parsed.max_queued_requests,
    )


__all__ = ["BuilderArgs", "TranslationReplica", "app_builder", "deployment", "replica_actor_options", "run"]
