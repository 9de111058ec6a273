"""The translation service behind the HTTP routes: route, split, batch, answer.

`TranslationService` owns the loaded models' batchers and answers one checked
`TranslateRequest` at a time, from any number of concurrent callers: the
Starlette app (`keras_transformer.server.app`) and each Ray Serve replica
(`keras_transformer.server.ray_deployment`) call it the same way. The event
loop only waits: tokenizing runs in a thread of the default executor, and the
model only in its batcher's thread.

With `source: "auto"`, each text's language is detected
(`keras_transformer.server.detection`) and the text goes to the model of that
language into the target: one request may mix languages, and models.
"""

import asyncio
import contextlib
import logging
import math
import os
import threading
import time
from dataclasses import dataclass

from keras_transformer.generation.sentences import join_sentences
from keras_transformer.generation.translation import join_segments
from keras_transformer.server.alternatives import NBestEngine, variants
from keras_transformer.server.api import ApiError, Limits, TranslateRequest, check_language_tokens
from keras_transformer.server.batcher import Batcher, DeadlineExceeded, Overloaded, Stopped, TooManySentences
from keras_transformer.server.detection import Detection, LanguageDetector
from keras_transformer.server.languages import code, language_name
from keras_transformer.server.markup import HtmlDocument
from keras_transformer.server.metrics import ServerMetrics
from keras_transformer.server.routing import Route, Router, RoutingError, ServedModel

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
        self.detector = LanguageDetector(entry["code"] for entry in self.router.languages())
        self._n_best_batchers: dict[str, Batcher] = {}
        self._n_best_lock = threading.Lock()
        self._ready = threading.Event()
        self._stopped = threading.Event()
        self.warm_up_error: BaseException | None = None

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def start(self, warm_up: bool = True) -> None:
        """Compiles what every model needs to translate anything (unless
        `warm_up` is false) and takes requests; then a thread at the lowest
        priority compiles the larger batch sizes, each used as soon as it is
        ready. Gives up between shapes once `stop()` was called."""
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
        if warm_up:  # not a daemon, for the reason `start_in_background` gives
            threading.Thread(target=self._warm_up_later, name="compile-later").start()

    def _warm_up_later(self) -> None:
        _lower_this_threads_priority()  # requests first: this thread shares the cores with them
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
        # ends without finalization (`cli.startup.end_process`).
        thread = threading.Thread(target=self._start_and_keep_failure, name="warm-up")
        thread.start()
        return thread

    def _start_and_keep_failure(self) -> None:
        with contextlib.suppress(Exception):  # logged, and kept for /health and /translate to say
            self.start()

    def stop(self) -> None:
        """Answers everything queued, then stops the batchers (and a warm-up, after its current shape)."""
        self._stopped.set()
        for batcher in [model.batcher for model in self.models] + list(self._n_best_batchers.values()):
            batcher.stop()

    def health(self) -> tuple[int, dict]:
        """`/health`'s status and body: 200 when ready, else why not (as `translate` refuses)."""
        unavailable = self.unavailable()
        if unavailable is None:
            return 200, {"status": "ok"}
        status = "failed" if self.warm_up_error is not None else "warming up"
        return unavailable.status, {"status": status, "error": unavailable.message}

    def unavailable(self) -> ApiError | None:
        """Why no request can be translated now; `None` once ready."""
        if self.warm_up_error is not None:
            # Not a 503 with Retry-After: retrying will not help until the server is restarted.
            return ApiError(
                500, f"Warming up failed: {self.warm_up_error}; the server cannot translate until it is restarted."
            )
        if not self.ready:
            return ApiError(503, "The server is compiling its models; retry shortly.", {"Retry-After": "5"})
        return None

    def detect(self, text: str) -> list[Detection]:
        """LibreTranslate's `/detect` of one text: the languages it may be in,
        likeliest first. A text of none of them (digits, another language) is
        the first source language at confidence 0, as LibreTranslate falls
        back to English."""
        detections = self.detector.detect(text)
        if detections:
            return detections
        return [Detection(self.router.languages()[0]["code"], 0.0)]

    async def translate(self, request: TranslateRequest) -> dict:
        """LibreTranslate's answer to `request`.

        Raises:
            ApiError: 400 for an unknown language, a text that carries one of the
                model's language tokens or an untranslatable text, 413 for more
                sentences than the queue holds, 429 when the model's queue has
                no room for them now, 503 while warming up or shutting down,
                500 after a failed warm-up, 504 past the deadline.
        """
        if (unavailable := self.unavailable()) is not None:
            raise unavailable
        documents = [HtmlDocument(text) for text in request.texts] if request.text_format == "html" else None
        # What is translated of each text: the text, or a document's texts between its tags.
        parts = [document.texts for document in documents] if documents else [[text] for text in request.texts]
        detected = None
        if request.source == "auto":
            detected = await asyncio.to_thread(lambda: [self.detect(" ".join(texts))[0] for texts in parts])
            sources = [detection.language for detection in detected]
        else:
            sources = [request.source] * len(parts)
        found = [None] * len(parts)  # each text's hypotheses of each part
        groups = {}
        for index, source in enumerate(sources):
            groups.setdefault(source, []).append(index)
        routed = [(self._route(source, request, detected, indices), indices) for source, indices in groups.items()]
        for route, indices in routed:
            if route is None:  # already in the target language
                for index in indices:
                    found[index] = [[text] for text in parts[index]]
        await asyncio.gather(
            *(
                self._translate_parts(route, indices, parts, request.alternatives, found)
                for route, indices in routed
                if route
            )
        )
        answers = []
        for index, hypotheses in enumerate(found):
            join = documents[index].rebuilt if documents else (lambda texts: texts[0])
            answers.append(variants(hypotheses, request.alternatives, join))
        answer = {"translatedText": [texts[0] for texts in answers]}
        if detected is not None:
            answer["detectedLanguage"] = [detection.as_json() for detection in detected]
        if request.alternatives:
            answer["alternatives"] = [texts[1:] for texts in answers]
        return {key: value[0] for key, value in answer.items()} if request.single else answer

    def _route(self, source: str, request: TranslateRequest, detected, indices: list[int]) -> Route | None:
        """The route of texts from `source`; `None` for detected texts already in the target language."""
        try:
            route = self.router.route(source, request.target)
        except RoutingError as error:
            if detected is None:
                raise ApiError(400, str(error)) from None
            if source == code(request.target):
                return None
            where = "q" if request.single else f"q[{indices[0]}]"
            raise ApiError(400, f"{where} reads as {language_name(source)} ({source}): {error}") from None
        if request.alternatives and request.alternatives > route.model.engine.max_alternatives:
            limit = route.model.engine.max_alternatives
            raise ApiError(
                400,
                f"Invalid request: {request.alternatives} alternatives asked, but {route.model.name} gives at "
                f"most {limit}: "
                + (
                    "it decodes greedily (serve it with a beam search, e.g. --beam-size 4)."
                    if limit == 0
                    else f"the other hypotheses of its beam of {limit + 1}."
                ),
            )
        check_language_tokens(request, route.model.token_languages)
        return route

    async def _translate_parts(self, route: Route, indices, parts, alternatives: int, found: list) -> None:
        """Translates the parts of the texts at `indices` along `route`; sets
        `found[index]` to each part's hypotheses (the translation alone
        without `alternatives`)."""
        texts = [text for index in indices for text in parts[index]]
        owners = [index for index in indices for _ in parts[index]]
        engine = route.model.engine
        try:
            segments = await asyncio.to_thread(engine.segments, texts, route.target_language, route.source)
        except (TypeError, ValueError) as error:
            raise ApiError(400, f"Invalid request: {error}") from None
        rows = [segment.token_ids for segment in segments]
        if alternatives:
            hypotheses = await self._decoded(self._n_best_batcher(route.model), rows)
            per_text = [([], []) for _ in texts]  # each text's sentences' hypotheses, and the spacing after each
            for segment, sentence in zip(segments, hypotheses):
                per_text[segment.text_index][0].append(sentence)
                per_text[segment.text_index][1].append(segment.spacing)
            translated = [
                variants(sentences, alternatives, lambda best, spacing=spacing: join_sentences(best, spacing))
                for sentences, spacing in per_text
            ]
        else:
            translated = [
                [text] for text in join_segments(len(texts), segments, await self._decoded(route.model.batcher, rows))
            ]
        for index in indices:
            found[index] = []
        for owner, hypotheses in zip(owners, translated):
            found[owner].append(hypotheses)

    async def _decoded(self, batcher: Batcher, rows: list) -> list:
        """The batcher's translations of `rows`, with its refusals as the API's."""
        try:
            future = batcher.submit(rows)
        except TooManySentences as error:
            raise ApiError(413, str(error)) from None
        except Overloaded as error:
            raise ApiError(429, str(error), {"Retry-After": str(max(1, math.ceil(error.retry_after)))}) from None
        except Stopped as error:
            raise ApiError(503, str(error)) from None
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), self.settings.timeout_s)
        except (asyncio.TimeoutError, DeadlineExceeded):
            batcher.cancel(future)
            raise ApiError(
                504, f"The translation took longer than the server's {self.settings.timeout_s:g} s deadline."
            ) from None
        except asyncio.CancelledError:  # the caller went away or the server cut it: not decoded for nobody
            batcher.cancel(future)
            raise

    def _n_best_batcher(self, model: ServedModel) -> Batcher:
        """The batcher of `model`'s n-best search, started at its first request."""
        with self._n_best_lock:
            if model.name not in self._n_best_batchers:
                batcher = Batcher(
                    NBestEngine(model.engine),
                    max_wait_ms=self.settings.max_wait_ms,
                    max_queue=self.settings.max_queue,
                    timeout_s=self.settings.timeout_s,
                    on_batch=self.metrics.batch_recorder(model.name),
                )
                batcher.start()
                self._n_best_batchers[model.name] = batcher
            return self._n_best_batchers[model.name]


def _lower_this_threads_priority() -> None:
    """The calling thread at the lowest CPU priority (Linux schedules threads
    one by one); elsewhere nothing changes."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


def _log_progress(name: str, done: int, total: int, kind: str = "batch") -> None:
    if done == total or done % max(1, total // 10) == 0:
        logger.info("%s: compiled %d of %d %s shapes", name, done, total, kind)
