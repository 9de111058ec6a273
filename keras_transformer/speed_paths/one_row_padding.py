"""`one_row_padding`: a greedy search of one sentence runs as two rows under XLA.

The extra row is a copy of the sentence, whose output is dropped
(`generation.search_runner`); the sentence's translation is the same.

Example:
>>> from keras_transformer.speed_paths.runtime import Runtime
>>> runtime = Runtime("jax", "cpu")
>>> rows_to_search(1, greedy=True, runtime=runtime), rows_to_search(1, greedy=False, runtime=runtime)
(2, 1)
"""

from keras_transformer.speed_paths.registry import SpeedPath, register
from keras_transformer.speed_paths.runtime import Runtime

# The fewest rows a greedy search runs with where the path is taken.
MIN_GREEDY_ROWS = 2

PATH = register(
    SpeedPath(
        "one_row_padding",
        "XLA's code for a product of one row by a weight matrix is slower than for two rows",
        lambda runtime: runtime.compiles_with_xla,
    )
)


def rows_to_search(sentences: int, greedy: bool, runtime: Runtime) -> int:
    """The rows a compiled search of `sentences` runs with: at least
    `MIN_GREEDY_ROWS` for a greedy search where the path is taken."""
    return max(sentences, MIN_GREEDY_ROWS) if greedy and PATH.applies_to(runtime) else sentences
