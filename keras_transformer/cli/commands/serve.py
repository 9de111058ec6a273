"""Serve presets over HTTP with LibreTranslate's API and a web page.

Each PRESET is a preset name, a preset directory or an hf:// handle; its
languages are read off its name (`multi30k_en_de`: en -> de, opus-mt-hi-en:
hi -> en) or, for a multilingual Opus-MT model, its >>xxx<< tokens, or given
as PRESET=SOURCES:TARGETS (comma-separated codes). The sentences of
concurrent requests are decoded in shared batches; the server answers
/health with 200 once every batch shape is compiled. It binds 127.0.0.1
unless --host says otherwise. Needs the serve extra: pip install
"keras-transformer[serve]".

Examples:
    keras-transformer serve multi30k_en_de
    keras-transformer serve multi30k_en_de multi30k_en_fr --port 5000 --greedy
    keras-transformer serve hf://Helsinki-NLP/opus-mt-tc-big-gmw-gmw=en,de,nl:en,de,nl --api-keys keys.txt
    curl -s localhost:5000/translate -H 'Content-Type: application/json' \\
        -d '{"q": "Two dogs play in the snow.", "source": "en", "target": "de"}'
"""

import argparse
import logging
import signal
import sys

from keras_transformer.cli.search_options import add_search_arguments, search_settings
from keras_transformer.generation.precision import PRECISIONS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("presets", nargs="+", metavar="PRESET[=SOURCES:TARGETS]", help="the models to serve")
    parser.add_argument("--host", default="127.0.0.1", help="the address to bind (default %(default)s)")
    parser.add_argument("--port", type=int, default=5000, help="the port (default %(default)s, LibreTranslate's)")
    add_search_arguments(parser, greedy=True)
    parser.add_argument("--precision", choices=PRECISIONS, default="float32", help="as in translate")
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
    from keras_transformer.utils.errors import UserError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    for name in ("max_batch_size", "max_batch_tokens", "max_queue", "max_body_bytes"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1; got {getattr(args, name)}.")
    limits = Limits(
        char_limit=None if args.char_limit < 0 else args.char_limit,
        batch_limit=None if args.batch_limit < 0 else args.batch_limit,
        max_body_bytes=args.max_body_bytes,
        api_keys=_read_keys(args.api_keys) if args.api_keys else frozenset(),
    )
    settings = ServiceSettings(limits, max_wait_ms=args.max_wait_ms, max_queue=args.max_queue, timeout_s=args.timeout)
    models = load_served_models(
        args.presets,
        precision=args.precision,
        search=search_settings(args),
        max_batch_size=args.max_batch_size,
        max_batch_tokens=args.max_batch_tokens,
        max_source_bucket=args.max_source_tokens,
        split_sentences=not args.whole_texts,
    )
    app = build_app(models, settings, warm_up=not args.no_warm_up)
    # uvicorn re-raises SIGTERM once it has shut down; ignoring that second
    # one lets a drained server exit 0, as service managers expect.
    signal.signal(signal.SIGTERM, lambda *_: None)
    # No graceful-shutdown timeout: on SIGTERM uvicorn stops accepting and
    # answers every request it holds before the app's batchers stop.
    uvicorn.run(app, host=args.host, port=args.port, log_level="info", timeout_graceful_shutdown=None)
    return 0


def _read_keys(path: str) -> frozenset:
    from keras_transformer.utils.errors import UserError

    with open(path, encoding="utf-8") as file:
        keys = frozenset(line.strip() for line in file if line.strip() and not line.startswith("#"))
    if not keys:
        raise UserError(f"{path} holds no API keys (one a line); leave --api-keys out for an open server.")
    return keys
