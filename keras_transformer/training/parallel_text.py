"""Reading parallel text: two line-aligned files (plain or `.gz`) or one TSV file, checked.

`read_parallel` reads a corpus into memory and `stream_parallel` yields it
pair by pair (for `keras_transformer.training.shards_reading`); both refuse
mismatched line counts, empty lines and bytes that are not UTF-8 with a
`ValueError` naming the file and line, or, with `skip_bad=True`, skip them
and count them in a `ReadReport`.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Iterator

from keras_transformer.utils.files import decode_message, raw_lines


@dataclasses.dataclass
class ReadReport:
    """What `read_parallel` kept and skipped."""

    pairs: int = 0
    empty: int = 0
    undecodable: int = 0
    unpaired: int = 0

    @property
    def skipped(self) -> int:
        return self.empty + self.undecodable + self.unpaired

    def __str__(self) -> str:
        return (
            f"{self.pairs} pairs read; skipped {self.empty} with an empty side, "
            f"{self.undecodable} not valid UTF-8, {self.unpaired} lines without a partner"
        )


def read_parallel(
    source: str | os.PathLike,
    target: str | os.PathLike | None = None,
    *,
    skip_bad: bool = False,
) -> tuple[list[str], list[str], ReadReport]:
    """Reads sentence pairs from two line-aligned files or one TSV file.

    Args:
        source: the source-language file, one sentence a line (plain or
            `.gz`); or, with `target=None`, a TSV file of `source<TAB>target`
            lines.
        target: the target-language file, line-aligned with `source`.
        skip_bad: `False` raises on the first bad line; `True` skips empty
            pairs, undecodable lines and lines past the end of the shorter
            file, and counts them in the report.

    Returns:
        `(sources, targets, report)`.

    Raises:
        ValueError: naming the file and line of an empty sentence, bytes that
            are not UTF-8, a TSV line without exactly one tab, or the line
            where one file ends before the other (unless `skip_bad`).

    Example:
    >>> import pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "a.tsv").write_text("a dog .\\tein hund .\\n\\tleer\\n")
    >>> sources, targets, report = read_parallel(folder / "a.tsv", skip_bad=True)
    >>> sources, report.empty
    (['a dog .'], 1)
    """
    report = ReadReport()
    sources, targets = [], []
    for source_text, target_text in stream_parallel(source, target, report, skip_bad=skip_bad):
        sources.append(source_text)
        targets.append(target_text)
    return sources, targets, report


def stream_parallel(
    source: str | os.PathLike,
    target: str | os.PathLike | None,
    report: ReadReport,
    *,
    skip_bad: bool = False,
) -> Iterator[tuple[str, str]]:
    """Yields the sentence pairs `read_parallel` returns, one at a time.

    Holds one line of each file at a time, for corpora too large for memory.
    Checks and counts lines as `read_parallel` does (which is built on it),
    into `report`, which is complete once the generator is exhausted.

    Args:
        source, target, skip_bad: as for `read_parallel`.
        report: the `ReadReport` to count into.

    Raises:
        ValueError: as `read_parallel`, when the bad line is reached.
    """

    def checked(number, pair, names):
        for side, name in zip(pair, names):
            if isinstance(side, UnicodeDecodeError):
                if not skip_bad:
                    raise ValueError(decode_message(name, number, side))
                report.undecodable += 1
                return None
        for side, name in zip(pair, names):
            if not side.strip():
                if not skip_bad:
                    raise ValueError(
                        f"{name}, line {number}: empty sentence. Remove the pair, "
                        "or pass skip_bad=True (--skip-bad) to skip and count such lines."
                    )
                report.empty += 1
                return None
        report.pairs += 1
        return pair

    if target is None:
        for number, line in enumerate(_decoded_lines(source), start=1):
            if not isinstance(line, UnicodeDecodeError):
                if line.count("\t") != 1:
                    if not skip_bad:
                        raise ValueError(
                            f"{source}, line {number}: expected 'source<TAB>target' with "
                            f"exactly one tab; found {line.count(chr(9))}."
                        )
                    report.unpaired += 1
                    continue
                line = tuple(line.split("\t"))
            else:
                line = (line, line)
            if pair := checked(number, line, (source, source)):
                yield pair
        return

    missing = object()
    lines = itertools.zip_longest(_decoded_lines(source), _decoded_lines(target), fillvalue=missing)
    for number, pair in enumerate(lines, start=1):
        if missing in pair:
            longer, shorter = (source, target) if pair[1] is missing else (target, source)
            if not skip_bad:
                raise ValueError(
                    f"{shorter} has {number - 1} lines but {longer} goes on at line "
                    f"{number}: the files are not line-aligned."
                )
            report.unpaired += 1
            continue
        if pair := checked(number, pair, (source, target)):
            yield pair


def _decoded_lines(path) -> Iterator[str | UnicodeDecodeError]:
    """Lines as strings, or the decoding error in place of a bad line."""
    for raw in raw_lines(path):
        try:
            yield raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as error:
            yield error
