"""How a compiled search runs fastest, chosen per backend and CPU: its rows and its logits.

- `rows_to_search`: how many rows a batch is searched with. Under XLA, a
  greedy search of one sentence runs as two rows (the sentence twice).
- `searches_at_once` and `search_in_parts`: under XLA on a CPU, a small
  model's batch is searched as two halves at once, in two threads.
- `step_logits`: a decoding step ends in the output projection `hidden @ E^T`
  (section 3.4) over the whole vocabulary, its largest product; this picks,
  when a search is traced, how its steps compute it.

Every way gives the same translations, and each is taken where it measured
faster (`benchmarks/RESULTS.md`, "Why the code takes these paths").
"""

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import keras
import numpy as np
from keras import ops

from keras_transformer.speed_paths import bfloat16_products as products
from keras_transformer.speed_paths.derived_tensors import derived
from keras_transformer.speed_paths.runtime import describe_runtime

# Beam search of a batch: from this many rows and vocabulary entries, JAX
# computes the projection in `VOCABULARY_PARTS` independent products.
PARTS_MIN_ROWS = 128
PARTS_MIN_VOCABULARY = 16_000
VOCABULARY_PARTS = 4
# Under XLA, a greedy search runs at least this many rows: XLA's CPU code for
# a product of one row by a weight matrix is slower than for two.
XLA_MIN_GREEDY_ROWS = 2
# A small model's products are too small for XLA's CPU code to keep two
# threads busy with one of them: up to this many parameters, a batch is
# searched as `CONCURRENT_SEARCHES` parts at once. A larger model's greedy
# search streams its weights from memory, and each part would stream them.
SMALL_MODEL_PARAMETERS = 8_000_000
CONCURRENT_SEARCHES = 2
# The transposed copies, by matrix (`speed_paths.derived_tensors`).
_TRANSPOSED: dict[int, tuple] = {}
# The threads that search the parts after the first, made at first use in
# each process (`_forget_search_threads`).
_SEARCH_THREADS: ThreadPoolExecutor | None = None
_SEARCH_THREADS_LOCK = threading.Lock()


def rows_to_search(sentences: int, greedy: bool, under_xla: bool) -> int:
    """The rows a batch of `sentences` is searched with; the extra rows are
    copies of a sentence, whose outputs are dropped.

    Example:
    >>> rows_to_search(1, greedy=True, under_xla=True), rows_to_search(1, greedy=False, under_xla=True)
    (2, 1)
    """
    return max(sentences, XLA_MIN_GREEDY_ROWS) if greedy and under_xla else sentences


def searches_at_once(rows: int, parameters: int, greedy: bool, under_xla: bool) -> int:
    """How many equal parts a search of `rows` runs as, side by side
    (`search_in_parts`): `CONCURRENT_SEARCHES` for a model of at most
    `SMALL_MODEL_PARAMETERS` under XLA on a CPU with as many cores, when each
    part keeps the rows `rows_to_search` asks for; else 1.

    XLA's compiled search runs without Python's lock, so the parts run truly
    at once. On torch the search is Python between operators: parts in
    threads would wait for each other.

    Example:
    >>> on_two_cores = _cores() >= 2 and computes_on_xla_cpu()
    >>> searches_at_once(32, 2_000_000, greedy=True, under_xla=True) == (2 if on_two_cores else 1)
    True
    >>> searches_at_once(32, 60_000_000, greedy=True, under_xla=True)
    1
    """
    smallest_part = XLA_MIN_GREEDY_ROWS if greedy else 1
    if (
        under_xla
        and parameters <= SMALL_MODEL_PARAMETERS
        and rows >= CONCURRENT_SEARCHES * smallest_part
        and _cores() >= CONCURRENT_SEARCHES
        and computes_on_xla_cpu()
    ):
        return CONCURRENT_SEARCHES
    return 1


def search_in_parts(search: Callable[[dict], dict], inputs: dict, parts: int, at_once: bool = True) -> dict:
    """`search(inputs)` with the rows of `inputs` (numpy arrays, a multiple of
    `parts` rows) in `parts` equal parts, the first in this thread and the
    others in threads of their own; outputs as numpy arrays, rows in order.

    `at_once=False` runs the parts one after the other: for a search's first
    call of a shape, which traces and compiles it once, not in every thread.

    Example:
    >>> double = lambda part: {"x": np.asarray(part["x"]) * 2}
    >>> search_in_parts(double, {"x": np.arange(4)}, parts=2)["x"].tolist()
    [0, 2, 4, 6]
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


def computes_on_xla_cpu() -> bool:
    """Whether TensorFlow or JAX computes on the CPU."""
    return keras.config.backend() in ("tensorflow", "jax") and describe_runtime().on_cpu


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _search_threads() -> ThreadPoolExecutor:
    global _SEARCH_THREADS
    with _SEARCH_THREADS_LOCK:
        if _SEARCH_THREADS is None:
            _SEARCH_THREADS = ThreadPoolExecutor(CONCURRENT_SEARCHES - 1, thread_name_prefix="search part")
        return _SEARCH_THREADS


def _forget_search_threads() -> None:
    """In a forked child: none of the parent's threads run there, and the
    lock may have been copied held by one of them, never to be released."""
    global _SEARCH_THREADS, _SEARCH_THREADS_LOCK
    _SEARCH_THREADS, _SEARCH_THREADS_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
    os.register_at_fork(after_in_child=_forget_search_threads)


def step_logits(backbone) -> Callable:
    """The function a search's steps turn decoder states `(rows, 1, d_model)`
    into logits with: `backbone.logits`, or, where the projection is the
    plain tied product,

    - on TensorFlow, bfloat16 layers summing in float32 under XLA
      (`speed_paths.bfloat16_products`): a product with `E^T` cast to bfloat16 and
      transposed here, once per search, since XLA's bfloat16 kernels take
      the vocabulary as the second operand's last axis;
    - on JAX: `logits_by_parts` for `PARTS_MIN_ROWS` rows or more and
      `PARTS_MIN_VOCABULARY` tokens or more, which XLA's CPU runtime runs
      side by side;
    - on torch in float32: a product with `E^T` laid out in memory as such
      (`torch_transposed`), which torch's CPU kernels read faster than `E`
      transposed by strides.

    Call it inside the traced search, outside its loop.
    """
    embedding = backbone.decoder_token_embedding
    if not _is_plain_projection(embedding):
        return backbone.logits
    backend = keras.config.backend()
    if backend == "tensorflow" and backbone.compute_dtype == "bfloat16" and products.layers_sum_in_float32():
        kernel = ops.transpose(ops.cast(embedding.embeddings, "bfloat16"))

        def logits_from_transposed_kernel(hidden):
            return _with_bias(backbone, products.dense(hidden, kernel))

        return logits_from_transposed_kernel
    if backend == "jax" and embedding.input_dim >= PARTS_MIN_VOCABULARY:

        def logits_of_many_rows_by_parts(hidden):
            rows = hidden.shape[0]
            if rows is None or rows < PARTS_MIN_ROWS:
                return backbone.logits(hidden)
            return _with_bias(backbone, logits_by_parts(hidden, embedding.embeddings, VOCABULARY_PARTS))

        return logits_of_many_rows_by_parts
    if backend == "torch" and backbone.compute_dtype == "float32":
        kernel = torch_transposed(embedding.embeddings)

        def logits_from_transposed_copy(hidden):
            return _with_bias(backbone, products.dense(hidden, kernel))

        return logits_from_transposed_copy
    return backbone.logits


def torch_transposed(variable: keras.Variable):
    """A torch matrix variable's transpose as a contiguous copy, kept while the
    variable lives and made again after it changes (training, loading).

    The model's largest product, `h @ E^T`, reads `E^T` as the strides of `E`
    unless given this copy: torch's CPU kernels ran it 1.25-2.2x as fast from
    the copy with `E` of 4 million numbers or more, and as fast with 1 million
    (`benchmarks/RESULTS.md`, "torch: where a decoding call goes"). The
    price is one more copy of `E` in memory.
    """
    import torch

    matrix = variable.value

    def transposed():
        with torch.inference_mode(False):  # a plain tensor, whichever mode the first search ran in
            return matrix.detach().t().contiguous()

    return derived(_TRANSPOSED, matrix, (), transposed)


def logits_by_parts(hidden, embeddings, parts: int):
    """`hidden @ embeddings^T` as `parts` products over consecutive slices of
    the vocabulary, joined: the same logits, as independent operations.

    Example:
    >>> import numpy as np
    >>> h, e = np.ones((2, 1, 3), "float32"), np.arange(15, dtype="float32").reshape(5, 3)
    >>> np.asarray(logits_by_parts(h, e, parts=2))[0, 0].tolist()
    [3.0, 12.0, 21.0, 30.0, 39.0]
    """
    vocabulary = ops.shape(embeddings)[0]
    edges = [vocabulary * i // parts for i in range(parts + 1)]
    embeddings = ops.cast(embeddings, hidden.dtype)
    return ops.concatenate(
        [products.dense(hidden, ops.transpose(embeddings[start:end])) for start, end in zip(edges, edges[1:])], axis=-1
    )


def _with_bias(backbone, logits):
    return logits if backbone.logits_bias is None else backbone.logits_bias(logits)


def _is_plain_projection(embedding) -> bool:
    """Whether the embedding's reverse call is `hidden @ E^T` of its unquantized
    tied matrix and nothing else, so that a search may compute it itself."""
    return (
        embedding.tie_weights
        and embedding.quantization_mode is None
        and embedding.reverse_dtype is None
        and embedding.logit_soft_cap is None
    )
