"""Reading text files and durable file system updates."""

import contextlib
import gzip
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path


def cache_home() -> Path:
    """`$XDG_CACHE_HOME/keras_transformer` (`~/.cache/keras_transformer` by
    default): where the package keeps what it builds for this machine."""
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "keras_transformer"


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


@contextlib.contextmanager
def folder_replaced_atomically(target: str | os.PathLike) -> Iterator[Path]:
    """Yields an empty hidden folder next to `target` to write into; when the
    block ends without error, the folder is flushed to disk and renamed to
    `target`, and an existing `target` is moved aside first and deleted last.
    On error the folder is deleted. A process killed at any point leaves the
    old `target` or the new one, never a half-written one. One writer per
    `target` at a time; the caller decides whether `target` may be replaced.

    Example:
    >>> import tempfile
    >>> target = Path(tempfile.mkdtemp()) / "out"
    >>> with folder_replaced_atomically(target) as folder:
    ...     _ = (folder / "a.txt").write_text("a")
    >>> sorted(p.name for p in target.iterdir())
    ['a.txt']
    """
    target = Path(target).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    for stale in target.parent.glob(f".{target.name}.partial-*"):
        shutil.rmtree(stale, ignore_errors=True)  # left by a killed writer
    temporary = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        yield temporary
        _fsync_tree(temporary)
        if target.exists():
            # Aside under a name of its own, still a complete folder: loadable, and renamed back by hand.
            os.rename(target, target.parent / f".{target.name}.previous-{uuid.uuid4().hex[:8]}")
        os.rename(temporary, target)
        fsync_directory(target.parent)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    # The new version is in place: older ones (this one's, or one left by a
    # writer killed between the two renames) are obsolete.
    for previous in target.parent.glob(f".{target.name}.previous-*"):
        shutil.rmtree(previous, ignore_errors=True)


@contextlib.contextmanager
def file_replaced_atomically(path: str | os.PathLike, mode: str = "w") -> Iterator:
    """Yields a file open in `mode` ("w" text, "wb" bytes) next to `path`,
    named `.{name}.partial-*`; when the block ends without error it is
    flushed to disk and renamed to `path`, replacing any old one. On error
    it is deleted: a reader sees the old file or the new one, never half of
    one (a killed process leaves the partial file, which its writer may
    delete when it starts again).

    Example:
    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "out.txt"
    >>> with file_replaced_atomically(path) as f:
    ...     _ = f.write("done")
    >>> path.read_text()
    'done'
    """
    path = Path(path)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.partial-")
    try:
        with open(descriptor, mode, **({} if "b" in mode else {"encoding": "utf-8", "newline": ""})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)
        raise
    fsync_directory(path.parent)  # the rename itself survives a crash


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
    """Writes `text` (UTF-8) to `path` through `file_replaced_atomically`."""
    with file_replaced_atomically(path) as f:
        f.write(text)


def _fsync_tree(directory: Path) -> None:
    """Flushes every file and folder under `directory` to disk."""
    for root, _, names in os.walk(directory):
        for name in names:
            with open(Path(root) / name, "rb") as file:
                os.fsync(file.fileno())
        fsync_directory(root)


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
        f"{path}, line {number}: not valid UTF-8 ({error.reason} at byte {error.start}). Re-encode the file as UTF-8."
    )
