"""This project's `Transformer`, measured inside one `benchmarks.worker` process.

The backend is whatever `KERAS_BACKEND` says (one per process). Precisions:
`float32`, `mixed_bfloat16` (a `dtype` policy of the backbone) and `int8`
(Keras' `model.quantize("int8")` after loading; inference only).

Fixed-length decoding is a benchmark-only hook: `FixedLengthBackbone` gives
the end token a logit 10^4 below its own before the search sees it, so it
never wins until the search forces it at the length limit. The public API has
no such switch; nothing in the library is changed. With `max_length =
new_tokens + 1` and `max_extra_length = new_tokens - source_length`, the
search runs exactly `new_tokens` decoder steps, as the peers do with
`min/max new tokens = new_tokens`; its last token is the forced end token
(the peers' last is an ordinary token), which is why outputs are compared on
the `new_tokens - 1` tokens before it.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from benchmarks.workloads import Decode, Train, target_log_probs

END_PENALTY = 1e4
PRECISIONS = ("float32", "mixed_bfloat16", "int8")

_start = time.perf_counter()
import keras  # noqa: E402
from keras import ops  # noqa: E402

import keras_transformer  # noqa: E402
from keras_transformer import Transformer, TransformerBackbone  # noqa: E402
from keras_transformer.training.data import without_autotuning  # noqa: E402
from keras_transformer.utils import text_libraries  # noqa: E402

IMPORT_S = time.perf_counter() - _start


class FixedLengthBackbone(TransformerBackbone):
    """A `TransformerBackbone` whose decoding steps never prefer the end token."""

    def decode_step(self, *args, **kwargs):
        logits, self_cache = super().decode_step(*args, **kwargs)
        is_end = ops.cast(ops.arange(self.vocabulary_size) == self.end_token_id, logits.dtype)
        return logits - is_end * END_PENALTY, self_cache


def set_threads(threads: int) -> None:
    """keras_transformer imports TensorFlow on every backend where it is
    installed (for its tokenizers): limit it too."""
    tf = text_libraries.tf
    if tf is not None:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(1)
        except RuntimeError:  # TensorFlow already started in this process (a test): its pools stay
            pass
    if keras.config.backend() == "torch":
        import torch

        torch.set_num_threads(threads)
        torch.set_num_interop_threads(1)


class ProjectImplementation:
    """`keras_transformer.Transformer` on the Marian checkpoint's weights."""

    def __init__(self, checkpoint: Path, precision: str, threads: int, jit_compile: bool | str = "auto"):
        from benchmarks.marian_weights import backbone_from_marian

        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}; got {precision!r}")
        set_threads(threads)
        self.import_s = IMPORT_S
        self.precision = precision
        self.module_file = keras_transformer.__file__
        start = time.perf_counter()
        dtype = "mixed_bfloat16" if precision == "mixed_bfloat16" else None
        backbone = backbone_from_marian(checkpoint / "marian", dtype=dtype, backbone_cls=FixedLengthBackbone)
        self.model = Transformer(backbone=backbone)
        if precision == "int8":
            self.model.quantize("int8")
        self.load_s = time.perf_counter() - start
        # `jit_compile` other than "auto" (a job's choice, e.g. TensorFlow's
        # oneDNN kernels without XLA) holds for decoding and training alike.
        self.jit_compile = jit_compile
        self.compiled = jit_compile != "auto"
        if self.compiled:
            self.model.compile(jit_compile=jit_compile)

    def decode(self, workload: Decode) -> np.ndarray:
        n = workload.new_tokens
        if n < workload.source_length:
            raise ValueError("the search's length limit is source length + max_extra_length >= source length")
        sources = workload.sources()
        outputs = self.model.generate(
            {"encoder_token_ids": sources, "encoder_padding_mask": np.ones_like(sources)},
            max_length=n + 1,
            beam_size=None if workload.beam_size == 1 else workload.beam_size,
            max_extra_length=n - workload.source_length,
        )
        tokens = np.asarray(outputs["decoder_token_ids"])
        if not np.all(tokens[:, n] == self.model.backbone.end_token_id):
            raise AssertionError(f"expected the end token at position {n} of every output")
        return tokens[:, 1:n]

    def score(self, workload: Decode) -> np.ndarray:
        backbone = self.model.backbone
        sources, targets = workload.sources(), workload.targets()
        start = np.full((workload.batch, 1), backbone.start_token_id, "int32")
        decoder_input = np.concatenate([start, targets[:, :-1]], axis=1)
        logits = self.model(
            {
                "encoder_token_ids": sources,
                "encoder_padding_mask": np.ones_like(sources),
                "decoder_token_ids": decoder_input,
                "decoder_padding_mask": np.ones_like(decoder_input),
            },
            training=False,
        )
        logits = ops.convert_to_numpy(ops.cast(logits, "float32"))
        return target_log_probs(logits, targets, backbone.pad_token_id)

    def train(self, workload: Train, steps: int) -> None:
        if self.precision == "int8":
            raise NotImplementedError("int8 is measured for inference only")
        if not self.compiled:
            self.model.compile(jit_compile=self.jit_compile)  # the paper's recipe: Adam, warmup, label smoothing 0.1
            self.compiled = True
        arrays = workload.arrays()
        repeat = lambda a: np.tile(a, (steps, 1))  # noqa: E731
        x = {
            "encoder_token_ids": repeat(arrays["source"]),
            "encoder_padding_mask": np.ones_like(repeat(arrays["source"])),
            "decoder_token_ids": repeat(arrays["decoder_input"]),
            "decoder_padding_mask": np.ones_like(repeat(arrays["decoder_input"])),
        }
        tf = text_libraries.tf
        if tf is None:  # the GPU machine: Keras' own `fit` takes the arrays
            keras.Model.fit(
                self.model, x, repeat(arrays["labels"]), batch_size=workload.batch, epochs=1, verbose=0, shuffle=False
            )
            return
        # A tf.data pipeline as the train command's (`data.token_batches`):
        # arrays given to `fit` go through KerasHub's pipeline, whose
        # autotuner slows a JAX step on 2 cores (`data.without_autotuning`).
        batches = tf.data.Dataset.from_tensor_slices((x, repeat(arrays["labels"]))).batch(workload.batch)
        self.model.fit(without_autotuning(batches), epochs=1, verbose=0)
