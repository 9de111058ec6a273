"""Where a decoding step's time goes (TensorFlow with XLA, the default path, or JAX).

    python -m benchmarks.decoding_profile --size base     # batch 32, 24 -> 24 tokens

XLA compiles the whole search into one program, so its parts cannot be timed
one by one from outside; this times the benchmark's decoding workload
(`benchmarks.run`: the random Marian checkpoint, batch 32, 24 source
tokens, exactly 24 new tokens) with one part of each step taken out at a
time, and reports what each removal saves per step:

- **cache reorder** (beam search): the self-attention cache follows the
  surviving beams (`TransformerBackbone.reorder_cache`; since the beams of a
  sentence share its cache, only the table of which slot holds each
  position moves), replaced by nothing;
- **attention over the caches**: each attention reads its keys and values
  (`cached_attention.attend_cached`), replaced by the query and output
  projections alone (the key/value projections and cache writes go too);
- **output projection**: the logits `h @ E^T` over the vocabulary
  (`TransformerBackbone.logits`), replaced by a padded slice of `h`;
- **encoder**: the encoder stack of the batch, timed alone (once per batch,
  not per step).

Everything left after the removals is the decoder's projections and
feed-forward layers, layer norms and the search's own bookkeeping (log-softmax,
top-k, finished pool). A removal changes the searched tokens, not the number
of steps (the end token is suppressed), so the work per step stays comparable.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from pathlib import Path

from benchmarks import REPO_ROOT

BATCH, SOURCE_LENGTH, NEW_TOKENS = 32, 24, 24


@contextlib.contextmanager
def replaced(owner, name: str, value):
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


def removals() -> dict:
    """Name -> context manager factory that takes that part out of every step."""
    from keras import ops

    from keras_transformer.layers import decoder_block
    from keras_transformer.models.transformer_backbone import TransformerBackbone

    def projections_only(attention, query_input, keys, values, mask, beams, update_index=None):
        return attention.output_projection(attention.query_projection(query_input)), keys, values

    def no_output_projection(self, hidden):
        return ops.pad(hidden[..., :1], [(0, 0), (0, 0), (0, self.vocabulary_size - 1)])

    return {
        "cache reorder": lambda: replaced(
            TransformerBackbone, "reorder_cache", lambda self, cache, rows, length: cache
        ),
        "attention over the caches": lambda: replaced(decoder_block, "attend_cached", projections_only),
        "output projection": lambda: replaced(TransformerBackbone, "logits", no_output_projection),
    }


def compiled(function):
    """`function` compiled by XLA on the active backend."""
    import keras

    if keras.config.backend() == "jax":
        import jax

        return jax.jit(function)
    import tensorflow as tf

    return tf.function(function, jit_compile=True)


def steady_seconds(function, repeats: int) -> float:
    function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="base", choices=("micro", "tiny", "base"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=REPO_ROOT / "benchmarks" / ".work")
    args = parser.parse_args(argv)
    backend = os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    if backend not in ("tensorflow", "jax"):
        raise SystemExit("this profile times a search compiled by XLA: run it with KERAS_BACKEND=tensorflow or jax")

    from keras import ops

    from benchmarks.checkpoint import build
    from benchmarks.project import ProjectImplementation
    from benchmarks.workloads import Decode

    implementation = ProjectImplementation(build(args.size, args.workdir / args.size), "float32", args.threads)
    model = implementation.model
    print(
        f"{args.size}, batch {BATCH}, {SOURCE_LENGTH} -> {NEW_TOKENS} tokens, {backend} + XLA, "
        f"{args.threads} threads (median of {args.repeats}):"
    )
    print("| search | whole call s | per step ms | part taken out | saves per step ms | share |")
    print("| --- | --- | --- | --- | --- | --- |")
    for beam_size in (1, 4):
        workload = Decode(args.size, BATCH, SOURCE_LENGTH, NEW_TOKENS, beam_size=beam_size)

        def decode(workload=workload):
            model.forget_compiled_searches()  # trace again with the part taken out
            return steady_seconds(lambda: implementation.decode(workload), args.repeats)

        whole = decode()
        label = "greedy" if beam_size == 1 else f"beam {beam_size}"
        print(f"| {label} | {whole:.3f} | {whole / NEW_TOKENS * 1000:.1f} | - | - | - |")
        for name, removal in removals().items():
            if name == "cache reorder" and beam_size == 1:
                continue
            with removal():
                saved = (whole - decode()) / NEW_TOKENS * 1000
            print(f"| {label} | | | {name} | {saved:.1f} | {saved / (whole / NEW_TOKENS * 1000):.0%} |")
        sources = workload.sources()
        encode = compiled(lambda s: model.backbone.encode(s, ops.ones_like(s)))
        source_ids = ops.convert_to_tensor(sources)
        encoder_s = steady_seconds(lambda f=encode, x=source_ids: ops.convert_to_numpy(f(x)), args.repeats)
        print(
            f"| {label} | | | encoder (once per batch) | {encoder_s / NEW_TOKENS * 1000:.1f} | "
            f"{encoder_s / whole:.0%} |"
        )


if __name__ == "__main__":
    main()
