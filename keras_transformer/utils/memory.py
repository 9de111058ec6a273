"""Giving memory that the process freed back to the operating system."""

import ctypes
import ctypes.util
import functools


def release_freed_memory() -> bool:
    """Returns the heap's free pages to the operating system (glibc's `malloc_trim`).

    Compiling a search allocates hundreds of megabytes of scratch memory and
    frees it; glibc keeps freed memory in its arenas, so without this the
    process stays as large as its largest compilation. Returns whether
    anything was done (`False` where the C library is not glibc).

    Example:
    >>> release_freed_memory() in (True, False)
    True
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return None
