"""Per-step decoding cost as outputs grow, and recompilation on new batches.

Three checks that decoding cost stays flat as outputs grow, one process each:

    python -m benchmarks.decoding_steps                   # TensorFlow, tiny and base
    python -m benchmarks.decoding_steps --backend jax --sizes tiny

1. **Per-step growth.** The benchmark's random Marian checkpoint (as in
   `benchmarks.run`), batch 32, 8 source tokens, decoded to exactly n = 8,
   16, 32, 64 and 128 new tokens (greedy and beam 4; the end token is
   suppressed as in `benchmarks/project.py`). The time of steps n1+1..n2 is
   the difference of the steady-state calls, divided by n2 - n1. Each step
   attends over the whole output buffer (n + 1 positions) and recomputes no
   earlier position, so a step's cost should grow only with the attention
   over that buffer; the table shows the counted FLOPs per step beside the
   measured time, both relative to the first interval.
2. **Buffer length at a fixed number of steps.** The same model decodes
   exactly 24 tokens with output buffers of 25, 65, 129 and 257 positions
   (`generate(max_length=...)`), one thread: what a longer buffer alone
   costs (attention over it, and any copy of the caches).
3. **No recompilation for a new batch.** The shipped `multi30k_en_de`
   translates test_2016_flickr in batches of 32 with `generate` (beam 4):
   sources are padded to a multiple of 16 tokens, so batches of similar
   length share one compiled search. For each batch: its padded length, its
   time, whether a new search was built (the full source + 50 buffer, the
   first time a batch does not finish within the short one), and
   (TensorFlow) whether a search built before was traced again.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

from benchmarks import REPO_ROOT

NEW_TOKENS = (8, 16, 32, 64, 128)
SOURCE_LENGTH = 8
BUFFERS = (25, 65, 129, 257)
PARTS = ("growth", "buffers", "batches")
BUFFER_STEPS = 24


def step_flops(size_name: str, buffer_length: int, source_length: int, beam_size: int) -> float:
    """Counted FLOPs of one decoder step for one sentence (all its beams):
    projections, attention over `buffer_length` cached positions and the
    source, feed-forward and output projection (2 FLOPs a multiply-add)."""
    from benchmarks.workloads import SIZES

    size = SIZES[size_name]
    d, ff, vocab = size.hidden_dim, size.intermediate_dim, size.vocabulary_size
    per_layer = 2 * (4 * d * d) + 2 * (2 * d * d) + 4 * buffer_length * d + 4 * source_length * d + 4 * d * ff
    return beam_size * (size.layers * per_layer + 2 * d * vocab)


def measure_growth(size_name: str, workdir: Path, repeats: int, threads: int) -> list[dict]:
    from benchmarks.checkpoint import build
    from benchmarks.project import ProjectImplementation
    from benchmarks.workloads import Decode, timed_calls

    checkpoint = build(size_name, workdir / size_name)
    implementation = ProjectImplementation(checkpoint, "float32", threads)
    rows = []
    for beam_size in (1, 4):
        for n in NEW_TOKENS:
            workload = Decode(size_name, 32, SOURCE_LENGTH, n, beam_size=beam_size)
            first, times = timed_calls(partial(implementation.decode, workload), repeats)
            rows.append(
                {
                    "size": size_name,
                    "beam_size": beam_size,
                    "new_tokens": n,
                    "first_s": first,
                    "steady_s": statistics.median(times),
                }
            )
    return rows


def measure_buffers(size_name: str, workdir: Path, repeats: int) -> list[dict]:
    import numpy as np

    from benchmarks.checkpoint import build
    from benchmarks.project import ProjectImplementation
    from benchmarks.workloads import Decode

    implementation = ProjectImplementation(build(size_name, workdir / size_name), "float32", 1)
    sources = Decode(size_name, 32, SOURCE_LENGTH, BUFFER_STEPS).sources()
    inputs = {"encoder_token_ids": sources, "encoder_padding_mask": np.ones_like(sources)}
    rows = []
    for beam_size in (1, 4):
        for buffer in BUFFERS:

            def decode(buffer=buffer, beam_size=beam_size):
                # The end token is forced after BUFFER_STEPS tokens (the source has
                # SOURCE_LENGTH - 1 tokens besides its end token).
                return implementation.model.generate(
                    inputs,
                    max_length=buffer,
                    beam_size=None if beam_size == 1 else beam_size,
                    max_extra_length=BUFFER_STEPS - (SOURCE_LENGTH - 1),
                )

            decode()
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                decode()
                times.append(time.perf_counter() - start)
            rows.append(
                {"size": size_name, "beam_size": beam_size, "buffer": buffer, "steady_s": statistics.median(times)}
            )
    return rows


def measure_batches(beam_size: int, limit: int | None) -> list[dict]:
    import keras

    from keras_transformer import Transformer
    from keras_transformer.generation.translation import tokenize
    from keras_transformer.utils.files import read_lines

    data = Path(os.environ.get("KERAS_TRANSFORMER_DATA", REPO_ROOT.parent / "shared" / "data")) / "multi30k"
    sources = list(read_lines(data / "raw" / "test_2016_flickr.en.gz"))[:limit]
    model = Transformer.from_preset("multi30k_en_de")
    rows = []
    for index in range(0, len(sources), 32):
        batch = sources[index : index + 32]
        packed = model.preprocessor.pack_sources(tokenize(model.preprocessor.tokenizer, batch))
        traces_before = _trace_counts(model)
        start = time.perf_counter()
        model.generate(batch, beam_size=beam_size)
        seconds = time.perf_counter() - start
        traces_after = _trace_counts(model)
        tensorflow = keras.config.backend() == "tensorflow"
        rows.append(
            {
                "batch": index // 32,
                "sentences": len(batch),
                "padded_length": packed["encoder_token_ids"].shape[1],
                "seconds": seconds,
                # Searches built for this batch: the full source + 50 buffer the
                # first time a batch does not finish within the short one.
                "new_searches": len(traces_after) - len(traces_before),
                # Searches built before and traced again (a recompilation).
                "retraced": sum(traces_after[k] - n for k, n in traces_before.items()) if tensorflow else None,
            }
        )
    return rows


def _trace_counts(model) -> dict:
    """The model's compiled searches (by configuration) and, on TensorFlow,
    how many times each was traced."""
    functions = model.compiled_searches
    return {key: getattr(f, "experimental_get_tracing_count", lambda: 0)() for key, f in functions.items()}


def growth_table(rows: list[dict]) -> list[str]:
    lines = [
        "| size | search | steps | ms a step (measured) | relative | counted FLOPs a step, relative "
        "| first call s (compilation) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for (size, beam), group in _groups(rows, ("size", "beam_size")).items():
        group = sorted(group, key=lambda r: r["new_tokens"])
        base_ms = base_flops = None
        for previous, current in zip(group, group[1:]):
            n1, n2 = previous["new_tokens"], current["new_tokens"]
            ms = 1000 * (current["steady_s"] - previous["steady_s"]) / (n2 - n1)
            # The mean buffer length over these steps (each call's buffer is n + 1).
            flops = step_flops(size, (n1 + n2) // 2 + 1, SOURCE_LENGTH, beam)
            base_ms, base_flops = base_ms or ms, base_flops or flops
            lines.append(
                f"| {size} | {'greedy' if beam == 1 else f'beam {beam}'} | {n1 + 1}-{n2} | {ms:.2f} | "
                f"{ms / base_ms:.2f} | {flops / base_flops:.2f} | {current['first_s']:.1f} |"
            )
    return lines


def buffers_table(rows: list[dict]) -> list[str]:
    lines = [
        "| size | search | " + " | ".join(f"buffer {b}" for b in BUFFERS) + " |",
        "| --- | --- | " + " | ".join("---" for _ in BUFFERS) + " |",
    ]
    for (size, beam), group in _groups(rows, ("size", "beam_size")).items():
        cells = [f"{r['steady_s']:.3f}" for r in sorted(group, key=lambda r: r["buffer"])]
        lines.append(f"| {size} | {'greedy' if beam == 1 else f'beam {beam}'} | " + " | ".join(cells) + " |")
    return lines


def batches_table(rows: list[dict]) -> list[str]:
    lines = [
        "| padded source length | batches | first batch s | other batches: median s (max) "
        "| new searches after the first batch | searches traced again |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for (length,), group in sorted(_groups(rows, ("padded_length",)).items()):
        later = [r["seconds"] for r in group[1:]]
        # A bucket's first batch traces the searches for its shape.
        retraced = [r["retraced"] for r in group[1:] if r["retraced"] is not None]
        later_text = f"{statistics.median(later):.2f} ({max(later):.2f})" if later else "-"
        lines.append(
            f"| {length} | {len(group)} | {group[0]['seconds']:.2f} | {later_text} | "
            f"{sum(r['new_searches'] for r in group[1:])} | {sum(retraced) if retraced else '-'} |"
        )
    return lines


def _groups(rows: list[dict], keys: tuple) -> dict:
    groups: dict = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in keys), []).append(row)
    return groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="tensorflow", choices=("tensorflow", "jax", "torch"))
    parser.add_argument("--sizes", nargs="+", default=["tiny", "base"], choices=("micro", "tiny", "base"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--limit", type=int, help="only the first N test sentences")
    parser.add_argument("--workdir", type=Path, default=REPO_ROOT / "build" / "benchmarks")
    parser.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)  # in a worker process
    args = parser.parse_args()
    if args.part == "growth":
        rows = [row for size in args.sizes for row in measure_growth(size, args.workdir, args.repeats, args.threads)]
        print(json.dumps(rows))
        return
    if args.part == "buffers":
        print(json.dumps(measure_buffers(args.sizes[0], args.workdir, args.repeats)))
        return
    if args.part == "batches":
        print(json.dumps(measure_batches(4, args.limit)))
        return
    environment = {**os.environ, "KERAS_BACKEND": args.backend}
    results = {}
    for part in PARTS:
        command = [
            sys.executable,
            "-m",
            "benchmarks.decoding_steps",
            "--part",
            part,
            "--sizes",
            *args.sizes,
            "--repeats",
            str(args.repeats),
            "--threads",
            str(args.threads),
            "--workdir",
            str(args.workdir),
        ]
        command += ["--limit", str(args.limit)] if args.limit else []
        output = subprocess.run(command, cwd=REPO_ROOT, env=environment, capture_output=True, text=True)
        if output.returncode:
            raise RuntimeError(f"{' '.join(command)} failed:\n{output.stderr[-3000:]}")
        results[part] = json.loads(output.stdout.strip().splitlines()[-1])
    print(
        f"Per-step cost, {args.backend}, float32, batch 32, {SOURCE_LENGTH} source tokens "
        f"(median of {args.repeats} steady calls):"
    )
    print("\n".join(growth_table(results["growth"])))
    print(
        f"\nSeconds for exactly {BUFFER_STEPS} tokens, {args.backend}, float32, batch 32, one thread, "
        f"{args.sizes[0]} size (median of {args.repeats}):"
    )
    print("\n".join(buffers_table(results["buffers"])))
    print(f"\nmulti30k_en_de on test_2016_flickr, {args.backend}, beam 4, batches of 32, in file order:")
    print("\n".join(batches_table(results["batches"])))


if __name__ == "__main__":
    main()
