"""`two_halves`: a small model's batch searched as two halves at once, in two threads.

Under XLA on a CPU, a small model's products are too small for XLA's code to
keep two cores busy with one of them; two halves, each one compiled search
running without Python's lock, do. A larger model streams its weights from
memory at each step, and each half would stream them again. On torch the
search is Python between operators: halves in threads would wait for each other.

Example:
>>> from keras_transformer.speed_paths.runtime import Runtime
>>> parts_to_search(32, 2_000_000, smallest_part=2, runtime=Runtime("jax", "cpu", cores=2))
2
>>> double = lambda part: {"x": np.asarray(part["x"]) * 2}
>>> search_in_parts(double, {"x": np.arange(4)}, parts=2)["x"].tolist()
[0, 2, 4, 6]
"""

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from keras import ops

from keras_transformer.speed_paths.registry import SpeedPath, register
from keras_transformer.speed_paths.runtime import Runtime

HALVES = 2
# Up to this many parameters, a model's batch is searched in halves.
SMALL_MODEL_PARAMETERS = 8_000_000

PATH = register(
    SpeedPath(
        "two_halves",
        "XLA's CPU code keeps two cores busy with two halves of a small model's batch, not with the whole",
        lambda runtime: runtime.compiles_with_xla and runtime.on_cpu and runtime.cores >= HALVES,
    )
)
# The threads that search the halves after the first, made at first use in
# each process (`_forget_search_threads`).
_SEARCH_THREADS: ThreadPoolExecutor | None = None
_SEARCH_THREADS_LOCK = threading.Lock()


def parts_to_search(rows: int, parameters: int, smallest_part: int, runtime: Runtime) -> int:
    """How many equal parts a compiled search of `rows` runs as, side by side:
    `HALVES` where the path is taken, for a model of at most
    `SMALL_MODEL_PARAMETERS` and parts of `smallest_part` rows or more; else 1."""
    if PATH.applies_to(runtime) and parameters <= SMALL_MODEL_PARAMETERS and rows >= HALVES * smallest_part:
        return HALVES
    return 1


def search_in_parts(search: Callable[[dict], dict], inputs: dict, parts: int, at_once: bool = True) -> dict:
    """`search(inputs)` with the rows of `inputs` (numpy arrays, a multiple of
    `parts` rows) in `parts` equal parts, the first in this thread and the
    others in threads of their own; outputs as numpy arrays, rows in order.

    `at_once=False` runs the parts one after the other: for a search's first
    call of a shape, which traces and compiles it once, not in every thread.
    """
    rows = len(next(iter(inputs.values())))
    size = rows // parts

    def run(part: int) -> dict:
        piece = {key: ops.convert_to_tensor(value[part * size : (part + 1) * size]) for key, value in inputs.items()}
        return {key: ops.convert_to_numpy(value) for key, value in search(piece).items()}

    if at_once and parts > 1:
        others = [_search_threads().submit(run, part) for part in range(1, parts)]
        results = [run(0)] + [other.result() for other in others]
    else:
        results = [run(part) for part in range(parts)]
    return {key: np.concatenate([result[key] for result in results]) for key in results[0]}


def _search_threads() -> ThreadPoolExecutor:
    global _SEARCH_THREADS
    with _SEARCH_THREADS_LOCK:
        if _SEARCH_THREADS is None:
            _SEARCH_THREADS = ThreadPoolExecutor(HALVES - 1, thread_name_prefix="search part")
        return _SEARCH_THREADS


def _forget_search_threads() -> None:
    """In a forked child: none of the parent's threads run there, and the
    lock may have been copied held by one of them, never to be released."""
    global _SEARCH_THREADS, _SEARCH_THREADS_LOCK
    _SEARCH_THREADS, _SEARCH_THREADS_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
    os.register_at_fork(after_in_child=_forget_search_threads)
