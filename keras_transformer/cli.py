"""The `keras-transformer` command: translate, train, average, evaluate, upload.

Each subcommand lives in `keras_transformer/commands/<name>.py` with two
functions: `add_arguments(parser)` and `run(args) -> int`. User mistakes are
reported on stderr as one sentence, without a traceback: exit code 1 for a
failure, 2 for wrong usage (argparse's own convention), 0 for success.
"""

import argparse
import importlib
import os
import sys

from keras_transformer.errors import UserError

COMMANDS = {
    "translate": "Translate sentences with a preset.",
    "train": "Train a model on parallel text.",
    "average": "Average the last checkpoints of a run into a preset.",
    "evaluate": "Translate a test set and report sacreBLEU.",
    "export": "Export a preset as a TensorFlow SavedModel for serving.",
    "attention": "Draw a preset's attention weights for one sentence.",
    "upload": "Upload a preset directory to the Hugging Face Hub.",
}


def _commands() -> dict:
    """Each subcommand's module and one-line help."""
    return {
        name: (importlib.import_module(f"keras_transformer.commands.{name}"), help_text)
        for name, help_text in COMMANDS.items()
    }


def build_parser(commands: dict) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="keras-transformer",
        description="The Transformer of 'Attention Is All You Need' on Keras 3.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in commands.items():
        sub = subparsers.add_parser(name, help=help_text, description=module.__doc__)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = build_parser(_commands())
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except (UserError, FileNotFoundError, ValueError, TypeError, OSError) as error:
        if os.environ.get("KERAS_TRANSFORMER_DEBUG"):
            raise
        print(f"keras-transformer {args.command}: error: {_sentence(error)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"keras-transformer {args.command}: interrupted.", file=sys.stderr)
        return 1


def _sentence(error: Exception) -> str:
    """One line for the user; an OSError names its file in words, not as
    "[Errno 2] No such file or directory: 'x'"."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"cannot open {error.filename}: {error.strerror.lower()}."
    return " ".join(str(error).split()) or type(error).__name__


if __name__ == "__main__":
    sys.exit(main())
