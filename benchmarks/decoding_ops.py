"""Where a decoding call's time goes, operation by operation (XLA on TensorFlow or JAX).

    python -m benchmarks.decoding_ops --size base --beam-size 4

`benchmarks.decoding_profile` times a step with parts taken out; this asks
XLA itself. With `--xla_cpu_enable_xprof_traceme` every operation of the
compiled search is a profiler event, and the optimised program (dumped
beside it) names the model operation each one came from. The benchmark's
decoding workload (the random Marian checkpoint, batch 32 unless `--batch`,
24 source tokens, exactly 24 new tokens; float32 unless `--precision int8`)
runs a few times under the backend's profiler, and the events are summed by
role:

- **output projection**: the logits `h @ E^T` over the vocabulary;
- **feed-forward**, **attention projections** (W^Q, W^K, W^V, W^O): the
  decoder's dense layers, one row per hypothesis;
- **attention products**: `Q K^T` and the weighted sum of the values;
- **other work in the loop**: softmaxes, layer norms, cache writes, the
  search's own work (log-softmax, top-k, finished pool) and what XLA added
  itself (split reductions, copies);
- **once per batch**: everything outside the decoding loop (the encoder,
  the cross-attention keys and values, the first step).

A fusion that XLA hands to YNNPACK as a whole is counted by the matrix
product inside it, if it holds one. `--top N` also lists the N model
operations that took longest (`while/LogSoftmax`, `while/TopKV2`, ...),
each with all the XLA operations it became. The events cover the whole
call when the operations run one after another, as here; `covered` says
how much.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import glob
import os
import re
import tempfile
import time
from pathlib import Path

from benchmarks import REPO_ROOT

BATCH, SOURCE_LENGTH, NEW_TOKENS = 32, 24, 24
ROLES = (
    "output projection",
    "feed-forward",
    "attention projections",
    "attention products",
    "other work in the loop",
    "once per batch",
)


def role_of(op_name: str, is_matrix_product: bool) -> str:
    """The role of one operation, from the model operation XLA says it came
    from (`op_name` metadata: TensorFlow's `while/feedforward_output_dense_3/
    Tensordot/MatMul`, JAX's `jit(stateless)/while/body/feedforward_output_dense/dot_general`).

    Example:
    >>> role_of("while/token_embedding_3/Tensordot/MatMul", True)
    'output projection'
    >>> role_of("jit(stateless)/while/body/query/dot_general", True)
    'attention projections'
    >>> role_of("encoder_block_0_1/feedforward_output_dense_1/Tensordot/MatMul", True)
    'once per batch'
    """
    if "while/" not in op_name:
        return "once per batch"
    if "token_embedding" in op_name and is_matrix_product:
        return "output projection"
    if re.search(r"feed_?forward", op_name) and is_matrix_product:
        return "feed-forward"
    if re.search(r"/(query|key|value|attention_output|output)(_projection)?(_\d+)?/", op_name) and is_matrix_product:
        return "attention projections"
    if is_matrix_product:
        return "attention products"
    return "other work in the loop"


def operation_origins(program: str) -> dict[str, tuple[str, bool]]:
    """Operation name -> (the model operation it came from, whether it is a
    matrix product), for every operation of an optimised HLO module. An
    operation that XLA made without naming a model operation (a reduction
    it split, a copy) is named after itself, inside the loop if its
    computation is the loop's."""
    computations = re.findall(r"^(?:ENTRY )?(%[\w.\-]+) \(.*?\n(.*?)\n\}", program, flags=re.S | re.M)
    bodies = dict(computations)
    in_loop = set(re.findall(r"\b(?:body|condition)=(%[\w.\-]+)", program))
    origins = {}
    for computation, body in computations:
        for name, opcode, rest in re.findall(r"^\s*(?:ROOT )?%([\w.\-]+) = \S+ ([\w\-]+)\((.*)$", body, flags=re.M):
            metadata = re.search(r'op_name="([^"]+)"', rest)
            op_name = metadata.group(1) if metadata else ""
            is_matrix_product = opcode in ("dot", "convolution")
            called = re.search(r"calls=(%[\w.\-]+)", rest)
            if opcode == "fusion" and called and called.group(1) in bodies:
                inner = re.search(r" dot\(.*?op_name=\"([^\"]+)\"", bodies[called.group(1)])
                if inner:
                    op_name, is_matrix_product = inner.group(1), True
            if not op_name:
                op_name = f"while/{name}" if computation in in_loop else name
            origins[name] = (op_name, is_matrix_product)
    return origins


def event_times(logdir: str) -> collections.Counter:
    """Seconds per event name (operations, and the calls and waits around
    them), summed over every thread."""
    try:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    except ImportError as error:
        raise SystemExit(f"reading the profile needs TensorFlow's xplane protocol buffers: {error}") from error
    [path] = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True))[-1:]
    space = xplane_pb2.XSpace()
    space.ParseFromString(Path(path).read_bytes())
    seconds = collections.Counter()
    for plane in space.planes:
        names = {key: metadata.name for key, metadata in plane.event_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                seconds[names.get(event.metadata_id, "")] += event.duration_ps * 1e-12
    return seconds


@contextlib.contextmanager
def profiled(backend: str, logdir: str):
    """The backend's profiler, writing to `logdir`."""
    if backend == "jax":
        import jax

        with jax.profiler.trace(logdir):
            yield
        return
    import tensorflow as tf

    tf.profiler.experimental.start(logdir)
    try:
        yield
    finally:
        tf.profiler.experimental.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="base", choices=("micro", "tiny", "base"))
    parser.add_argument("--beam-size", type=int, default=4, help="1: greedy search")
    parser.add_argument("--calls", type=int, default=5, help="profiled decoding calls, after two unprofiled ones")
    parser.add_argument("--batch", type=int, default=BATCH, help="sentences a call")
    parser.add_argument("--precision", default="float32", choices=("float32", "int8"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--top", type=int, default=0, help="also list the N costliest model operations")
    parser.add_argument("--workdir", type=Path, default=REPO_ROOT / "benchmarks" / ".work")
    args = parser.parse_args(argv)
    backend = os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    if backend not in ("tensorflow", "jax"):
        raise SystemExit("this profile reads XLA's operations: run it with KERAS_BACKEND=tensorflow or jax")
    with tempfile.TemporaryDirectory(prefix="decoding_ops_") as scratch:
        profile(args, backend, dump=os.path.join(scratch, "hlo"), logdir=os.path.join(scratch, "trace"))


def profile(args: argparse.Namespace, backend: str, dump: str, logdir: str) -> None:
    """Decodes under the profiler and prints the table (XLA's program dumped to `dump`)."""
    # Read when XLA starts, so before the backend is imported.
    os.environ["XLA_FLAGS"] = " ".join(
        [
            os.environ.get("XLA_FLAGS", ""),
            "--xla_cpu_enable_xprof_traceme=true",
            f"--xla_dump_to={dump}",
            "--xla_dump_hlo_as_text",
            "--xla_dump_hlo_module_re=.*(inference_function|stateless).*",
        ]
    ).strip()

    from benchmarks.checkpoint import build
    from benchmarks.project import ProjectImplementation
    from benchmarks.workloads import Decode

    implementation = ProjectImplementation(build(args.size, args.workdir / args.size), args.precision, args.threads)
    beam_size = None if args.beam_size == 1 else args.beam_size
    workload = Decode(args.size, args.batch, SOURCE_LENGTH, NEW_TOKENS, beam_size=beam_size)
    implementation.decode(workload)
    implementation.decode(workload)
    with profiled(backend, logdir):
        start = time.perf_counter()
        for _ in range(args.calls):
            implementation.decode(workload)
        call_s = (time.perf_counter() - start) / args.calls
    programs = glob.glob(os.path.join(dump, "*after_optimizations.txt"))
    if not programs:
        raise SystemExit(f"XLA wrote no optimised program to {dump}: was the search compiled?")
    origins = operation_origins(max((Path(p).read_text() for p in programs), key=len))
    by_role, by_origin = collections.Counter(), collections.Counter()
    for name, seconds in event_times(logdir).items():
        if name in origins:  # an operation, not a call or a wait around them
            by_role[role_of(*origins[name])] += seconds / args.calls
            by_origin[origins[name][0]] += seconds / args.calls
    covered = sum(by_role.values())
    if not covered:
        raise SystemExit(
            "the profile holds no event of the search's operations: does this XLA support "
            "--xla_cpu_enable_xprof_traceme?"
        )
    search = "greedy" if beam_size is None else f"beam {beam_size}"
    print(
        f"{args.size} {args.precision}, {search}, batch {args.batch}, {SOURCE_LENGTH} -> {NEW_TOKENS} tokens, "
        f"{backend} + XLA, "
        f"{args.threads} threads: {call_s:.3f} s a call; operations cover {covered / call_s:.0%} of it"
    )
    print("| part | ms per call | ms per step | share |")
    print("| --- | --- | --- | --- |")
    for role in ROLES:
        ms = by_role[role] * 1e3
        print(f"| {role} | {ms:.1f} | {ms / NEW_TOKENS:.2f} | {by_role[role] / covered:.0%} |")
    if args.top:
        print(f"\nThe {args.top} costliest model operations (XLA's operations summed by the one they came from):")
        print("| model operation | ms per call | share |")
        print("| --- | --- | --- |")
        for origin, seconds in by_origin.most_common(args.top):
            print(f"| {origin} | {seconds * 1e3:.1f} | {seconds / covered:.1%} |")


if __name__ == "__main__":
    main()
