"""Reading parallel text."""

import gzip
import os
from collections.abc import Iterator


def read_lines(path: str | os.PathLike) -> Iterator[str]:
    """Yields the lines of a UTF-8 text file (plain or `.gz`) without newlines.

    Raises:
        ValueError: naming the file and line of bytes that are not UTF-8.
    """
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                yield raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"{path}, line {number}: not valid UTF-8 ({error.reason} at byte "
                    f"{error.start}). Re-encode the file as UTF-8."
                ) from None
