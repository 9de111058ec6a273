"""What the command line sets up before Keras starts, and how `serve` ends.

`cli.main.command_line` calls `prepare(argv)` before anything imports Keras
(the package's `__init__` imports neither Keras nor TensorFlow), and
`after_imports()` once the command's modules are imported. Used as a
library, the package changes nothing of this. `prepare`:

- sets `KERAS_BACKEND` from `--backend`, as Keras reads it once, on import
  (TensorFlow for `export`; JAX for `serve` where installed and not set);
- keeps compiled programs on disk between runs, with TensorFlow's and JAX's
  own persistent caches, in `$XDG_CACHE_HOME/keras_transformer/compiled/`
  (`~/.cache/...`), a folder per library version;
  `KERAS_TRANSFORMER_COMPILE_CACHE=DIR` puts them in DIR, `=0` turns the
  cache off. A damaged file there stops TensorFlow: `cli.main` then says so
  in one sentence and empties the folder;
- for `translate` and `serve`, refuses `OPTIONAL_IMPORTS` while the package
  imports, and on JAX and torch `TEXT_LIBRARIES` for good, as if they were
  not installed;
- keeps TensorFlow's and XLA's native log lines ("I0000 ... cudart_stub.cc
  ...") off the terminal: file descriptor 2 becomes a pipe whose lines reach
  the real stderr unless they have the native log format. Python's own
  stderr writes to the real one directly. `--verbose` (before the command,
  or after it but for `train`) or `KERAS_TRANSFORMER_VERBOSE=1` keeps them.

`end_process` ends `serve` without Python's finalization.
"""

import atexit
import contextlib
import importlib.metadata
import importlib.util
import io
import json
import logging
import os
import re
import sys
import threading
from pathlib import Path
from typing import NoReturn

from keras_transformer.utils.files import cache_home

VERBOSE_VARIABLE = "KERAS_TRANSFORMER_VERBOSE"
COMPILE_CACHE_VARIABLE = "KERAS_TRANSFORMER_COMPILE_CACHE"
BACKENDS = ("tensorflow", "jax", "torch")
# Commands whose own --verbose means something else: train's is Keras'
# verbosity (0, 1, 2), so there the global flag goes before the command.
OWN_VERBOSE = ("train",)

# The line formats of absl/TSL logging (current and TensorFlow < 2.16) and of
# TensorFlow's CPU-feature notice, filtered because TensorFlow 2.19 and later
# write them before reading TF_CPP_MIN_LOG_LEVEL: no setting silences them.
# Fatal ("F") lines are kept: they explain a crash.
NATIVE_LOG_LINE = re.compile(
    rb"^(?:[IWE]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [^\]]*\] "
    rb"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWE] "
    rb"|WARNING: All log messages before absl::InitializeLog\(\) is called"
    rb"|To enable the following instructions: )"
)

# Imported only inside `try: ... except ImportError` by TensorFlow, Keras or
# KerasHub, for what `translate` and `serve` never do: TensorFlow Lite's
# conversion of JAX functions, Keras' notebook display and image plots,
# KerasHub's grain datasets and Kaggle downloads, Keras' pandas inputs to `fit`.
# JAX stays importable when it is the backend. Refusing them was measured to
# shorten `translate`'s imports (pandas alone) and to lower `serve`'s resident
# memory before it compiles anything.
OPTIONAL_IMPORTS = ("jax", "IPython", "matplotlib", "grain", "kagglehub", "pandas")

# Kept out of `translate` and `serve` on JAX and torch for the whole process:
# there they only tokenize, which KerasHub and `marian.python_tokenization` do
# with `sentencepiece` instead, and TensorFlow alone is most of a served
# model's resident memory.
TEXT_LIBRARIES = ("tensorflow", "tensorflow_text")
LEAN_COMMANDS = ("translate", "serve")
# `serve` may be stopped while its warm-up thread compiles, which Python's
# finalization would wait for (a non-daemon thread) or tear down mid-call (a
# daemon one: an abort), so it ends with `end_process`.
END_PROCESS_COMMANDS = ("serve",)

_filter = {}  # the installed filter: the real stderr's descriptor and the thread
_refused = []  # what `prepare` refused until `after_imports`


def verbose_requested(argv: list[str]) -> bool:
    """`--verbose` before the command, or after it for a command whose own
    `--verbose` is not something else, or the environment variable."""
    if os.environ.get(VERBOSE_VARIABLE, "") not in ("", "0"):
        return True
    command = command_of(argv)
    if command is None or command in OWN_VERBOSE:
        return "--verbose" in argv[: argv.index(command) if command else len(argv)]
    return "--verbose" in argv


def option_value(argv: list[str], name: str) -> str | None:
    """The value of `--name VALUE` or `--name=VALUE` in `argv`, or None."""
    for index, argument in enumerate(argv):
        if argument == name and index + 1 < len(argv):
            return argv[index + 1]
        if argument.startswith(name + "="):
            return argument.split("=", 1)[1]
    return None


def command_of(argv: list[str]) -> str | None:
    """The subcommand: the first argument that is not an option."""
    return next((a for a in argv if not a.startswith("-")), None)


def prepare(argv: list[str]) -> None:
    """Applies, for the command line `argv`, what the module docstring lists.

    Call before Keras is imported, and `after_imports()` after; a wrong
    `--backend` is left for the argument parser to report.
    """
    backend = "tensorflow" if command_of(argv) == "export" else option_value(argv, "--backend")
    if backend is None and command_of(argv) == "serve" and not os.environ.get("KERAS_BACKEND"):
        # The server's compiled programs take a fraction of TensorFlow's memory
        # on JAX (keras_transformer.server.programs); the serve extra installs it.
        backend = "jax" if importlib.util.find_spec("jax") is not None else None
    if backend in BACKENDS:
        os.environ["KERAS_BACKEND"] = backend
    use_compile_cache()
    if command_of(argv) in LEAN_COMMANDS:
        refuse_optional_imports(needs_kaggle=any(arg.startswith("kaggle://") for arg in argv))
        if configured_backend() in ("jax", "torch"):
            keep_text_libraries_out()
    if verbose_requested(argv):
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # older TensorFlow honours it
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    # Python-side loggers of TensorFlow, absl and JAX (JAX reports "no GPU
    # found" as a warning).
    for name in ("tensorflow", "absl", "jax"):
        logging.getLogger(name).setLevel(logging.ERROR)
    install_native_log_filter()


def keep_text_libraries_out() -> None:
    """Makes `TEXT_LIBRARIES` fail to import for the rest of the process, as
    if not installed (those imported already stay): a process that translates
    on JAX or torch then tokenizes with `sentencepiece`. Call before
    KerasHub is imported."""
    for name in TEXT_LIBRARIES:
        sys.modules.setdefault(name, None)  # `import name` raises ImportError


def refuse_optional_imports(needs_kaggle: bool = False) -> None:
    """Makes `OPTIONAL_IMPORTS` (not JAX when it may be the backend, nor
    kagglehub for a `kaggle://` preset, which KerasHub downloads with it) fail
    as if not installed, until `after_imports()`; modules imported already stay."""
    backend = configured_backend()
    for name in OPTIONAL_IMPORTS:
        if name == "jax" and backend not in ("tensorflow", "torch"):
            continue
        if name == "kagglehub" and needs_kaggle:
            continue
        if name not in sys.modules:
            sys.modules[name] = None  # `import name` raises ImportError
            _refused.append(name)


def configured_backend() -> str | None:
    """The backend Keras will start, read where Keras reads it (KERAS_BACKEND,
    else `keras.json` in KERAS_HOME or `~/.keras`, else TensorFlow); None
    when that file cannot be read."""
    if os.environ.get("KERAS_BACKEND"):
        return os.environ["KERAS_BACKEND"]
    home = os.path.expanduser("~")
    folder = os.environ.get("KERAS_HOME") or os.path.join(home if os.access(home, os.W_OK) else "/tmp", ".keras")
    try:
        with open(os.path.join(folder, "keras.json"), encoding="utf-8") as file:
            return json.load(file).get("backend", "tensorflow")
    except FileNotFoundError:
        return "tensorflow"
    except (OSError, ValueError, AttributeError):
        return None


def after_imports() -> None:
    """Makes the modules `prepare` refused importable again. Does nothing
    where `prepare` did not run (the package used as a library)."""
    for name in _refused:
        if sys.modules.get(name, False) is None:
            del sys.modules[name]
    _refused.clear()


def end_process(code: int) -> NoReturn:
    """Ends the process with `code` without Python's finalization (which
    would wait for, or tear down, threads still running): standard output and
    error are flushed and the exit handlers run first (the native log filter
    forwards what is left, logging flushes its handlers). Files the process
    still has open are not flushed: call it when none is being written."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    atexit._run_exitfuncs()  # Python's atexit offers no public call that runs the handlers
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
    os._exit(code)


def compile_cache_root() -> Path | None:
    """Where compiled programs are kept (see the module docstring), or None
    when `KERAS_TRANSFORMER_COMPILE_CACHE=0`."""
    setting = os.environ.get(COMPILE_CACHE_VARIABLE, "")
    if setting == "0":
        return None
    if setting:
        return Path(setting).expanduser()
    return cache_home() / "compiled"


def use_compile_cache() -> None:
    """Points TensorFlow's and JAX's persistent compilation caches at
    `compile_cache_root()` (`compile_cache_variables`). Both read these
    variables when they start, so this runs before they import."""
    os.environ.update(compile_cache_variables())


def compile_cache_variables() -> dict[str, str]:
    """The environment variables that point TensorFlow's and JAX's persistent
    compilation caches at `compile_cache_root()`, their folders created;
    none that the user configured already, nor where a folder cannot be
    created. The Ray deployment gives them to each replica's process.

    A folder per library version: a program compiled by one XLA is never
    loaded by another. (JAX's cache keys include its version; TensorFlow's
    are a fingerprint of the program only.)
    """
    root = compile_cache_root()
    variables = {}
    if root is None:
        return variables
    for library, variable, flag in (
        ("tensorflow", "TF_XLA_FLAGS", "--tf_xla_persistent_cache_directory"),
        ("jaxlib", "JAX_COMPILATION_CACHE_DIR", None),
    ):
        try:
            folder = root / f"{library}-{importlib.metadata.version(library)}"
        except importlib.metadata.PackageNotFoundError:
            continue
        current = os.environ.get(variable, "")
        if (flag in current) if flag else current:
            continue  # the user's own setting
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            return variables  # an unwritable home: run without the cache
        variables[variable] = f"{current} {flag}={folder}".strip() if flag else str(folder)
    # JAX caches only programs that took a second to compile; the weights'
    # initializers and a server's small batch shapes take less, and a model
    # loading compiled its initializers again at every start.
    if "JAX_COMPILATION_CACHE_DIR" in variables and "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        variables["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    return variables


def unreadable_compile_cache(error: BaseException) -> Path | None:
    """TensorFlow's cache folder when `error` is TensorFlow failing to read
    a compiled program from it (a damaged file: TensorFlow stops there,
    where JAX warns and compiles), else None."""
    reading_failed = type(error).__name__ in ("OutOfRangeError", "DataLossError")
    if not (reading_failed and type(error).__module__.startswith("tensorflow")):
        return None
    flag = "--tf_xla_persistent_cache_directory="
    folders = [Path(f[len(flag) :]) for f in os.environ.get("TF_XLA_FLAGS", "").split() if f.startswith(flag)]
    root = compile_cache_root()
    # Only a folder this package chose: a cache the user set up is theirs to clear.
    return folders[-1] if folders and root is not None and root in folders[-1].parents else None


def install_native_log_filter() -> None:
    """Drops native log lines written to file descriptor 2 (see the module
    docstring). Idempotent; undone at exit."""
    if _filter or not hasattr(os, "pipe"):
        return
    try:
        sys.stderr.flush()
        real_stderr = os.dup(2)
    except (OSError, ValueError, AttributeError):
        return  # no usable stderr (e.g. a GUI launcher): nothing to filter
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    sys.stderr = io.TextIOWrapper(
        io.FileIO(real_stderr, "w", closefd=False),
        encoding=getattr(sys.stderr, "encoding", None) or "utf-8",
        errors="backslashreplace",
        line_buffering=True,
        write_through=False,  # whole lines: print() writes text and "\n" separately
    )
    thread = threading.Thread(target=_forward, args=(read_end, real_stderr), daemon=True, name="native-log-filter")
    thread.start()
    _filter.update(real_stderr=real_stderr, thread=thread)
    atexit.register(_remove_filter)


def _forward(read_end: int, real_stderr: int) -> None:
    pending = b""
    while chunk := os.read(read_end, 65536):
        *lines, pending = (pending + chunk).split(b"\n")
        kept = b"".join(line + b"\n" for line in lines if not NATIVE_LOG_LINE.match(line))
        if kept:
            os.write(real_stderr, kept)
    if pending and not NATIVE_LOG_LINE.match(pending):
        os.write(real_stderr, pending)
    os.close(read_end)


def _remove_filter() -> None:
    """Points descriptor 2 back at the real stderr; the pipe's last writer
    closes with it, so the thread forwards what is left and ends."""
    sys.stderr.flush()
    os.dup2(_filter["real_stderr"], 2)
    _filter["thread"].join(timeout=2)
