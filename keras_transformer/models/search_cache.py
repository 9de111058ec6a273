"""What a `Transformer` keeps of its compiled searches, by how they run."""

from typing import NamedTuple


class SearchMode(NamedTuple):
    """How a model's searches run: each mode has searches of its own."""

    eagerly: bool  # the model's `run_eagerly`
    jit_compile: bool  # `compile(jit_compile=...)`, resolved


class SearchCache:
    """The searches of a model, by `SearchMode`: a
    `generation.search_runner.SearchRunner` each, which keeps its compiled
    functions.

    Not a `dict`: Keras and TensorFlow track dicts set on a model, and the
    SavedModel writer would then try to save these functions (and fail on
    the tuple keys); a plain object is left alone.
    """

    def __init__(self, jit_compile: bool | str = "auto"):
        self.jit_compile = jit_compile  # as given to `Transformer.compile`
        self.runners = {}
