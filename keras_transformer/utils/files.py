"""Reading text files and durable file system updates."""

import gzip
import os
from collections.abc import Iterator


def fsync_directory(directory: str | os.PathLike) -> None:
    """Makes the renames inside `directory` durable (a no-op on Windows,
    which cannot open a directory and makes renames durable itself)."""
    if os.name == "nt":
        return
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def read_lines(path: str | os.PathLike) -> Iterator[str]:
    """Yields the lines of a UTF-8 text file (plain or `.gz`) without newlines.

    Raises:
        ValueError: naming the file and line of bytes that are not UTF-8.
    """
    for number, raw in enumerate(raw_lines(path), start=1):
        try:
            yield raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as error:
            raise ValueError(decode_message(path, number, error)) from None


def raw_lines(path) -> Iterator[bytes]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        yield from f


def decode_message(path, number, error) -> str:
    return (
        f"{path}, line {number}: not valid UTF-8 ({error.reason} at byte "
        f"{error.start}). Re-encode the file as UTF-8."
    )
