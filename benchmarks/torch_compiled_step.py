"""torch decoding eager, with each search step through `torch.compile`, and Hugging Face's, timed.

    python -m benchmarks.torch_compiled_step --size tiny --beam 1
    python -m benchmarks.torch_compiled_step --size tiny --beam 4

The benchmark's decoding workload (`benchmarks.run`: the random Marian
checkpoint, batch 32, 24 source tokens, exactly 24 new tokens) through
Hugging Face's `MarianMTModel.generate`, this project eagerly, and this
project with `jit_compile=True` (each step of its search, decoding and
choosing, through `torch.compile`), each in a process of its own (torch
fixes its thread pools once per process): the first call (compilation
included, shorter when torch's compile cache already holds the graph),
then the median of `--repeats` calls.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks import REPO_ROOT

IMPLEMENTATIONS = ("hf", "eager", "compiled")
SENTENCES = 32


def time_one(size: str, beam: int, name: str, threads: int, repeats: int, workdir: Path) -> dict:
    """Times one implementation in this process."""
    from benchmarks.checkpoint import build
    from benchmarks.peers import HuggingFace
    from benchmarks.project import ProjectImplementation
    from benchmarks.workloads import Decode, timed_calls

    checkpoint = build(size, workdir / size, convert=False)
    workload = Decode(size, SENTENCES, 24, 24, beam_size=beam)
    if name == "hf":
        implementation = HuggingFace(checkpoint, threads)
    else:
        implementation = ProjectImplementation(checkpoint, "float32", threads, jit_compile=name == "compiled")
    first, seconds = timed_calls(lambda: implementation.decode(workload), repeats)
    return {"first_s": first, "sentences_per_s": SENTENCES / statistics.median(seconds)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="tiny", choices=("micro", "tiny", "base"))
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=REPO_ROOT / "benchmarks" / ".work")
    parser.add_argument("--one", choices=IMPLEMENTATIONS, help=argparse.SUPPRESS)  # a child process
    passed = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(passed)
    if args.one:
        print(json.dumps(time_one(args.size, args.beam, args.one, args.threads, args.repeats, args.workdir)))
        return
    env = {**os.environ, "KERAS_BACKEND": "torch"}
    results = {}
    for name in IMPLEMENTATIONS:
        command = [sys.executable, "-m", "benchmarks.torch_compiled_step", *passed, "--one", name]
        output = subprocess.run(command, env=env, cwd=REPO_ROOT, check=True, capture_output=True, text=True).stdout
        results[name] = json.loads(output.strip().splitlines()[-1])
    hf = results["hf"]["sentences_per_s"]
    print(f"{args.size}, beam {args.beam}, {args.threads} threads, {SENTENCES} sentences, float32")
    print("| implementation | sentences/s | first call | / Hugging Face |")
    print("| --- | --- | --- | --- |")
    for name, result in results.items():
        rate = result["sentences_per_s"]
        print(f"| {name} | {rate:.1f} | {result['first_s']:.1f} s | {rate / hf:.2f} |")


if __name__ == "__main__":
    main()
