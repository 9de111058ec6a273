"""Where a torch decoding call's time goes, next to Hugging Face's `MarianMTModel.generate`.

    KERAS_BACKEND=torch python -m benchmarks.torch_profile --size tiny --beam 1
    KERAS_BACKEND=torch python -m benchmarks.torch_profile --size base --beam 4

Each runs the benchmark's decoding workload (`benchmarks.run`: the random
Marian checkpoint, batch 32, 24 source tokens, exactly 24 new tokens) once
to warm up, then once under `torch.profiler`, and prints its wall time and
its operators by self CPU time, so that the work one step does and the
other's does not stands out (copies, index building, conversions). One
implementation per process (`--peer hf` for Hugging Face's): torch fixes its
thread pools once per process.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from benchmarks import REPO_ROOT


def profiled(decode, rows: int) -> str:
    """Runs `decode` once under `torch.profiler`; its wall time and top `rows` operators."""
    import torch

    decode()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        start = time.perf_counter()
        decode()
        seconds = time.perf_counter() - start
    table = profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)
    return f"wall {seconds:.3f} s (profiled)\n{table}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="tiny", choices=("micro", "tiny", "base"))
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=20)
    parser.add_argument("--peer", action="store_true", help="profile Hugging Face's generate")
    parser.add_argument("--workdir", type=Path, default=REPO_ROOT / "benchmarks" / ".work")
    args = parser.parse_args(argv)
    if os.environ.setdefault("KERAS_BACKEND", "torch") != "torch":
        raise SystemExit("this profile compares torch paths: run it with KERAS_BACKEND=torch")

    from benchmarks.checkpoint import build
    from benchmarks.peers import HuggingFace
    from benchmarks.project import ProjectImplementation
    from benchmarks.workloads import Decode

    checkpoint = build(args.size, args.workdir / args.size, convert=False)
    workload = Decode(args.size, 32, 24, 24, beam_size=args.beam)
    if args.peer:
        name, implementation = "Hugging Face MarianMTModel.generate", HuggingFace(checkpoint, args.threads)
    else:
        name, implementation = "this project", ProjectImplementation(checkpoint, "float32", args.threads)
    print(f"## {name}: {workload.name}, {args.threads} threads")
    print(profiled(lambda: implementation.decode(workload), args.rows))


if __name__ == "__main__":
    main()
