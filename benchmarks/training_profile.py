"""Where a training step's time goes (TensorFlow with XLA, the default path).

    python -m benchmarks.training_profile --size base     # 128 pairs of 32 + 32 tokens

The benchmark's random Marian checkpoint (`benchmarks.checkpoint`) loaded
into this project, compiled with the paper's recipe, and timed in cumulative
stages, each one XLA-compiled function on the same batch as
`benchmarks.run`'s training workload:

1. the backbone's forward pass (encoder and decoder stacks, dropout on);
2. + the output projection to the vocabulary (logits);
3. + the label-smoothed cross-entropy;
4. + the backward pass (gradients of every weight);
5. the whole `fit` step (4 + Adam's update and the metrics).

Each stage's share is the difference to the one before; the counted FLOPs
of stages 1 and 2 (3x for the backward pass, as `benchmarks.workloads`
counts) show which part runs far from the matmul peak.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from benchmarks import REPO_ROOT


def stage_functions(model, x, y, w) -> dict:
    import tensorflow as tf

    backbone = model.backbone

    def forward():
        return backbone(x, training=True)["decoder_sequence_output"]

    def logits():
        return backbone.logits(forward())

    def loss():
        return model.compute_loss(x=x, y=y, y_pred=logits(), sample_weight=w, training=True)

    def gradients():
        with tf.GradientTape() as tape:
            value = loss()
        return tape.gradient(value, model.trainable_variables)

    compile = lambda f: tf.function(f, jit_compile=True)  # noqa: E731
    return {
        "forward (backbone)": compile(forward),
        "+ output projection": compile(logits),
        "+ label-smoothed loss": compile(loss),
        "+ backward pass": compile(gradients),
    }


def median_seconds(function, repeats: int) -> tuple[float, float]:
    start = time.perf_counter()
    function()
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return first, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="base", choices=("micro", "tiny", "base"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=REPO_ROOT / "benchmarks" / ".work")
    args = parser.parse_args()
    if os.environ.setdefault("KERAS_BACKEND", "tensorflow") != "tensorflow":
        raise SystemExit("this profile times TensorFlow functions: run it with KERAS_BACKEND=tensorflow")

    import numpy as np
    from keras import ops

    from benchmarks.checkpoint import build
    from benchmarks.project import ProjectImplementation
    from benchmarks.workloads import SIZES, Train, training_flops

    implementation = ProjectImplementation(build(args.size, args.workdir / args.size), "float32", args.threads)
    model = implementation.model
    model.compile()
    workload = Train(args.size)
    arrays = workload.arrays()
    x = {
        "encoder_token_ids": arrays["source"],
        "encoder_padding_mask": np.ones_like(arrays["source"]),
        "decoder_token_ids": arrays["decoder_input"],
        "decoder_padding_mask": np.ones_like(arrays["decoder_input"]),
    }
    x = {k: ops.convert_to_tensor(v) for k, v in x.items()}
    y = ops.convert_to_tensor(arrays["labels"])
    w = ops.convert_to_tensor(np.ones_like(arrays["labels"], "float32"))

    rows = []
    for name, function in stage_functions(model, x, y, w).items():
        rows.append((name, *median_seconds(function, args.repeats)))

    def fit_steps(steps: int) -> None:
        repeat = lambda a: np.tile(a, (steps, 1))  # noqa: E731
        numpy_x = {k: repeat(ops.convert_to_numpy(v)) for k, v in x.items()}
        model.fit(numpy_x, repeat(arrays["labels"]), batch_size=workload.batch, epochs=1, verbose=0, shuffle=False)

    # The whole step: fit over `repeats` batches after one compiling call.
    start = time.perf_counter()
    fit_steps(1)
    first = time.perf_counter() - start
    start = time.perf_counter()
    fit_steps(args.repeats)
    rows.append(("whole fit step (+ Adam, metrics)", first, (time.perf_counter() - start) / args.repeats))

    size = SIZES[args.size]
    b, t, d, vocab = workload.batch, workload.target_length, size.hidden_dim, size.vocabulary_size
    projection_flops = 2 * b * t * d * vocab
    backbone_flops = training_flops(workload) / 3 - projection_flops
    print(
        f"{args.size} training step, {workload.batch} pairs of {workload.source_length} + {workload.target_length} "
        f"tokens, TensorFlow + XLA, {args.threads} threads (median of {args.repeats}):"
    )
    print("| stage | cumulative ms | this stage ms | share of the step | counted GFLOP | GFLOP/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    step_ms = rows[-1][2] * 1000
    previous = 0.0
    flops = {
        "forward (backbone)": backbone_flops,
        "+ output projection": projection_flops,
        "+ backward pass": 2 * (backbone_flops + projection_flops),
    }
    for name, _, seconds in rows:
        ms = seconds * 1000
        stage = ms - previous
        counted = flops.get(name)
        rate = f"{counted / (stage / 1000) / 1e9:.0f}" if counted and stage > 0 else "-"
        counted_text = f"{counted / 1e9:.1f}" if counted else "-"
        print(f"| {name} | {ms:.1f} | {stage:.1f} | {stage / step_ms:.0%} | {counted_text} | {rate} |")
        previous = ms
    print("first calls (compilation), s: " + ", ".join(f"{name} {first:.1f}" for name, first, _ in rows))


if __name__ == "__main__":
    main()
