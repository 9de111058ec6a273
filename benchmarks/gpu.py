"""The benchmark on a GPU machine, in priority order until a deadline.

    python -m benchmarks.gpu --workdir DIR --seconds 240
    python -m benchmarks.gpu --workdir DIR --seconds 600 --device cpu --size micro --train-batch 8  # smoke test

For a GPU machine that has JAX and PyTorch but neither TensorFlow nor
CTranslate2 (nor a network to install them), and only a limited time: this project on JAX (and, for
decoding, PyTorch) against Hugging Face's `MarianMTModel`, all on one random
base Marian checkpoint (`benchmarks.checkpoint --no-ct2`). Each job runs in
its own `benchmarks.worker` process, in this order, while time is left:

1. base training on the paper's batch (800 pairs of 32 + 32 tokens: 25,600
   source and 25,600 target tokens, section 5.1) in mixed precision: this
   project with Keras' `mixed_bfloat16`, Hugging Face under bfloat16
   `torch.autocast`;
2. the same in float32 (JAX's matrix products at "highest" precision and
   torch without TF32, so that neither uses TF32);
3. base decoding, batch 32, greedy and beam 4, float32: Hugging Face first (its
   greedy output is the reference the others are checked against), then this
   project on JAX and on PyTorch.

Writes DIR/gpu_results.json and DIR/GPU.md: tokens or sentences a second,
ratios to Hugging Face, model FLOPs utilisation against matrix-multiply peaks
measured in the same run, and the paper's base training speed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import REPO_ROOT
from benchmarks.workloads import Decode, Train, check_workload, training_flops, workload_to_dict

PAPER_BATCH_PAIRS = 800  # of 32 + 32 tokens
# Section 5.2: base models took about 0.4 s a step on 8 P100s, each step about
# 25,000 source + 25,000 target tokens.
PAPER_TOKENS_PER_S = 50_000 / 0.4


def jobs(size: str, train_batch: int) -> list[dict]:
    """`(implementation, backend, precision, workloads)` in priority order."""
    train = [workload_to_dict(Train(size, batch=train_batch, source_length=32, target_length=32))]
    decode = [workload_to_dict(w) for w in (check_workload(size), Decode(size, 32, 24, 24, beam_size=4))]
    return [
        dict(implementation="project", backend="jax", precision="mixed_bfloat16", workloads=train),
        dict(implementation="hf", backend=None, precision="bfloat16", workloads=train),
        dict(implementation="project", backend="jax", precision="float32", workloads=train),
        dict(implementation="hf", backend=None, precision="float32", workloads=train),
        dict(implementation="hf", backend=None, precision="float32", workloads=decode),
        dict(implementation="project", backend="jax", precision="float32", workloads=decode),
        dict(implementation="project", backend="torch", precision="float32", workloads=decode),
    ]


def matmul_peaks(device: str) -> dict:
    """TFLOP/s of n^3 products in bfloat16 and in float32 without TF32 (torch,
    median of 5; n = 8192 on a GPU, 1024 on a CPU)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    n, peaks = (8192 if device == "cuda" else 1024), {}
    for name, dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
        a @ b
        times = []
        for _ in range(5):
            synchronize()
            start = time.perf_counter()
            a @ b
            synchronize()
            times.append(time.perf_counter() - start)
        peaks[name] = 2 * n**3 / sorted(times)[2] / 1e12
    peaks["n"] = n
    peaks["device"] = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    return peaks


def run_job(job: dict, key: str, args, checkpoint: Path, timeout: float, reference: str | None) -> dict:
    workdir = args.workdir
    job = {
        **job,
        "size": args.size,
        "checkpoint": str(checkpoint),
        "reference": reference,
        "strict": True,
        "repeats": 3,
        "train_steps": 5,
        "threads": os.cpu_count(),
        "device": args.device,
    }
    job_path, result_path = workdir / f"{key}.job.json", workdir / f"{key}.result.json"
    job_path.write_text(json.dumps(job, indent=1))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    if job["backend"]:
        env["KERAS_BACKEND"] = job["backend"]
    if job["precision"] == "float32":
        env["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"  # no TF32, as torch's default
    print(f"[gpu] {key} (at most {timeout:.0f} s)", flush=True)
    with open(workdir / f"{key}.log", "w") as log:
        try:
            subprocess.run(
                [sys.executable, "-m", "benchmarks.worker", str(job_path), str(result_path)],
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return {"job": job, "workloads": {}, "error": f"stopped at the deadline ({timeout:.0f} s)"}
    if not result_path.exists():
        return {"job": job, "workloads": {}, "error": f"no result; see {key}.log"}
    return json.loads(result_path.read_text())


def label(job: dict) -> str:
    if job["implementation"] == "hf":
        return f"HF transformers MarianMT, torch {job['precision']}"
    return f"this project, {job['backend']}, {job['precision']}"


def render(peaks: dict, results: list[dict], command: str) -> str:
    lines = [
        f"# GPU benchmark: {peaks.get('device', 'GPU')}",
        "",
        f"Command: `{command}`",
        "",
        f"Matrix-multiply peak measured in the same run (torch, {peaks['n']}^3): bfloat16 "
        f"{peaks['bfloat16']:.1f} TFLOP/s, float32 without TF32 {peaks['float32']:.1f} TFLOP/s.",
        "",
        "| implementation | workload | first call s | steady s | per second | vs HF same precision | MFU |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    hf = {}
    for result in results:
        if result["job"]["implementation"] == "hf":
            for name, entry in result["workloads"].items():
                hf[(name, result["job"]["precision"])] = entry
    for result in results:
        job = result["job"]
        if result.get("error") and not result["workloads"]:
            lines.append(
                f"| {label(job)} | {', '.join(w['kind'] for w in job['workloads'])} | | | {result['error']} | | |"
            )
            continue
        precision = "bfloat16" if job["precision"] == "mixed_bfloat16" else job["precision"]
        for name, entry in result["workloads"].items():
            if "steady_s" not in entry:
                lines.append(f"| {label(job)} | {name} | | | {entry.get('error') or entry.get('skipped')} | | |")
                continue
            unit = "tokens_per_s" if "tokens_per_s" in entry else "sentences_per_s"
            peer = hf.get((name, precision), {}).get(unit)
            ratio = f"{entry[unit] / peer:.2f}" if peer and job["implementation"] != "hf" else ""
            mfu = ""
            if unit == "tokens_per_s":
                workload = Train(job["size"], batch=job["workloads"][0]["batch"])
                flops = training_flops(workload) / entry["steady_s"] / 1e12
                mfu = f"{100 * flops / peaks[precision]:.0f}% ({flops:.0f} TFLOP/s)"
            lines.append(
                f"| {label(job)} | {name} | {entry['first_s']:.1f} | {entry['steady_s']:.4f} | "
                f"{entry[unit]:,.0f} {unit.split('_')[0]} | {ratio} | {mfu} |"
            )
        if result.get("check"):
            lines.append(f"| | greedy agreement with HF | | | {result['check']} | | |")
    lines += [
        "",
        f"Paper (section 5.2): base, about 0.4 s a step of ~25,000 + 25,000 tokens on 8 P100s: "
        f"about {PAPER_TOKENS_PER_S:,.0f} tokens/s for all 8, {PAPER_TOKENS_PER_S / 8:,.0f} per GPU.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--seconds", type=float, required=True, help="stop starting jobs after this")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--size", default="base", help="model size (benchmarks.workloads.SIZES)")
    parser.add_argument("--train-batch", type=int, default=PAPER_BATCH_PAIRS, help="pairs of 32 + 32 tokens")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.seconds
    args.workdir.mkdir(parents=True, exist_ok=True)
    from benchmarks.checkpoint import build

    checkpoint = build(args.size, args.workdir / args.size, convert=False)
    peaks = matmul_peaks(args.device)
    command = "python -m benchmarks.gpu " + " ".join(sys.argv[1:] if argv is None else argv)
    results, reference = [], None
    for i, job in enumerate(jobs(args.size, args.train_batch)):
        left = deadline - time.monotonic()
        if left < 30:
            result = {"job": job, "workloads": {}, "error": "not run: out of time"}
        else:
            key = f"{i}-{job['implementation']}-{job['backend'] or 'torch'}-{job['precision']}"
            result = run_job(job, key, args, checkpoint, left, reference)
            if job["implementation"] == "hf" and job["workloads"][0]["kind"] == "decode" and "error" not in result:
                reference = str(args.workdir / f"{key}.result")
        results.append(result)
        # Written after every job: a machine taken back keeps what was measured.
        (args.workdir / "gpu_results.json").write_text(json.dumps({"peaks": peaks, "results": results}, indent=1))
        (args.workdir / "GPU.md").write_text(render(peaks, results, command))
    print((args.workdir / "GPU.md").read_text(), flush=True)


if __name__ == "__main__":
    main()
