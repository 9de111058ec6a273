"""What the benchmark measures: model sizes, workloads, their inputs and FLOPs.

Every implementation decodes and trains on exactly the arrays made here, from
seeds fixed per workload, so that outputs can be compared token for token.

Source sentences are `length - 1` random ordinary tokens followed by the end
token (Marian appends `</s>` to every source); nothing is padded. Decoding
workloads produce exactly `new_tokens` tokens: the end token is suppressed
until then (see `benchmarks/project.py` for how this project does it).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import numpy as np


@dataclasses.dataclass(frozen=True)
class ModelSize:
    """A Marian/Opus-MT-like configuration (post-LN, swish, tied embeddings)."""

    name: str
    layers: int  # encoder layers = decoder layers
    hidden_dim: int
    num_heads: int
    intermediate_dim: int
    vocabulary_size: int


SIZES = {
    "base": ModelSize("base", 6, 512, 8, 2048, 32000),
    "tiny": ModelSize("tiny", 4, 128, 4, 256, 8000),
    # For tests/test_benchmarks.py only: runs the whole harness in seconds.
    "micro": ModelSize("micro", 2, 32, 2, 64, 256),
}

# Marian's special ids: `</s>` first, `<unk>` second, `<pad>` last (which is
# also the decoder start token).
END_ID = 0
UNK_ID = 1


def pad_id(size: ModelSize) -> int:
    return size.vocabulary_size - 1


@dataclasses.dataclass(frozen=True)
class Decode:
    """Translate `batch` sources of `source_length` tokens into exactly
    `new_tokens` tokens each; `beam_size` 1 is greedy search."""

    size: str
    batch: int
    source_length: int
    new_tokens: int
    beam_size: int = 1

    kind = "decode"

    @property
    def name(self) -> str:
        search = "greedy" if self.beam_size == 1 else f"beam {self.beam_size}"
        return f"{self.size} {search}, batch {self.batch}, {self.source_length} -> {self.new_tokens} tokens"

    def sources(self) -> np.ndarray:
        """`(batch, source_length)` int32: random ordinary tokens, then `</s>`."""
        vocab = SIZES[self.size].vocabulary_size
        rng = np.random.default_rng([self.batch, self.source_length, vocab])
        ids = rng.integers(UNK_ID + 1, vocab - 1, size=(self.batch, self.source_length), dtype="int32")
        ids[:, -1] = END_ID
        return ids

    def targets(self) -> np.ndarray:
        """`(batch, new_tokens)` random ordinary tokens, scored teacher-forced by every implementation."""
        vocab = SIZES[self.size].vocabulary_size
        rng = np.random.default_rng([self.batch, self.source_length, self.new_tokens, vocab, 1])
        return rng.integers(UNK_ID + 1, vocab - 1, size=(self.batch, self.new_tokens), dtype="int32")


def target_log_probs(logits: np.ndarray, targets: np.ndarray, excluded_id: int) -> np.ndarray:
    """log p(target) under a softmax over every token but `excluded_id`
    (Marian's `<pad>`, which CTranslate2 removes from the vocabulary)."""
    logits = logits.astype("float64")
    logits[..., excluded_id] = -np.inf
    top = logits.max(axis=-1, keepdims=True)
    log_partition = top[..., 0] + np.log(np.exp(logits - top).sum(axis=-1))
    return np.take_along_axis(logits, targets[..., None], axis=-1)[..., 0] - log_partition


@dataclasses.dataclass(frozen=True)
class Train:
    """`steps` optimizer updates on batches of `batch` pairs of
    `source_length` + `target_length` tokens (no padding)."""

    size: str
    batch: int = 128
    source_length: int = 32
    target_length: int = 32

    kind = "train"

    @property
    def name(self) -> str:
        return f"{self.size} training, {self.batch} pairs of {self.source_length} + {self.target_length} tokens"

    @property
    def tokens_per_step(self) -> int:
        """Source plus target tokens, as the headline table counts them."""
        return self.batch * (self.source_length + self.target_length)

    def arrays(self) -> dict[str, np.ndarray]:
        """`source`, `decoder_input` (`<pad>` as start, then the target
        without its last token) and `labels` (the target, ending in `</s>`)."""
        size = SIZES[self.size]
        vocab = size.vocabulary_size
        rng = np.random.default_rng([self.batch, self.source_length, self.target_length, vocab])
        source = rng.integers(UNK_ID + 1, vocab - 1, size=(self.batch, self.source_length), dtype="int32")
        source[:, -1] = END_ID
        labels = rng.integers(UNK_ID + 1, vocab - 1, size=(self.batch, self.target_length), dtype="int32")
        labels[:, -1] = END_ID
        decoder_input = np.concatenate([np.full((self.batch, 1), pad_id(size), "int32"), labels[:, :-1]], axis=1)
        return {"source": source, "decoder_input": decoder_input, "labels": labels}


Workload = Decode | Train


def headline_workloads(size: str) -> list[Workload]:
    """The headline table's workloads: greedy (first: the agreement check), beam 4, training."""
    return [
        check_workload(size),
        Decode(size, 32, 24, 24, beam_size=4),
        Train(size),
    ]


def check_workload(size: str) -> Decode:
    """Greedy, batch 32, 24 source tokens, 24 new tokens: outputs compared across implementations."""
    return Decode(size, 32, 24, 24)


GRID_BATCHES = {"small": (1, 128), "full": (1, 8, 32, 128)}
GRID_LENGTHS = {"small": (8, 64), "full": (8, 16, 32, 64, 128, 256)}


def grid_workloads(size: str, grid: str) -> list[Decode]:
    """Greedy decoding over batch sizes (24 -> 24 tokens) and source lengths
    (batch 32, as many new tokens as source tokens)."""
    workloads = [Decode(size, batch, 24, 24) for batch in GRID_BATCHES[grid]]
    workloads += [Decode(size, 32, length, length) for length in GRID_LENGTHS[grid]]
    return [w for w in dict.fromkeys(workloads) if w != check_workload(size)]


def workload_from_dict(data: dict) -> Workload:
    data = dict(data)
    kind = data.pop("kind")
    return Decode(**data) if kind == "decode" else Train(**data)


def workload_to_dict(workload: Workload) -> dict:
    return {"kind": workload.kind, **dataclasses.asdict(workload)}


def training_flops(workload: Train) -> float:
    """Model FLOPs of one training step: 3x the forward pass (backward = 2x),
    counting every matrix multiply (2 FLOPs per multiply-add), attention
    scores and mixing over full (unmasked) lengths, and the output projection.
    Element-wise work, softmax and the optimizer are not counted."""
    size = SIZES[workload.size]
    d, ff, vocab, layers = size.hidden_dim, size.intermediate_dim, size.vocabulary_size, size.layers
    b, s, t = workload.batch, workload.source_length, workload.target_length
    encoder = b * s * (8 * d * d + 4 * d * ff + 4 * s * d)
    decoder = (
        b
        * t
        * (
            8 * d * d  # self-attention projections
            + 4 * d * d  # cross-attention query and output projections
            + 4 * d * ff
            + 4 * t * d  # self-attention scores and mixing
            + 4 * s * d  # cross-attention scores and mixing
        )
        + b * s * 4 * d * d
    )  # cross-attention keys and values of the source
    logits = b * t * 2 * d * vocab
    return 3.0 * (layers * (encoder + decoder) + logits)


def timed_calls(call: Callable[[], object], repeats: int) -> tuple[float, list[float]]:
    """Seconds of a first call (compilation included), then of each of `repeats` more.

    Example:
    >>> first, seconds = timed_calls(lambda: None, repeats=2)
    >>> len(seconds)
    2
    """
    start = time.perf_counter()
    call()
    first = time.perf_counter() - start
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    return first, seconds
