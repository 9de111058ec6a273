"""The translation service behind the HTTP routes: route, split, batch, answer.

`TranslationService` owns the loaded models' batchers and answers one checked
`TranslateRequest` at a time, from any number of concurrent callers: the
Starlette app (`keras_transformer.server.app`) and each Ray Serve replica
(`keras_transformer.server.ray_deployment`) call it the same way. The event
loop only waits: tokenizing runs in a thread of the default executor, and the
model only in its batcher's thread.
"""

import asyncio
import logging
import threading
import time
from dataclasses import dataclass

from keras_transformer.generation.translation import join_segments
from keras_transformer.server.api import ApiError, Limits, TranslateRequest
from keras_transformer.server.batcher import Batcher, DeadlineExceeded, Overloaded, Stopped
from keras_transformer.server.metrics import ServerMetrics
from keras_transformer.server.routing import Router, RoutingError, ServedModel

logger = logging.getLogger("keras_transformer.server")


@dataclass(frozen=True)
class ServiceSettings:
    """How the server batches and sheds load (see `Batcher`).

    Args:
        limits: what one request may hold (`keras_transformer.server.api.Limits`).
        max_wait_ms: how long a sentence waits for others to share its batch.
        max_queue: sentences waiting per model, beyond which requests get 429.
        timeout_s: each request's deadline (504 past it).
    """

    limits: Limits = Limits()
    max_wait_ms: float = 5.0
    max_queue: int = 1024
    timeout_s: float = 30.0


class TranslationService:
    """Translates checked requests with the models of `models`, batching across callers.

    Args:
        models: the `ServedModel`s, each with its `ModelEngine`.
        settings: `ServiceSettings`.
        metrics: where to count (a new `ServerMetrics` by default).
    """

    def __init__(self, models: list[ServedModel], settings: ServiceSettings = ServiceSettings(), metrics=None):
        if not models:
            raise ValueError("The server needs at least one model.")
        self.settings = settings
        self.metrics = metrics or ServerMetrics()
        self.router = Router(models)
        for model in models:
            model.batcher = Batcher(
                model.engine,
                max_wait_ms=settings.max_wait_ms,
                max_queue=settings.max_queue,
                timeout_s=settings.timeout_s,
                on_batch=self.metrics.batch_recorder(model.name),
            )
            self.metrics.watch_queue(model.name, model.batcher)
        self.models = models
        self._ready = threading.Event()
        self.warm_up_error: BaseException | None = None

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def start(self, warm_up: bool = True) -> None:
        """Compiles every model's batch shapes (unless `warm_up` is false), then takes requests."""
        try:
            for model in self.models:
                if warm_up:
                    started = time.monotonic()
                    model.engine.warm_up(lambda done, total, name=model.name: _log_progress(name, done, total))
                    logger.info("%s: warm in %.1f s", model.name, time.monotonic() - started)
                model.batcher.start()
        except BaseException as error:  # /health reports it; the server does not pretend to be ready
            self.warm_up_error = error
            logger.exception("Warming up failed")
            raise
        self._ready.set()

    def start_in_background(self) -> threading.Thread:
        """`start()` in a thread of its own, so that the port answers (503) while the models compile."""
        thread = threading.Thread(target=self.start, name="warm-up", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        """Answers everything queued, then stops the batchers."""
        for model in self.models:
            model.batcher.stop()

    def health(self) -> tuple[int, dict]:
        if self.warm_up_error is not None:
            return 500, {"status": "failed", "error": f"Warming up failed: {self.warm_up_error}"}
        if not self.ready:
            return 503, {"status": "warming up", "error": "The server is compiling its models; retry shortly."}
        return 200, {"status": "ok"}

    async def translate(self, request: TranslateRequest) -> dict:
        """LibreTranslate's answer to `request`.

        Raises:
            ApiError: 400 for an unknown language or an untranslatable text,
                429 when the model's queue is full, 503 while warming up or
                shutting down, 504 past the deadline.
        """
        if not self.ready:
            raise ApiError(503, "The server is warming up; retry shortly.", {"Retry-After": "5"})
        try:
            route = self.router.route(request.source, request.target)
        except RoutingError as error:
            raise ApiError(400, str(error)) from None
        engine, batcher = route.model.engine, route.model.batcher
        try:
            segments = await asyncio.to_thread(engine.segments, request.texts, route.target_language, route.source)
        except (TypeError, ValueError) as error:
            raise ApiError(400, f"Invalid request: {error}") from None
        try:
            future = batcher.submit([segment.token_ids for segment in segments])
        except Overloaded as error:
            raise ApiError(429, str(error), {"Retry-After": str(max(1, round(error.retry_after)))}) from None
        except Stopped as error:
            raise ApiError(503, str(error)) from None
        try:
            translations = await asyncio.wait_for(asyncio.wrap_future(future), self.settings.timeout_s)
        except (asyncio.TimeoutError, DeadlineExceeded):
            batcher.cancel(future)
            raise ApiError(
                504, f"The translation took longer than the server's {self.settings.timeout_s:g} s deadline."
            ) from None
        texts = join_segments(len(request.texts), segments, translations)
        answer = {"translatedText": texts[0] if request.single else texts}
        if request.source == "auto":
            # Not detection: the one language this server translates into the target from.
            detected = {"confidence": 100.0, "language": route.source}
            answer["detectedLanguage"] = detected if request.single else [detected] * len(texts)
        return answer


def _log_progress(name: str, done: int, total: int) -> None:
    if done == total or done % max(1, total // 10) == 0:
        logger.info("%s: compiled %d of %d batch shapes", name, done, total)
