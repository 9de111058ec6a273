"""Serve presets over HTTP with LibreTranslate's API and a web page.

Each PRESET is a preset name, a preset directory or an hf:// handle; its
languages are read off its name (`multi30k_en_de`: en -> de, opus-mt-hi-en:
hi -> en) or, for a multilingual Opus-MT model, its >>xxx<< tokens, or given
as PRESET=SOURCES:TARGETS (comma-separated codes). The sentences of
concurrent requests are decoded in shared batches; the server answers
/health with 200 once every batch shape is compiled. It binds 127.0.0.1
unless --host says otherwise. Needs the serve extra: pip install
"keras-transformer[serve]".

SIGTERM or SIGINT (Ctrl+C), at any point, stops it: it takes no new
requests, answers those it holds (for at most --drain-timeout seconds) and
exits 0. A second signal ends it at once, with the shell's code for that
signal (143 for SIGTERM, 130 for SIGINT). It exits 1, with one line on
stderr, when it cannot start, e.g. when its port is in use.

Examples:
    keras-transformer serve multi30k_en_de
    keras-transformer serve multi30k_en_de multi30k_en_fr --port 5000 --greedy
    keras-transformer serve multi30k_en_de --engine ctranslate2 --precision int8
    keras-transformer serve hf://Helsinki-NLP/opus-mt-tc-big-gmw-gmw=en,de,nl:en,de,nl --api-keys keys.txt
    curl -s localhost:5000/translate -H 'Content-Type: application/json' \\
        -d '{"q": "Two dogs play in the snow.", "source": "en", "target": "de"}'
"""

import argparse
import contextlib
import errno
import logging
import signal
import socket
import sys

from keras_transformer.cli import startup
from keras_transformer.cli.search_options import add_search_arguments, search_settings
from keras_transformer.presets.precision import PRECISIONS
from keras_transformer.utils.errors import UserError

logger = logging.getLogger("keras_transformer.server")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("presets", nargs="+", metavar="PRESET[=SOURCES:TARGETS]", help="the models to serve")
    parser.add_argument("--host", default="127.0.0.1", help="the address to bind (default %(default)s)")
    parser.add_argument("--port", type=int, default=5000, help="the port (default %(default)s, LibreTranslate's)")
    add_search_arguments(parser, greedy=True)
    parser.add_argument(
        "--precision", choices=PRECISIONS, default="float32", help="as in translate (ctranslate2: float32 or int8)"
    )
    parser.add_argument(
        "--engine",
        choices=("keras", "ctranslate2"),
        default="keras",
        help="the decoder: this project's Keras model (default), or the model converted once into a cache "
        'and decoded by CTranslate2 (needs the ctranslate2 extra: pip install "keras-transformer[ctranslate2]")',
    )
    batching = parser.add_argument_group("batching across requests")
    batching.add_argument("--max-batch-size", type=int, default=32, help="sentences per batch (default %(default)s)")
    batching.add_argument(
        "--max-batch-tokens", type=int, default=2048, help="source positions per batch (default %(default)s)"
    )
    batching.add_argument(
        "--max-wait-ms", type=float, default=5.0, help="how long a sentence waits to share a batch (default 5)"
    )
    batching.add_argument(
        "--max-source-tokens",
        type=int,
        default=64,
        help="the widest source compiled, padding included; longer texts are split into sentences (default 64)",
    )
    batching.add_argument(
        "--whole-texts",
        action="store_true",
        help="translate each text whole, not sentence by sentence (for a model trained on lines of several sentences)",
    )
    load = parser.add_argument_group("load and limits")
    load.add_argument(
        "--max-queue", type=int, default=1024, help="sentences waiting per model before 429 (default %(default)s)"
    )
    load.add_argument("--timeout", type=float, default=30.0, help="each request's deadline in seconds (default 30)")
    load.add_argument(
        "--body-timeout",
        type=float,
        default=10.0,
        help="seconds a request's body may take to arrive before 408 (default 10)",
    )
    load.add_argument(
        "--drain-timeout",
        type=float,
        help="seconds the requests in flight get after SIGTERM before they are cut off "
        "(default: --body-timeout plus --timeout, the longest a request takes)",
    )
    load.add_argument(
        "--char-limit", type=int, default=5000, help="characters per request, -1 for none (default %(default)s)"
    )
    load.add_argument(
        "--batch-limit", type=int, default=64, help="texts per request, -1 for none (default %(default)s)"
    )
    load.add_argument("--max-body-bytes", type=int, default=1 << 20, help="request body size (default 1 MiB)")
    load.add_argument("--api-keys", metavar="FILE", help="a file of API keys, one a line: requests need one")
    parser.add_argument("--no-warm-up", action="store_true", help="take requests before compiling every shape")


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from keras_transformer.server import Limits, ServiceSettings, build_app, load_served_models

    stop = _StopOnSignal()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    for name in ("max_batch_size", "max_batch_tokens", "max_queue", "max_body_bytes"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1; got {getattr(args, name)}.")
    for name in ("timeout", "body_timeout", "drain_timeout"):
        if (seconds := getattr(args, name)) is not None and seconds <= 0:
            raise UserError(f"--{name.replace('_', '-')} must be a positive number of seconds; got {seconds}.")
    # Bound before the models load: a port in use is said in one line at once, not after loading.
    listener = _bound_socket(args.host, args.port)
    limits = Limits(
        char_limit=None if args.char_limit < 0 else args.char_limit,
        batch_limit=None if args.batch_limit < 0 else args.batch_limit,
        max_body_bytes=args.max_body_bytes,
        api_keys=_read_keys(args.api_keys) if args.api_keys else frozenset(),
    )
    settings = ServiceSettings(
        limits,
        max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue,
        timeout_s=args.timeout,
        body_timeout_s=args.body_timeout,
    )
    try:
        models = load_served_models(
            args.presets,
            precision=args.precision,
            search=search_settings(args),
            engine=args.engine,
            max_batch_size=args.max_batch_size,
            max_batch_tokens=args.max_batch_tokens,
            max_source_bucket=args.max_source_tokens,
            split_sentences=not args.whole_texts,
        )
    except ImportError as error:  # an engine's extra is missing: the message names it
        raise UserError(str(error)) from error
    app = build_app(models, settings, warm_up=not args.no_warm_up)
    drain = args.drain_timeout if args.drain_timeout is not None else args.body_timeout + args.timeout
    server = _server(uvicorn.Config(app, log_level="info", timeout_graceful_shutdown=drain))
    stop.server = server
    logger.info("Listening on http://%s:%d (Ctrl+C or SIGTERM to stop)", *listener.getsockname()[:2])
    server.run(sockets=[listener])
    return 0


class _StopOnSignal:
    """SIGTERM and SIGINT as a service manager and a terminal expect.

    Before the server runs (models loading) there is nothing to answer: exit
    0 at once. Once it runs, the first signal drains it (uvicorn stops
    accepting, answers the requests it holds within `timeout_graceful_shutdown`,
    then the app's batchers stop) and `run` returns 0; a second one exits at
    once with 128 + the signal's number, the shell's convention for a process
    a signal ended. uvicorn's own handling is not used: it ignores a second
    SIGTERM, and re-raises the signal after its shutdown.
    """

    def __init__(self):
        self.server = None
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, self._handle)

    def _handle(self, number: int, frame) -> None:
        if self.server is None:
            startup.end_process(0)
        if self.server.should_exit:
            logger.warning("Stopped at once by a second signal; requests still open were cut off.")
            startup.end_process(128 + number)
        logger.info("Stopping: no new requests; those in flight are answered first (a second signal stops at once).")
        self.server.should_exit = True


def _server(config):
    """uvicorn's server, leaving the signals to `_StopOnSignal`."""
    import uvicorn

    class Server(uvicorn.Server):
        def capture_signals(self):
            return contextlib.nullcontext()

    return Server(config)


def _bound_socket(host: str, port: int) -> socket.socket:
    """A socket bound to `host:port` for uvicorn to listen on.

    uvicorn's own binding fails only after the app started, and then ends
    the process with exit 3 while the warm-up runs.
    """
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart may rebind at once
    try:
        listener.bind((host, port))
    except OSError as error:
        listener.close()
        reason = (error.strerror or str(error)).lower()
        advice = "; stop what uses it or choose another --port" if error.errno == errno.EADDRINUSE else ""
        raise UserError(f"cannot listen on {host}:{port}: {reason}{advice}.") from None
    return listener


def _read_keys(path: str) -> frozenset:
    with open(path, encoding="utf-8") as file:
        keys = frozenset(line.strip() for line in file if line.strip() and not line.startswith("#"))
    if not keys:
        raise UserError(f"{path} holds no API keys (one a line); leave --api-keys out for an open server.")
    return keys
