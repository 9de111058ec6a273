"""Translate texts with a preset: one output line for each input line.

Texts come from the arguments, from a file (--input, plain or .gz), or
from standard input, one a line; each gives one line on standard output, an
empty line for an empty one. Each sentence of a text is translated on its
own (--source-language names the texts' language, whose abbreviations end
no sentence), unless --whole-texts. Decoding is the paper's beam search (section
6.1) unless --greedy. Reading a file shows a progress
bar on stderr when stderr is a terminal. From standard input, the lines that
have arrived are translated and written at once, and the command waits for
more: one process answers line after line with its model loaded and its
search compiled.

Examples:
    keras-transformer translate --preset multi30k_en_de "Two dogs play in the snow."
    keras-transformer translate --preset multi30k_en_de --input test.en --greedy > test.de
    cat test.en | keras-transformer translate --preset multi30k_en_de --backend jax
    keras-transformer translate --preset hf://Helsinki-NLP/opus-mt-tc-big-gmw-gmw --target-language nld "Hello."
"""

import argparse
import itertools
import sys
import time

from keras_transformer.cli.line_groups import line_groups, with_copies
from keras_transformer.cli.search_options import add_search_arguments, search_settings
from keras_transformer.presets.precision import PRECISIONS, load_model

CHUNK_BATCHES = 8  # batches read, translated and written at a time
# On TensorFlow, inputs of at most this many sentences decode eagerly (`_compile_search`).
EAGER_MAX_SENTENCES = 128


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sentences", nargs="*", help="sentences to translate (default: --input or stdin, one a line)")
    parser.add_argument("--preset", required=True, help="a preset name, a preset directory, or an hf:// handle")
    parser.add_argument("--input", metavar="FILE", help="translate the lines of FILE (plain or .gz; '-' is stdin)")
    add_search_arguments(parser, greedy=True)
    parser.add_argument("--batch-size", type=int, default=32, help="sentences decoded together (default 32)")
    parser.add_argument(
        "--too-long",
        choices=("split", "truncate", "error"),
        default="split",
        help="a sentence longer than the model takes: split it at sentence ends (default), "
        "truncate it with a warning, or stop",
    )
    parser.add_argument(
        "--whole-texts",
        action="store_true",
        help="translate each line whole, not sentence by sentence (for a model trained on lines of several sentences)",
    )
    parser.add_argument(
        "--source-language",
        metavar="LANG",
        help="the ISO 639-1 code of the input's language (e.g. en), whose abbreviations (Dr., z. B.) end no sentence; "
        "by default generic rules",
    )
    parser.add_argument(
        "--compile",
        choices=("auto", "yes", "no"),
        default="auto",
        help="compile the search (XLA) or decode eagerly; auto (default): eagerly on TensorFlow for at most "
        f"{EAGER_MAX_SENTENCES} sentences, where compiling takes longer than translating them",
    )
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="float32",
        help="float32 (default); bfloat16 (Keras' mixed_bfloat16 policy) or int8 (Keras' int8 quantization, "
        "weights a quarter the size; on torch, multiplied by torch's own int8 kernels); both change a "
        "few translations, and on models as small as the Multi30k presets neither is faster than float32",
    )
    parser.add_argument(
        "--target-language",
        metavar="LANG",
        help="for a multilingual model, the language to translate into (e.g. deu): its token (>>deu<<) starts "
        "each sentence that has none; an unknown language lists the model's",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from keras_transformer.utils.errors import UserError

    if args.sentences and args.input:
        raise UserError("give sentences as arguments or --input FILE, not both.")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1; got {args.batch_size}.")
    search = search_settings(args)
    chunks, total = _input_chunks(args)
    model = load_model(args.preset, args.precision)
    # Read by the first search built; the command never trains.
    model.run_eagerly = not _compile_search(args, total)
    show_progress = bool(args.input) and args.input != "-" and not args.quiet and sys.stderr.isatty()
    progress = Progress(total, sys.stderr) if show_progress else None
    few_shapes = _reading_standard_input(args) and _shapes_compile(model)
    for chunk in chunks:
        _translate_chunk(model, chunk, args, search, progress, few_shapes)
    if progress is not None:
        progress.finish()
    return 0


def _compile_search(args: argparse.Namespace, total: int | None) -> bool:
    """Whether to compile the search, for `--compile`.

    A one-shot command pays for the compilation every time it starts. On
    TensorFlow, compiling the search pays off from about
    `EAGER_MAX_SENTENCES` sentences on, so TensorFlow decodes up to that many
    eagerly; JAX compiled faster than it decoded eagerly, even for one
    sentence, and PyTorch always decodes eagerly.
    """
    import keras

    if args.compile != "auto":
        return args.compile == "yes"
    few = total is not None and total <= EAGER_MAX_SENTENCES
    return not (few and keras.config.backend() == "tensorflow")


def _reading_standard_input(args: argparse.Namespace) -> bool:
    return not args.sentences and (not args.input or args.input == "-")


def _input_chunks(args: argparse.Namespace):
    """The input lines in lists of at most `CHUNK_BATCHES * batch_size`, read
    as translation goes, and their count when known in advance (a file),
    for the progress bar. From standard input, a list holds the lines that
    had arrived (`line_groups`)."""
    from keras_transformer.utils.files import read_lines

    most = CHUNK_BATCHES * args.batch_size
    if _reading_standard_input(args):
        return line_groups(sys.stdin.fileno(), most), None
    if args.sentences:
        return _chunks(args.sentences, most), len(args.sentences)
    total = sum(1 for _ in read_lines(args.input))  # also reports bad UTF-8 before any work
    return _chunks(read_lines(args.input), most), total


def _chunks(lines, size: int):
    lines = iter(lines)
    while chunk := list(itertools.islice(lines, size)):
        yield chunk


def _shapes_compile(model) -> bool:
    """Whether each new batch shape compiles a search: not when decoding
    eagerly, nor on PyTorch."""
    import keras

    return not model.run_eagerly and keras.config.backend() != "torch"


def _translate_chunk(
    model, lines: list[str], args: argparse.Namespace, search, progress, few_shapes: bool = False
) -> None:
    """Translates `lines` and writes one line for each; `few_shapes` adds
    copies (`with_copies`), whose translations are left out."""
    translations = model.translate(
        with_copies(lines, args.batch_size) if few_shapes else lines,
        search=search,
        batch_size=args.batch_size,
        too_long=args.too_long,
        verbose=0,  # Keras' progress bar writes to stdout, where the translations go
        target_language=args.target_language,
        split_sentences=not args.whole_texts,
        source_language=args.source_language,
    )
    # A translation never holds a line break, so lines stay one for one.
    sys.stdout.write("".join(t.replace("\n", " ") + "\n" for t in translations[: len(lines)]))
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
