"""The `keras-transformer` command: translate, train, average, evaluate, export, ...

Each subcommand lives in `keras_transformer/cli/commands/<name>.py` with two
functions: `add_arguments(parser)` and `run(args) -> int`; its module
docstring, example included, is its `--help` description. User mistakes are
reported on stderr as one sentence, without a traceback: exit code 1 for a
failure, 2 for wrong usage (argparse's own convention), 0 for success.

`--backend` and the quiet terminal (TensorFlow's native log lines hidden
unless `--verbose` or KERAS_TRANSFORMER_VERBOSE=1) are set up before Keras
starts, by `keras_transformer.cli.startup`.
"""

import argparse
import importlib
import os
import shutil
import sys

from keras_transformer.cli import startup
from keras_transformer.utils.errors import UserError

DESCRIPTION = """\
The Transformer of "Attention Is All You Need" on Keras 3: translate with a
preset, train, average checkpoints, evaluate, export for serving, draw
attention, convert Opus-MT checkpoints. `keras-transformer COMMAND --help`
explains each command.

Example:
    keras-transformer translate --preset multi30k_en_de "Two dogs play in the snow."
"""
# Commands whose --backend picks Keras' backend (export always runs on TensorFlow).
BACKEND_COMMANDS = ("translate", "train", "average", "evaluate", "attention", "convert", "serve")

COMMANDS = {
    "translate": "Translate sentences with a preset.",
    "prepare": "Tokenize a parallel corpus once into shards that train streams.",
    "train": "Train a model on parallel text.",
    "average": "Average the last checkpoints of a run into a preset.",
    "evaluate": "Translate a test set and report sacreBLEU.",
    "export": "Export a preset as a TensorFlow SavedModel for serving.",
    "attention": "Draw a preset's attention weights for one sentence.",
    "upload": "Upload a preset directory to the Hugging Face Hub.",
    "convert": "Convert a Marian (Opus-MT) checkpoint into a preset.",
    "serve": "Serve presets over HTTP with LibreTranslate's API and a web page.",
}


def _commands() -> dict:
    """Each subcommand's module and one-line help."""
    return {
        name: (importlib.import_module(f"keras_transformer.cli.commands.{name}"), help_text)
        for name, help_text in COMMANDS.items()
    }


def build_parser(commands: dict) -> argparse.ArgumentParser:
    verbose_help = f"show TensorFlow's and JAX's own log lines (or set {startup.VERBOSE_VARIABLE}=1)"
    verbose = argparse.ArgumentParser(add_help=False)
    verbose.add_argument("--verbose", dest="native_logs", action="store_true", help=verbose_help)
    # After the command too; SUPPRESS keeps a --verbose given before it.
    sub_verbose = argparse.ArgumentParser(add_help=False)
    sub_verbose.add_argument(
        "--verbose", dest="native_logs", action="store_true", default=argparse.SUPPRESS, help=verbose_help
    )
    backend = argparse.ArgumentParser(add_help=False)
    backend.add_argument(
        "--backend",
        choices=startup.BACKENDS,
        help="Keras' backend (default: KERAS_BACKEND, else tensorflow; serve: else jax where installed)",
    )
    parser = argparse.ArgumentParser(
        prog="keras-transformer",
        description=DESCRIPTION,
        # Wide enough a column that each command's help stays on its line.
        formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(prog, max_help_position=30),
        parents=[verbose],
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in commands.items():
        sub = subparsers.add_parser(
            name,
            help=help_text,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            parents=_parents(name, sub_verbose, backend),
        )
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def _parents(name: str, verbose: argparse.ArgumentParser, backend: argparse.ArgumentParser) -> list:
    """The shared options a command takes after its name."""
    parents = [] if name in startup.OWN_VERBOSE else [verbose]
    return parents + [backend] if name in BACKEND_COMMANDS else parents


def command_line() -> None:
    """The `keras-transformer` program (its console script and `python -m
    keras_transformer.cli`): the start-up before Keras loads, the command,
    and the exit (`keras_transformer.cli.startup`)."""
    argv = sys.argv[1:]
    startup.prepare(argv)
    code = main(argv)
    if startup.command_of(argv) in startup.END_PROCESS_COMMANDS:
        startup.end_process(code)
    sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    """Runs one command (`argv`, else `sys.argv[1:]`) and returns its exit code."""
    commands = _commands()
    startup.after_imports()
    args = build_parser(commands).parse_args(argv)
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    """The command's exit code; a user's mistake is one sentence on stderr."""
    try:
        _check_backend(getattr(args, "backend", None))
        if args.native_logs:
            import keras

            print(f"keras-transformer: Keras {keras.__version__} on {keras.config.backend()}.", file=sys.stderr)
        return int(args.run(args) or 0)
    except (UserError, FileNotFoundError, ValueError, TypeError, OSError) as error:
        if os.environ.get("KERAS_TRANSFORMER_DEBUG"):
            raise
        print(f"keras-transformer {args.command}: error: {_sentence(error)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"keras-transformer {args.command}: interrupted.", file=sys.stderr)
        return 1
    except Exception as error:
        cache = startup.unreadable_compile_cache(error)
        if cache is None or os.environ.get("KERAS_TRANSFORMER_DEBUG"):
            raise
        # Only a cache: emptying it costs a compilation, keeping it fails every run.
        shutil.rmtree(cache, ignore_errors=True)
        print(
            f"keras-transformer {args.command}: error: a compiled program kept in {cache} could not be read "
            f"({_sentence(error).rstrip('.')}); that folder was emptied, "
            "so the command compiles afresh when run again.",
            file=sys.stderr,
        )
        return 1


def _check_backend(requested: str | None) -> None:
    """`--backend` is applied before Keras starts (keras_transformer.cli.startup);
    when `main` is called in a process where Keras already runs, it is too late."""
    if requested is None:
        return
    import keras

    if keras.config.backend() != requested:
        raise UserError(
            f"--backend {requested} comes too late: Keras already runs on {keras.config.backend()} "
            f"in this process; set KERAS_BACKEND={requested} before Python imports Keras."
        )


def _sentence(error: Exception) -> str:
    """One line for the user; an OSError names its file in words, not as
    "[Errno 2] No such file or directory: 'x'"."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"cannot open {error.filename}: {error.strerror.lower()}."
    return " ".join(str(error).split()) or type(error).__name__
