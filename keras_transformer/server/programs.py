"""The server's searches: one compiled program per batch shape, compiled once and kept.

The server decodes a fixed set of `(batch size, source width)` shapes
(`ModelEngine.shapes`), so it compiles each search once, with the full output
buffer (source + `max_extra_length`), and keeps only what runs. On JAX the
program is compiled ahead of time (`jax.jit(...).lower(...).compile()`): only
the executable stays in memory, where `jax.jit`'s call path also keeps each
shape's trace and lowered module. The weights are the program's arguments,
so models of the same dimensions lower to the same program, and share one
executable in a process. On TensorFlow it is the XLA-compiled `tf.function`
of `Transformer.generate`'s search, on torch the eager search.

Example:
>>> import keras_transformer as kt
>>> model = kt.Transformer.from_preset("multi30k_en_de")
>>> programs = SearchPrograms(model, model.default_search)
>>> programs.compile(1, 16)
>>> programs.compiled(16)
[1]
>>> token_ids = model.preprocessor.pack_sources([[67, 1143, 5]])  # one sentence's ids
>>> sorted(programs.run(token_ids))
['decoder_padding_mask', 'decoder_token_ids']
"""

import hashlib
import threading
from collections.abc import Callable

import keras
import numpy as np

from keras_transformer.generation.decoding import compiled_search, jax_stateless_search, resolve_jit_compile, search_of
from keras_transformer.generation.settings import SearchSettings


class SearchPrograms:
    """The compiled searches of one model and search, by `(batch size, source width)`.

    Args:
        model: a `Transformer`.
        search: the `SearchSettings` every program decodes with.
        buffer_length: the output buffer (start token included) of a source
            width; by default the width + `search.max_extra_length`, as
            `Transformer.generate`'s full buffer.
    """

    def __init__(self, model, search: SearchSettings, buffer_length: Callable[[int], int] | None = None):
        self.model = model
        self.search = search
        self.buffer_length = buffer_length or (lambda width: width + search.max_extra_length)
        self._programs: dict[tuple[int, int], object] = {}
        # One compilation at a time (warm-up and a first request may meet); a
        # shape already compiled runs without it, so no request waits for the
        # compilation of another shape.
        self._lock = threading.Lock()
        if keras.config.backend() == "jax":
            self._stateless = jax_stateless_search(model, search_of(model.backbone, search))

    def compiled(self, width: int) -> list[int]:
        """The batch sizes compiled for sources of `width` positions, smallest first."""
        return sorted(size for size, compiled_width in self._programs if compiled_width == width)

    def compile(self, size: int, width: int) -> None:
        """Compiles the search of batches of `size` sources of `width` positions (once)."""
        if (size, width) in self._programs:
            return
        with self._lock:
            if (size, width) not in self._programs:
                self._programs[(size, width)] = self._program(size, width)

    def _program(self, size: int, width: int):
        """The compiled search of one batch shape."""
        token_ids = np.ones((size, width), "int32")
        inputs = self._inputs({"encoder_token_ids": token_ids, "encoder_padding_mask": token_ids.astype(bool)})
        if keras.config.backend() == "jax":
            return _shared_executable(
                self._signature(size, width), lambda: self._stateless.lower(self._values(), inputs)
            )
        # A function of its own per shape: a `tf.function` traces under a lock
        # that its calls of other shapes would wait for.
        program = compiled_search(self.model, resolve_jit_compile(), self.search)
        program(inputs)  # TensorFlow compiles a shape at its first call
        return program

    def run(self, token_ids: dict) -> dict:
        """Searches one batch of `{"encoder_token_ids", "encoder_padding_mask"}`;
        its shape is compiled first if it was not.

        Returns:
            `{"decoder_token_ids", "decoder_padding_mask"}` NumPy arrays.
        """
        size, width = token_ids["encoder_token_ids"].shape
        self.compile(size, width)
        program, inputs = self._programs[(size, width)], self._inputs(token_ids)
        outputs = program(self._values(), inputs) if keras.config.backend() == "jax" else program(inputs)
        return {name: keras.ops.convert_to_numpy(value) for name, value in outputs.items()}

    def _inputs(self, token_ids: dict) -> dict:
        size, width = token_ids["encoder_token_ids"].shape
        buffer = np.zeros((size, self.buffer_length(width)), "int32")
        return {
            "encoder_token_ids": np.asarray(token_ids["encoder_token_ids"], "int32"),
            "encoder_padding_mask": np.asarray(token_ids["encoder_padding_mask"], bool),
            "decoder_token_ids": buffer,
        }

    def _signature(self, size: int, width: int) -> str:
        """What the lowered program depends on: the network's class and configuration,
        the shapes and types of its weights, the search, the batch shape and
        the output buffer."""
        backbone = self.model.backbone
        weights = [(tuple(v.shape), str(v.dtype)) for v in self.model.variables]
        network = (type(backbone).__module__, type(backbone).__qualname__, backbone.get_config())
        parts = (network, backbone.dtype_policy.name, weights, self.search, size, width)
        parts += (self.buffer_length(width),)
        return repr(parts)

    def _values(self) -> list:
        return [variable.value for variable in self.model.variables]


_EXECUTABLES: dict[str, object] = {}  # by the signature of the program, then by its text
_EXECUTABLES_LOCK = threading.Lock()


def _shared_executable(signature: str, lower):
    """The executable of a JAX program, compiled once per process for each
    distinct program: found by its `signature` without tracing, else by the
    text of `lower()`'s program (debug locations left out, so the names of
    the model's layers do not count)."""
    with _EXECUTABLES_LOCK:
        if signature in _EXECUTABLES:
            return _EXECUTABLES[signature]
    lowered = lower()
    text = hashlib.sha256(lowered.as_text(debug_info=False).encode()).hexdigest()
    with _EXECUTABLES_LOCK:
        if text not in _EXECUTABLES:
            _EXECUTABLES[text] = lowered.compile()
        _EXECUTABLES[signature] = _EXECUTABLES[text]
        return _EXECUTABLES[text]
