"""Durable file system updates, shared by checkpoints and presets."""

import os


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
