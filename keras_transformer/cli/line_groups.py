"""Lines of a pipe or terminal in groups, each handed on as soon as it is complete.

`translate` reading standard input translates whatever lines have arrived,
writes their translations and waits for more: a line typed at a terminal
comes back at once, while a file piped in arrives faster than it is
translated and comes in full groups, batched as a file is. Reading is
`os.read` on the descriptor, not Python's buffered `sys.stdin`, whose
iteration waits to fill its buffer, so `select` can tell whether more is
there without waiting. A compiled search is compiled once per batch shape,
so `with_copies` brings a group to one of a few sizes.
"""

import os
import select
from collections.abc import Iterator

READ_SIZE = 1 << 16  # a pipe's buffer on Linux


def line_groups(fd: int, most: int, name: str = "standard input") -> Iterator[list[str]]:
    """The lines read from file descriptor `fd` in groups of at most `most`.

    Each group holds the complete lines that had arrived when it was asked
    for; reading waits only when none has. Lines are UTF-8, without their
    line ends (`\\n`, `\\r\\n`); a last line without one counts too.

    Raises:
        ValueError: naming `name` and the line of bytes that are not UTF-8.

    Example:
    >>> read_end, write_end = os.pipe()
    >>> _ = os.write(write_end, b"one\\ntwo\\r\\nthr")
    >>> groups = line_groups(read_end, most=8)
    >>> next(groups)  # "thr" is not complete yet
    ['one', 'two']
    >>> _ = os.write(write_end, b"ee\\nfour")
    >>> os.close(write_end)
    >>> list(groups)
    [['three', 'four']]
    >>> os.close(read_end)
    """
    if most < 1:
        raise ValueError(f"most must be at least 1; got {most}.")
    pending, lines, ended, number = b"", [], False, 0
    while True:
        while not ended and (not lines or (len(lines) < most and _readable(fd))):
            chunk = os.read(fd, READ_SIZE)
            if chunk:
                *complete, pending = (pending + chunk).split(b"\n")
                lines += complete
            else:
                ended = True
                lines += [pending] if pending else []
        if not lines:
            return
        group, lines = lines[:most], lines[most:]
        try:
            decoded = []
            for line in group:
                number += 1
                decoded.append(line.decode("utf-8").rstrip("\r"))
        except UnicodeDecodeError as error:
            raise ValueError(
                f"{name}, line {number}: not valid UTF-8 ({error.reason} at byte {error.start})."
            ) from None
        yield decoded


def with_copies(lines: list[str], batch_size: int) -> list[str]:
    """`lines` and copies of the longest, enough to bring the lines that
    reach the model (the non-blank ones), if fewer than `batch_size`, to the
    next power of two (at most `batch_size`): groups of any size then share
    a few compiled batch shapes. A copy is no longer than the longest line,
    so the batch's length bucket stays.

    Example:
    >>> with_copies(["a b", "", "a b c", "c"], batch_size=32)
    ['a b', '', 'a b c', 'c', 'a b c']
    >>> [len(with_copies(["x"] * n, batch_size=32)) for n in (1, 2, 3, 20, 40)]
    [1, 2, 4, 32, 40]
    """
    reaching = sum(1 for line in lines if line.strip())
    if not reaching or reaching >= batch_size:
        return lines
    size = min(1 << (reaching - 1).bit_length(), batch_size)
    return lines + [max(lines, key=len)] * (size - reaching)


def _readable(fd: int) -> bool:
    """Whether reading `fd` would return at once; False where `select`
    cannot tell (pipes on Windows): the lines read so far go on alone."""
    try:
        return bool(select.select([fd], [], [], 0)[0])
    except (OSError, ValueError):
        return False
