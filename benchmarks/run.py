"""Runs the whole benchmark and writes `benchmarks/RESULTS.md`.

    python -m benchmarks.run                 # everything, the default grid
    python -m benchmarks.run --full-grid     # batch 1/8/32/128, source 8..256
    python -m benchmarks.run --sizes tiny --backends jax --precisions float32 --dev

Steps: build one random Marian checkpoint per size and convert it with
CTranslate2's converter (`benchmarks.checkpoint`, cached in `--workdir`);
measure the matrix-multiply peak (`benchmarks.peak`); then measure each
implementation in its own process (`benchmarks.worker`): Hugging Face first,
whose greedy output is the reference every other implementation is checked
against before it is timed, then CTranslate2, then this project on each
backend and precision. Every process gets the same threads (see
`thread_environment`) and, where the machine has more CPUs than threads,
is pinned to the first ones.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks import REPO_ROOT, report
from benchmarks.machine_load import OtherLoadMeter, sample_other_load
from benchmarks.workloads import SIZES, grid_workloads, headline_workloads, workload_to_dict

BENCHMARKS = Path(__file__).resolve().parent
BACKENDS = ("tensorflow", "jax", "torch")
PRECISIONS = ("float32", "mixed_bfloat16", "int8")
# Hugging Face in float32 and under bfloat16 autocast; CTranslate2 in each
# compute type its CPU build may offer (`ct2-best`: every one this CPU
# supports, see `ct2_compute_types`).
HF_PEERS = ("hf", "hf-bfloat16")
CT2_COMPUTE_TYPES = ("float32", "int8", "int8_float32", "int8_bfloat16", "int16", "bfloat16")
PEERS = (*HF_PEERS, *(f"ct2-{c}" for c in CT2_COMPUTE_TYPES), "ct2-best")
DEFAULT_PEERS = ("hf", "hf-bfloat16", "ct2-best")


def thread_environment(threads: int) -> dict[str, str]:
    """Thread limits every library reads from the environment. In-process,
    the workers also call `torch.set_num_threads`,
    `tf.config.threading.set_intra_op_parallelism_threads` and give
    CTranslate2 `intra_threads`; XLA's CPU runtime (JAX, TensorFlow with
    XLA) sizes its pool from the CPUs it may use, hence the pinning
    (`taskset`, see `pinned_cpus`)."""
    value = str(threads)
    return {
        "OMP_NUM_THREADS": value,
        "MKL_NUM_THREADS": value,
        "OPENBLAS_NUM_THREADS": value,
        "TF_NUM_INTRAOP_THREADS": value,
        "TF_NUM_INTEROP_THREADS": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }


def pinned_cpus(threads: int) -> list[int] | None:
    """The first `threads` CPUs this process may use, if there are more
    (and `taskset` is there to pin the processes)."""
    available = sorted(os.sched_getaffinity(0))
    if len(available) <= threads or shutil.which("taskset") is None:
        return None
    return available[:threads]


def run_process(args: list[str], env: dict, log: Path, timeout: float, cpus: list[int] | None) -> int:
    """Runs `python -m ...args` under `env` (on `cpus` if given), output to
    `log`; returns the exit code."""
    pin = ["taskset", "-c", ",".join(map(str, cpus))] if cpus else []
    with open(log, "w") as out:
        try:
            return subprocess.run(
                [*pin, sys.executable, "-m", *args],
                cwd=REPO_ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
            ).returncode
        except subprocess.TimeoutExpired:
            out.write(f"\nbenchmarks.run: killed after {timeout} s\n")
            return -9


def ct2_compute_types(peers: list[str], supported: set[str] | None = None) -> list[str]:
    """The CTranslate2 compute types to measure: those named, or with
    `ct2-best` every type this CPU supports (float32 first)."""
    named = [p.removeprefix("ct2-") for p in peers if p.startswith("ct2-") and p != "ct2-best"]
    if "ct2-best" in peers:
        if supported is None:
            import ctranslate2

            supported = set(ctranslate2.get_supported_compute_types("cpu"))
        named += [c for c in CT2_COMPUTE_TYPES if c in supported]
    return list(dict.fromkeys(named))


def implementations(args) -> list[dict]:
    """`(implementation, backend, precision, label)` in the order they run; HF first."""
    jobs = []
    if "hf" in args.peers:
        jobs.append(
            dict(
                implementation="hf", backend=None, precision="float32", label="HF transformers MarianMT, torch float32"
            )
        )
    if "hf-bfloat16" in args.peers:
        jobs.append(
            dict(
                implementation="hf",
                backend=None,
                precision="bfloat16",
                label="HF transformers MarianMT, torch bfloat16 autocast",
            )
        )
    for precision in ct2_compute_types(args.peers):
        jobs.append(dict(implementation="ct2", backend=None, precision=precision, label=f"CTranslate2 {precision}"))
    for backend in args.backends:
        for precision in args.precisions:
            jobs.append(
                dict(
                    implementation="project",
                    backend=backend,
                    precision=precision,
                    label=f"this project, {backend}, {precision}",
                )
            )
    if args.torch_compiled:  # decoding only: `jit_compile` is about the searches here
        jobs.append(
            dict(
                implementation="project",
                backend="torch",
                precision="float32",
                jit_compile=True,
                label="this project, torch, float32, jit_compile=True",
            )
        )
    return jobs


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", choices=sorted(SIZES), default=["base", "tiny"])
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    parser.add_argument("--peers", nargs="*", choices=PEERS, default=list(DEFAULT_PEERS))
    parser.add_argument(
        "--torch-compiled",
        action="store_true",
        help="also decode on torch with jit_compile=True (each search step through torch.compile)",
    )
    parser.add_argument("--full-grid", action="store_true", help="batch 1/8/32/128 and source 8..256 (tiny size)")
    parser.add_argument("--no-grid", action="store_true", help="only the headline workloads")
    parser.add_argument(
        "--train-sizes",
        nargs="*",
        choices=sorted(SIZES),
        default=None,
        help="sizes whose training is measured (default: every size in --sizes)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="steady-state calls; the median is reported")
    parser.add_argument("--train-steps", type=int, default=2, help="training steps per timed call")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per implementation and size")
    parser.add_argument("--workdir", type=Path, default=BENCHMARKS / ".work")
    parser.add_argument("--output", type=Path, default=BENCHMARKS / "RESULTS.md")
    parser.add_argument("--dev", action="store_true", help="mark the results as a development run")
    parser.add_argument(
        "--quiet-check-seconds",
        type=float,
        default=10.0,
        help="how long other processes' CPU use is sampled before the run starts",
    )
    parser.add_argument(
        "--no-strict", action="store_true", help="time float32 implementations even if their greedy outputs differ"
    )
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    command = "python -m benchmarks.run " + shlex.join(sys.argv[1:] if argv is None else argv)
    load_before = os.getloadavg()
    other_load_before = sample_other_load(args.quiet_check_seconds)
    meter = OtherLoadMeter().start()
    started = datetime.datetime.now(datetime.timezone.utc)
    args.workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **thread_environment(args.threads)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    cpus = pinned_cpus(args.threads)

    def step(name: str, module_args: list[str], extra_env: dict | None = None) -> int:
        print(f"[benchmarks] {name}", flush=True)
        code = run_process(module_args, {**env, **(extra_env or {})}, args.workdir / f"{name}.log", args.timeout, cpus)
        if code:
            print(f"[benchmarks]   exit code {code}: see {args.workdir / f'{name}.log'}", flush=True)
        return code

    peak_path = args.workdir / "peak.json"
    step("peak", ["benchmarks.peak", str(peak_path), str(args.threads)])
    results = []
    for size in args.sizes:
        checkpoint = args.workdir / size
        if step(f"checkpoint-{size}", ["benchmarks.checkpoint", "--size", size, "--out", str(checkpoint)]):
            raise SystemExit(f"could not build the {size} checkpoint; see {args.workdir}/checkpoint-{size}.log")
        workloads = headline_workloads(size)
        if args.train_sizes is not None and size not in args.train_sizes:
            workloads = [w for w in workloads if w.kind != "train"]
        if size == "tiny" and not args.no_grid:
            workloads += grid_workloads(size, "full" if args.full_grid else "small")
        reference = None
        for spec in implementations(args):
            compiled = "compiled" if spec.get("jit_compile") else None
            key = "-".join(filter(None, [size, spec["implementation"], spec["backend"], spec["precision"], compiled]))
            job_workloads = [w for w in workloads if not (compiled and w.kind == "train")]
            job = {
                **spec,
                "size": size,
                "checkpoint": str(checkpoint),
                "workloads": [workload_to_dict(w) for w in job_workloads],
                "reference": reference,
                "strict": spec["precision"] == "float32" and not args.no_strict,
                "repeats": args.repeats,
                "train_steps": args.train_steps,
                "threads": args.threads,
            }
            job_path, result_path = args.workdir / f"{key}.job.json", args.workdir / f"{key}.result.json"
            job_path.write_text(json.dumps(job, indent=1))
            result_path.unlink(missing_ok=True)
            extra_env = {"KERAS_BACKEND": spec["backend"]} if spec["backend"] else {}
            code = step(key, ["benchmarks.worker", str(job_path), str(result_path)], extra_env)
            if result_path.exists():
                result = json.loads(result_path.read_text())
            else:
                result = {"job": job, "workloads": {}, "error": f"the process exited with {code} and wrote no result"}
            results.append(result)
            prefix = str(result_path.with_suffix(""))
            if reference is None and Path(prefix + ".scores.npy").exists() and spec["precision"] == "float32":
                reference = prefix  # its .check.npy (greedy) and .scores.npy (teacher-forced)
                result["is_reference"] = True

    other_load_during = meter.stop()
    context = {
        "command": command,
        "started": started.isoformat(timespec="seconds"),
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "load_average_before": load_before,
        "other_load_before": other_load_before and vars(other_load_before),
        "other_load_during": other_load_during and vars(other_load_during),
        "dev": args.dev,
        "threads": args.threads,
        "pinned_cpus": cpus,
        "peak": json.loads(peak_path.read_text()) if peak_path.exists() else None,
        "versions": report.versions(),
        "machine": report.machine(),
        "thread_environment": thread_environment(args.threads),
    }
    (args.workdir / "results.json").write_text(json.dumps({"context": context, "results": results}, indent=1))
    kept = report.appended_sections(args.output.read_text()) if args.output.exists() else ""
    args.output.write_text(report.render(context, results) + "\n" + ("\n" + kept if kept else ""))
    print(f"[benchmarks] wrote {args.output}", flush=True)


if __name__ == "__main__":
    main()
