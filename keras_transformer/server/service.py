"""The translation service behind the HTTP routes: route, split, batch, answer.

`TranslationService` owns the loaded models' batchers and answers one checked
`TranslateRequest` at a time, from any number of concurrent callers: the
Starlette app (`keras_transformer.server.app`) and each Ray Serve replica
(`keras_transformer.server.ray_deployment`) call it the same way. The event
loop only waits: tokenizing runs in a thread of the default executor, and the
model only in its batcher's thread.
"""

import asyncio
import contextlib
import logging
import math
import threading
import time
from dataclasses import dataclass

from keras_transformer.generation.translation import join_segments
from keras_transformer.server.api import ApiError, Limits, TranslateRequest, check_language_tokens
from keras_transformer.server.batcher import Batcher, DeadlineExceeded, Overloaded, Stopped, TooManySentences
from keras_transformer.server.metrics import ServerMetrics
from keras_transformer.server.routing import Router, RoutingError, ServedModel

logger = logging.getLogger("keras_transformer.server")


@dataclass(frozen=True)
class ServiceSettings:
    """How the server batches and sheds load (see `Batcher`).

    Args:
        limits: what one request may hold (`keras_transformer.server.api.Limits`).
        max_wait_ms: how long a sentence waits for others to share its batch.
        max_queue: sentences waiting per model, beyond which requests get 429
            (413 for a request of more sentences than that alone).
        timeout_s: each request's deadline once its body is read (504 past it).
        body_timeout_s: how long a request's body may take to arrive (408 past
            it), so that a stalled client cannot hold the server open.
    """

    limits: Limits = Limits()
    max_wait_ms: float = 5.0
    max_queue: int = 1024
    timeout_s: float = 30.0
    body_timeout_s: float = 10.0


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
        self._stopped = threading.Event()
        self.warm_up_error: BaseException | None = None

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def start(self, warm_up: bool = True) -> None:
        """Compiles what every model needs to translate anything (unless
        `warm_up` is false), takes requests, then compiles the larger batch
        sizes, each used as soon as it is ready; gives up between models (and
        between larger shapes) once `stop()` was called."""
        try:
            for model in self.models:
                if self._stopped.is_set():
                    return
                if warm_up:
                    started = time.monotonic()
                    model.engine.warm_up(lambda done, total, name=model.name: _log_progress(name, done, total))
                    logger.info("%s: ready in %.1f s", model.name, time.monotonic() - started)
                model.batcher.start()
        except BaseException as error:  # /health reports it; the server does not pretend to be ready
            self.warm_up_error = error
            logger.exception("Warming up failed")
            raise
        self._ready.set()
        if warm_up:
            self._warm_up_later()

    def _warm_up_later(self) -> None:
        for model in self.models:
            if self._stopped.is_set():
                return
            try:
                model.engine.warm_up_later(
                    lambda done, total, name=model.name: _log_progress(name, done, total, "larger batch"),
                    stop=self._stopped,
                )
            except Exception:  # the model goes on with the batch sizes it has
                logger.exception("%s: compiling larger batches failed", model.name)

    def start_in_background(self) -> threading.Thread:
        """`start()` in a thread of its own, so that the port answers (503) while the models compile."""
        # Not a daemon: at interpreter exit Python would tear a daemon thread
        # down in the middle of a compiler's native call, which aborts the
        # process ("terminate called ...", exit 134). Exit waits for the model
        # being compiled instead; `keras-transformer serve` does not wait, it
        # ends without finalization (`cli.startup.exit_at_once`).
        thread = threading.Thread(target=self._start_and_keep_failure, name="warm-up")
        thread.start()
        return thread

    def _start_and_keep_failure(self) -> None:
        with contextlib.suppress(Exception):  # logged, and kept for /health and /translate to say
            self.start()

    def stop(self) -> None:
        """Answers everything queued, then stops the batchers (and a warm-up, after its current shape)."""
        self._stopped.set()
        for model in self.models:
            model.batcher.stop()

    def health(self) -> tuple[int, dict]:
        """`/health`'s status and body: 200 when ready, else why not (as `translate` refuses)."""
        unavailable = self._unavailable()
        if unavailable is None:
            return 200, {"status": "ok"}
        status = "failed" if self.warm_up_error is not None else "warming up"
        return unavailable.status, {"status": status, "error": unavailable.message}

    def _unavailable(self) -> ApiError | None:
        """Why no request can be translated now; `None` once ready."""
        if self.warm_up_error is not None:
            # Not a 503 with Retry-After: retrying will not help until the server is restarted.
            return ApiError(
                500, f"Warming up failed: {self.warm_up_error}; the server cannot translate until it is restarted."
            )
        if not self.ready:
            return ApiError(503, "The server is compiling its models; retry shortly.", {"Retry-After": "5"})
        return None

    async def translate(self, request: TranslateRequest) -> dict:
        """LibreTranslate's answer to `request`.

        Raises:
            ApiError: 400 for an unknown language, a text that carries one of the
                model's language tokens or an untranslatable text, 413 for more
                sentences than the queue holds, 429 when the model's queue has
                no room for them now, 503 while warming up or shutting down,
                500 after a failed warm-up, 504 past the deadline.
        """
        if (unavailable := self._unavailable()) is not None:
            raise unavailable
        try:
            route = self.router.route(request.source, request.target)
        except RoutingError as error:
            raise ApiError(400, str(error)) from None
        check_language_tokens(request, route.model.token_languages)
        engine, batcher = route.model.engine, route.model.batcher
        try:
            segments = await asyncio.to_thread(engine.segments, request.texts, route.target_language, route.source)
        except (TypeError, ValueError) as error:
            raise ApiError(400, f"Invalid request: {error}") from None
        try:
            future = batcher.submit([segment.token_ids for segment in segments])
        except TooManySentences as error:
            raise ApiError(413, str(error)) from None
        except Overloaded as error:
            raise ApiError(429, str(error), {"Retry-After": str(max(1, math.ceil(error.retry_after)))}) from None
        except Stopped as error:
            raise ApiError(503, str(error)) from None
        try:
            translations = await asyncio.wait_for(asyncio.wrap_future(future), self.settings.timeout_s)
        except (asyncio.TimeoutError, DeadlineExceeded):
            batcher.cancel(future)
            raise ApiError(
                504, f"The translation took longer than the server's {self.settings.timeout_s:g} s deadline."
            ) from None
        except asyncio.CancelledError:  # the caller went away or the server cut it: not decoded for nobody
            batcher.cancel(future)
            raise
        texts = join_segments(len(request.texts), segments, translations)
        answer = {"translatedText": texts[0] if request.single else texts}
        if request.source == "auto":
            # Not detection: the one language this server translates into the target from.
            detected = {"confidence": 100.0, "language": route.source}
            answer["detectedLanguage"] = detected if request.single else [detected] * len(texts)
        return answer


def _log_progress(name: str, done: int, total: int, kind: str = "batch") -> None:
    if done == total or done % max(1, total // 10) == 0:
        logger.info("%s: compiled %d of %d %s shapes", name, done, total, kind)
