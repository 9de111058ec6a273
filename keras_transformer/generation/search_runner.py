"""A model's searches of one mode, built once and run: the rows they run with, their compiled functions.

`SearchRunner.run` searches a batch the way the runtime runs it fastest,
with the same translations: a greedy search of one sentence as two rows
(`speed_paths.one_row_padding`) and a small model's batch as two halves at
once (`speed_paths.two_halves`) where XLA compiles the search. Extra rows
are copies of the last sentence, whose outputs are dropped. Its functions
are `decoding.compiled_search`'s, one per search configuration.

Example:
>>> import keras_transformer as kt
>>> model = kt.Transformer.from_preset("multi30k_en_de")
>>> runner = SearchRunner(model, jit_compile=False, eagerly=True)
>>> inputs = model.preprocessor.pack_sources([[67, 1143, 5]])
>>> inputs["decoder_token_ids"] = np.zeros((1, 8), "int32")
>>> runner.run(inputs, kt.SearchSettings(beam_size=None))["decoder_token_ids"].shape
(1, 8)
"""

from collections.abc import Callable

import keras
import numpy as np

from keras_transformer.generation.decoding import compiled_search
from keras_transformer.generation.settings import SearchSettings
from keras_transformer.speed_paths.one_row_padding import rows_to_search
from keras_transformer.speed_paths.runtime import Runtime, describe_runtime
from keras_transformer.speed_paths.two_halves import parts_to_search, search_in_parts


class SearchRunner:
    """The searches of `model` in one mode: `compile(jit_compile=...)`, resolved, and `run_eagerly`.

    Args:
        model: a `Transformer` (a model with a `backbone`).
        jit_compile: XLA on TensorFlow; on torch, each step through `torch.compile`.
        eagerly: the model's `run_eagerly`.
        runtime: what the speed paths are chosen from (by default this process's).
    """

    def __init__(self, model: keras.Model, jit_compile: bool, eagerly: bool, runtime: Runtime | None = None):
        self.model = model
        self.jit_compile = jit_compile
        self.runtime = runtime or describe_runtime()
        # The compiled searches, by `(SearchSettings, with_completion)`, and
        # `(SearchSettings, with_completion, num_hypotheses)` for n-best ones.
        self.functions: dict[tuple, Callable[[dict], dict]] = {}
        self._shapes: set[tuple] = set()  # of the searches run once, which may then run in parts at once
        # Eager operators, like torch's, neither gain from XLA's extra row nor run without Python's lock.
        self._under_xla = self.runtime.compiles_with_xla and jit_compile and not eagerly

    def function(
        self, settings: SearchSettings, with_completion: bool = False, num_hypotheses: int = 1
    ) -> Callable[[dict], dict]:
        """The compiled search of one configuration, built at first use (see `decoding.search_step`)."""
        key = (settings, with_completion) + ((num_hypotheses,) if num_hypotheses > 1 else ())
        if key not in self.functions:
            self.functions[key] = compiled_search(
                self.model, self.jit_compile, settings, with_completion, num_hypotheses, self.runtime
            )
        return self.functions[key]

    def run(
        self, inputs: dict, settings: SearchSettings, with_completion: bool = False, num_hypotheses: int = 1
    ) -> dict:
        """Searches one batch: `inputs` as `decoding.search_step` takes them,
        NumPy arrays of one row per sentence; outputs as NumPy arrays, one row
        (or `num_hypotheses` rows) per sentence."""
        batch = len(inputs["encoder_token_ids"])
        rows, parts = batch, 1
        if self._under_xla:
            greedy = settings.beam_size is None
            rows = rows_to_search(batch, greedy, self.runtime)
            smallest_part = rows_to_search(1, greedy, self.runtime)
            parts = parts_to_search(rows, self.model.backbone.count_params(), smallest_part, self.runtime)
            rows = -(-rows // parts) * parts  # equal parts: one compiled shape
        if rows > batch:  # copies of the last sentence, whose outputs are dropped below
            inputs = {key: np.concatenate([value, value[-1:].repeat(rows - batch, 0)]) for key, value in inputs.items()}
        function = self.function(settings, with_completion, num_hypotheses)
        shape = (settings, with_completion, num_hypotheses, parts, *(value.shape for value in inputs.values()))
        outputs = search_in_parts(function, inputs, parts, at_once=shape in self._shapes)
        self._shapes.add(shape)
        return {key: value[:batch] for key, value in outputs.items()}
