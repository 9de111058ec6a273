"""The HTTP server: LibreTranslate's API and a web page, as a Starlette (ASGI) app.

Routes, as LibreTranslate has them, so that its clients work unchanged:

- `POST /translate`: `q` (a string or a list), `source` (a code or
  `"auto"`), `target`, `format` (`"text"` or `"html"`), `alternatives`,
  `api_key`; JSON or form-encoded. Answers `{"translatedText": ...}` in the
  shape of `q`, with `detectedLanguage` for `"auto"` and `alternatives`.
- `POST /detect`: `q` -> `[{"confidence", "language"}]`, likeliest first.
- `POST /translate_file`: a multipart `file` (.txt, .html), `source`,
  `target` -> `{"translatedFileUrl"}`, served by `GET /download_file/<name>`.
- `POST /suggest`: 403, as LibreTranslate answers with suggestions off.
- `GET /languages`: `[{"code", "name", "targets"}]`.
- `GET /health`: 200 `{"status": "ok"}` once every model's batch shapes are
  compiled, enough to translate anything (larger batches compile after);
  503 while warming up; 500 if warming up failed (and `/translate` says the same).
- `GET /frontend/settings`: LibreTranslate's settings of its web page.
- `GET /metrics`: Prometheus' text format.
- `GET /`: the web page.

Errors are `{"error": "..."}` with LibreTranslate's statuses (400, 403, 429,
500) and 408, 413, 415, 503, 504 where HTTP has a more precise one.

Example (tests and `serve` run it under uvicorn):
>>> import keras_transformer as kt
>>> from starlette.testclient import TestClient
>>> app = build_app({"multi30k_en_de": kt.Transformer.from_preset("multi30k_en_de")}, warm_up=False)
>>> with TestClient(app) as client:
...     client.post("/translate", json={"q": "Two dogs play in the snow.", "source": "en", "target": "de"}).json()
{'translatedText': 'Zwei Hunde spielen im Schnee.'}
"""

import asyncio
import contextlib
import importlib.resources
import logging
import time
from collections.abc import Awaitable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from keras_transformer.server.api import (
    ApiError,
    TranslateRequest,
    check_body_size,
    check_characters,
    read_detect_request,
    read_translate_request,
    too_large,
)
from keras_transformer.server.engine import ModelEngine
from keras_transformer.server.files import FILE_FORMATS, FileStore, TextFile, file_format
from keras_transformer.server.languages import language_name
from keras_transformer.server.markup import HtmlDocument
from keras_transformer.server.routing import served_model
from keras_transformer.server.service import ServiceSettings, TranslationService

logger = logging.getLogger("keras_transformer.server")
PAGE = importlib.resources.files("keras_transformer.server").joinpath("page.html")
# LibreTranslate's `--frontend-timeout` default: how long its page waits after typing before it translates.
FRONTEND_TIMEOUT_MS = 500


def build_app(
    models,
    settings: ServiceSettings = ServiceSettings(),
    *,
    engine_options: dict | None = None,
    warm_up: bool = True,
) -> Starlette:
    """The ASGI app serving `models`.

    Args:
        models: `{name: Transformer}` (languages read off each name, see
            `served_model`), or a list of `ServedModel`s.
        settings: batching, load shedding and request limits.
        engine_options: `ModelEngine` keywords for models given by name
            (`search`, `max_batch_size`, `max_batch_tokens`, `max_source_bucket`).
        warm_up: compile every batch shape before `/health` answers 200; at
            start-up, in a background thread, so the port answers meanwhile.
    """
    if isinstance(models, dict):
        models = [
            served_model(name, ModelEngine(model, name=name, **(engine_options or {})))
            for name, model in models.items()
        ]
    return app_of(TranslationService(list(models), settings), warm_up=warm_up)


def app_of(service: TranslationService, warm_up: bool = True) -> Starlette:
    """The Starlette app of a `TranslationService`."""
    limits = service.settings.limits
    files = FileStore()

    def measured(answer):
        """A translating route answering `await answer(request)`, timed and
        counted, with the API's refusals and any failure as `{"error": ...}`."""

        async def route(request: Request) -> Response:
            started = time.monotonic()
            service.metrics.in_flight.inc()
            try:
                response = await _answered(answer, request)
                service.metrics.latency.labels(str(response.status_code)).observe(time.monotonic() - started)
                return response
            finally:
                service.metrics.in_flight.dec()

        return route

    async def _body(request: Request) -> bytes:
        check_body_size(request.headers.get("content-length"), limits)
        return await _read_body(request, limits, service.settings.body_timeout_s)

    async def translate(request: Request) -> Response:
        parsed = read_translate_request(await _body(request), request.headers.get("content-type", ""), limits)
        return JSONResponse(await _unless_disconnected(request, service.translate(parsed)))

    async def detect(request: Request) -> Response:
        texts, single = read_detect_request(await _body(request), request.headers.get("content-type", ""), limits)
        if (unavailable := service.unavailable()) is not None:
            raise unavailable
        found = [[d.as_json() for d in await asyncio.to_thread(service.detect, text)] for text in texts]
        return JSONResponse(found[0] if single else found)

    async def translate_file(request: Request) -> Response:
        check_body_size(request.headers.get("content-length"), limits)
        if not request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
            raise ApiError(415, "Send the file as multipart/form-data, with fields file, source and target.")
        async with request.form(max_files=1, max_part_size=limits.max_body_bytes) as form:
            if limits.api_keys and form.get("api_key") not in limits.api_keys:
                raise ApiError(403, "Invalid API key: send a valid api_key with the request.")
            upload = form.get("file")
            if upload is None or isinstance(upload, str):
                raise ApiError(400, "Invalid request: missing file parameter.")
            try:
                text_format = file_format(upload.filename or "")
            except ValueError as error:
                raise ApiError(400, f"Invalid request: {error}") from None
            content = await upload.read(limits.max_body_bytes + 1)
            source, target = form.get("source"), form.get("target")
        if len(content) > limits.max_body_bytes:
            raise too_large(limits)
        if not source or not target:
            raise ApiError(400, f"Invalid request: missing {'source' if not source else 'target'} parameter.")
        try:
            text = content.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ApiError(400, f"Invalid request: the file is not UTF-8 text (at byte {error.start}).") from None
        document = HtmlDocument(text) if text_format == "html" else TextFile(text)
        texts = [text] if text_format == "html" else document.texts
        check_characters(texts, limits)
        answer = await service.translate(TranslateRequest(texts, False, source, target, text_format))
        translated = answer["translatedText"]
        name = files.save(upload.filename, translated[0] if text_format == "html" else document.rebuilt(translated))
        return JSONResponse({"translatedFileUrl": str(request.url_for("download_file", name=name))})

    async def download_file(request: Request) -> Response:
        name = request.path_params["name"]
        path = files.path(name)
        if path is None:
            return JSONResponse({"error": f"No translated file {name!r} here: translate it with /translate_file."}, 404)
        return FileResponse(path, filename=files.original_name(name))

    async def suggest(request: Request) -> Response:
        return JSONResponse({"error": "Suggestions are disabled on this server."}, 403)

    def answered(answer):
        """A route answering `await answer(request)`, with the API's refusals and any failure as `{"error": ...}`."""

        async def route(request: Request) -> Response:
            return await _answered(answer, request)

        return route

    async def _answered(answer, request: Request) -> Response:
        try:
            return await answer(request)
        except ApiError as error:
            service.metrics.rejected.labels(_reason(error.status)).inc()
            return JSONResponse({"error": error.message}, error.status, headers=error.headers)
        except ClientDisconnect:
            return Response(status_code=499)
        except asyncio.CancelledError:
            # uvicorn cancels the requests still open at its graceful-shutdown
            # deadline, and would answer them 500 with a traceback in the log.
            service.metrics.rejected.labels("unavailable").inc()
            return JSONResponse({"error": "The server shut down before answering; retry."}, 503)
        except HTTPException as error:  # Starlette's refusal of a malformed multipart body
            return JSONResponse({"error": f"Invalid request: {error.detail}"}, error.status_code)
        except Exception as error:  # one request's failure, answered; the server goes on
            logger.exception("Translation failed")
            service.metrics.rejected.labels("error").inc()
            return JSONResponse({"error": f"Translation failed: {type(error).__name__}: {error}"}, 500)

    async def languages(request: Request) -> Response:
        return JSONResponse(service.router.languages())

    async def health(request: Request) -> Response:
        status, body = service.health()
        return JSONResponse(body, status)

    async def frontend_settings(request: Request) -> Response:
        languages = service.router.languages()
        target = next(t for entry in languages for t in entry["targets"])
        return JSONResponse(
            {
                "charLimit": limits.char_limit,
                "batchLimit": limits.batch_limit,
                "frontendTimeout": FRONTEND_TIMEOUT_MS,
                "apiKeys": bool(limits.api_keys),
                "keyRequired": bool(limits.api_keys),
                "suggestions": False,
                "filesTranslation": True,
                "supportedFilesFormat": list(FILE_FORMATS),
                "language": {
                    "source": {"code": "auto", "name": "Auto Detect"},
                    "target": {"code": target, "name": language_name(target)},
                },
            }
        )

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def page(request: Request) -> Response:
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if warm_up:
            service.start_in_background()
        else:  # nothing to compile: ready before the first request
            service.start(warm_up=False)
        yield
        # uvicorn has answered every open request by now (its graceful
        # shutdown); the batchers finish what is left in their queues.
        service.stop()
        files.close()

    app = Starlette(
        routes=[
            Route("/translate", measured(translate), methods=["POST"]),
            Route("/detect", answered(detect), methods=["POST"]),
            Route("/translate_file", measured(translate_file), methods=["POST"]),
            Route("/download_file/{name}", download_file, methods=["GET"]),
            Route("/suggest", suggest, methods=["POST"]),
            Route("/languages", languages, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/frontend/settings", frontend_settings, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/", page, methods=["GET"]),
        ],
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_error, Exception: _internal_error},
    )
    app.state.service = service
    return app


async def _read_body(request: Request, limits, timeout_s: float) -> bytes:
    """The body, refused as soon as it passes the size limit (a missing
    Content-Length does not let a client send more) or takes longer than
    `timeout_s` to arrive (uvicorn has no such deadline: a client that stops
    mid-body would hold its connection, and a shutting-down server, forever)."""

    async def read() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limits.max_body_bytes:
                raise too_large(limits)
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(read(), timeout_s)
    except asyncio.TimeoutError:
        raise ApiError(
            408, f"The request body did not arrive within {timeout_s:g} s; send it whole, without pauses."
        ) from None


async def _unless_disconnected(request: Request, work: Awaitable):
    """`work`'s result, or `ClientDisconnect` once the client has gone away
    first; `work` is then cancelled, so that its sentences leave the queue."""
    answer = asyncio.ensure_future(work)
    left = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({answer, left}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        left.cancel()
        answer.cancel()  # nothing once answered
    if answer not in done:
        raise ClientDisconnect()
    return answer.result()


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body has been read: ASGI's
    `receive` has nothing else to give)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _http_error(request: Request, error: HTTPException) -> Response:
    """Starlette's own refusals (an unknown path, a wrong method) in LibreTranslate's error shape."""
    return JSONResponse({"error": f"{error.detail}: {request.method} {request.url.path}"}, error.status_code)


async def _internal_error(request: Request, error: Exception) -> Response:
    logger.exception("Request failed")
    return JSONResponse({"error": f"Internal error: {type(error).__name__}: {error}"}, 500)


def _reason(status: int) -> str:
    return {403: "forbidden", 429: "overloaded", 500: "error", 503: "unavailable", 504: "deadline"}.get(
        status, "invalid"
    )
