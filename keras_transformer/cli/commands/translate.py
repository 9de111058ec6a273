"""Translate sentences with a preset: one output line for each input line.

Sentences come from the arguments, from a file (--input, plain or .gz), or
from standard input, one a line; each gives one line on standard output, an
empty line for an empty one. Decoding is the paper's beam search (beam 4,
length penalty alpha 0.6) unless --greedy. Reading a file shows a progress
bar on stderr when stderr is a terminal.

Examples:
    keras-transformer translate --preset multi30k_en_de "Two dogs play in the snow."
    keras-transformer translate --preset multi30k_en_de --input test.en --greedy > test.de
    cat test.en | keras-transformer translate --preset multi30k_en_de --backend jax
"""

import argparse
import sys
import time

CHUNK_BATCHES = 8  # batches read, translated and written at a time
PRECISIONS = ("float32", "bfloat16", "int8")
# On TensorFlow, inputs of at most this many sentences decode eagerly (`_compile_search`).
EAGER_MAX_SENTENCES = 8


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sentences", nargs="*", help="sentences to translate (default: --input or stdin, one a line)")
    parser.add_argument("--preset", required=True, help="a preset name, a preset directory, or an hf:// handle")
    parser.add_argument("--input", metavar="FILE", help="translate the lines of FILE (plain or .gz; '-' is stdin)")
    search = parser.add_mutually_exclusive_group()
    search.add_argument("--beam-size", type=int, default=4, help="beams per sentence (default 4, the paper's)")
    search.add_argument("--greedy", action="store_true", help="greedy search instead of beam search")
    parser.add_argument("--alpha", type=float, default=0.6, help="length penalty exponent (default 0.6)")
    parser.add_argument("--batch-size", type=int, default=32, help="sentences decoded together (default 32)")
    parser.add_argument(
        "--too-long",
        choices=("split", "truncate", "error"),
        default="split",
        help="a sentence longer than the model takes: split it at sentence ends (default), truncate it with a warning, or stop",
    )
    parser.add_argument(
        "--compile",
        choices=("auto", "yes", "no"),
        default="auto",
        help=f"compile the search (XLA) or decode eagerly; auto (default): eagerly on TensorFlow for at most {EAGER_MAX_SENTENCES} sentences, where compiling takes longer than translating them",
    )
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="float32",
        help="float32 (default); bfloat16 (Keras' mixed_bfloat16 policy) or int8 (Keras' int8 quantization, "
        "weights a quarter the size). Measured on multi30k_en_de: about 0.1 BLEU lower and, on a CPU "
        "without bfloat16 or int8 matrix units, not faster (benchmarks/README.md)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from keras_transformer.utils.errors import UserError

    if args.sentences and args.input:
        raise UserError("give sentences as arguments or --input FILE, not both.")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1; got {args.batch_size}.")
    lines, total = _input_lines(args)
    model = load_model(args.preset, args.precision)
    # Read by the first search built; the command never trains.
    model.run_eagerly = not _compile_search(args, total)
    show_progress = bool(args.input) and args.input != "-" and not args.quiet and sys.stderr.isatty()
    progress = Progress(total, sys.stderr) if show_progress else None
    chunk = []
    for line in lines:
        chunk.append(line)
        if len(chunk) == CHUNK_BATCHES * args.batch_size:
            _translate_chunk(model, chunk, args, progress)
            chunk = []
    if chunk:
        _translate_chunk(model, chunk, args, progress)
    if progress is not None:
        progress.finish()
    return 0


def load_model(preset: str, precision: str = "float32"):
    """The preset's `Transformer` in `precision` (one of `PRECISIONS`)."""
    from keras_transformer import Transformer

    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}; got {precision!r}.")
    # Weights saved in float16 load as float32 unless a dtype is given.
    model = Transformer.from_preset(preset, **({"dtype": "mixed_bfloat16"} if precision == "bfloat16" else {}))
    if precision == "int8":
        model.quantize("int8")
    return model


def _compile_search(args: argparse.Namespace, total: int | None) -> bool:
    """Whether to compile the search, for `--compile`.

    A one-shot command pays for the compilation every time it starts.
    Measured here with multi30k_en_de (beam 4, TensorFlow, 2 threads, end to
    end): one sentence 7.6 s eagerly against 11.4 s compiled (9.0 s with the
    program in the compile cache), 8 sentences 10.9 s both ways, 32 sentences
    12.4-13.4 s eagerly against 12.2 s (9.2 s cached). So TensorFlow decodes
    up to `EAGER_MAX_SENTENCES` eagerly. JAX compiles faster than it runs
    eagerly (5.5 s against 11 s for one sentence) and PyTorch always decodes
    eagerly, so "auto" compiles there.
    """
    import keras

    if args.compile != "auto":
        return args.compile == "yes"
    few = total is not None and total <= EAGER_MAX_SENTENCES
    return not (few and keras.config.backend() == "tensorflow")


def _input_lines(args: argparse.Namespace):
    """The input lines (an iterator, read as translation goes) and their
    count when known in advance (a file), for the progress bar."""
    from keras_transformer.utils.files import read_lines

    if args.sentences:
        return iter(args.sentences), len(args.sentences)
    if args.input and args.input != "-":
        total = sum(1 for _ in read_lines(args.input))  # also reports bad UTF-8 before any work
        return read_lines(args.input), total
    sys.stdin.reconfigure(encoding="utf-8")
    return (line.rstrip("\r\n") for line in sys.stdin), None


def _translate_chunk(model, lines: list[str], args: argparse.Namespace, progress) -> None:
    translations = model.translate(
        lines,
        beam_size=None if args.greedy else args.beam_size,
        alpha=args.alpha,
        batch_size=args.batch_size,
        too_long=args.too_long,
        verbose=0,  # Keras' progress bar writes to stdout, where the translations go
    )
    # A translation never holds a line break, so lines stay one for one.
    sys.stdout.write("".join(t.replace("\n", " ") + "\n" for t in translations))
    sys.stdout.flush()
    if progress is not None:
        progress.add(len(lines))


class Progress:
    """A one-line progress bar, redrawn in place on a terminal stream.

    Example:
    >>> import io
    >>> stream = io.StringIO()
    >>> progress = Progress(4, stream, width=8)
    >>> progress.add(2)
    >>> stream.getvalue().split("\\r")[-1].split(" sentences/s")[0].rsplit(" ", 1)[0]
    '[====    ] 2/4 sentences,'
    """

    def __init__(self, total: int, stream, width: int = 30):
        self.total, self.stream, self.width = total, stream, width
        self.done = 0
        self.start = time.monotonic()

    def add(self, count: int) -> None:
        self.done += count
        filled = self.width * self.done // max(self.total, 1)
        rate = self.done / max(time.monotonic() - self.start, 1e-9)
        bar = "=" * filled + " " * (self.width - filled)
        self.stream.write(f"\r[{bar}] {self.done}/{self.total} sentences, {rate:.1f} sentences/s")
        self.stream.flush()

    def finish(self) -> None:
        self.stream.write("\n")
        self.stream.flush()
