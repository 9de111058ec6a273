"""Measures one implementation in its own process.

`python -m benchmarks.worker JOB.json RESULT.json`, started by
`benchmarks.run`, which also fixes the process' backend (`KERAS_BACKEND`),
thread environment and CPU affinity. The job names the implementation, the
checkpoint and the workloads; the result holds, per workload, the first-call
time (compilation included) and the steady-state times, plus import and load
times, the greedy agreement with the reference, and the peak RSS.

Order inside the process: load, then the check workload (greedy, batch 32):
its greedy output and the teacher-forced log-probabilities of fixed random
targets are compared with the reference before anything else is timed; a
float32 implementation that disagrees (fewer than `SENTENCES_REQUIRED` of
the greedy sentences identical, or a log-probability off by more than
`SCORE_TOLERANCE`) is not timed at all (unless the job says otherwise).
Training comes last, since it changes the weights.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Protocol

import numpy as np

from benchmarks.workloads import Decode, Train, check_workload, workload_from_dict


class Implementation(Protocol):
    """What `benchmarks.project` and `benchmarks.peers` provide."""

    import_s: float  # importing the library
    load_s: float  # building the model and loading the weights

    def decode(self, workload: Decode) -> np.ndarray:
        """The `new_tokens - 1` tokens before the last of each sentence
        (the last is the forced end token in this project), `(batch, n)`."""

    def score(self, workload: Decode) -> np.ndarray:
        """Teacher-forced log-probabilities of `workload.targets()`, `(batch, new_tokens)`."""

    def train(self, workload: Train, steps: int) -> None:
        """`steps` optimizer updates; raises `NotImplementedError` if unsupported."""


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(function, *args):
    start = time.perf_counter()
    result = function(*args)
    return time.perf_counter() - start, result


SCORE_TOLERANCE = 1e-3  # float32 log-probabilities may differ by this much
# Share of greedy sentences a float32 implementation must reproduce exactly.
# Not 1: two tokens can tie to float32 precision and be broken either way
# (seen: base, torch backend, 1 sentence of 32, logits 4.1183576 and 4.1183576).
# A wrong cache or position in the decoding path changes most sentences.
SENTENCES_REQUIRED = 0.9


def agreement(tokens: np.ndarray, reference: np.ndarray, scores: np.ndarray, reference_scores: np.ndarray) -> dict:
    """Share of greedy sentences equal token for token, of tokens equal
    position by position, and the largest teacher-forced log-prob difference."""
    return {
        "sentences_equal": float(np.mean(np.all(tokens == reference, axis=1))),
        "tokens_equal": float(np.mean(tokens == reference)),
        "compared_tokens_per_sentence": int(reference.shape[1]),
        "max_log_prob_difference": float(np.max(np.abs(scores - reference_scores))),
    }


def passes(check: dict) -> bool:
    return check["sentences_equal"] >= SENTENCES_REQUIRED and check["max_log_prob_difference"] <= SCORE_TOLERANCE


def make_implementation(job: dict) -> Implementation:
    name, threads, checkpoint = job["implementation"], job["threads"], Path(job["checkpoint"])
    if name == "project":
        from benchmarks.project import ProjectImplementation

        return ProjectImplementation(checkpoint, job["precision"], threads, job.get("jit_compile", "auto"))
    if name == "hf":
        from benchmarks.peers import HuggingFace

        return HuggingFace(checkpoint, threads, job.get("device", "cpu"), job["precision"])
    if name == "ct2":
        from benchmarks.peers import CTranslate2

        return CTranslate2(checkpoint, job["precision"], threads)
    raise ValueError(f"unknown implementation {name!r}")


def measure(implementation: Implementation, workload, repeats: int, train_steps: int) -> dict:
    """First call, then the median of `repeats` calls, in seconds per call (decoding) or per step (training)."""
    if isinstance(workload, Decode):
        first_s, _ = timed(implementation.decode, workload)
        times = [timed(implementation.decode, workload)[0] for _ in range(repeats)]
        steady_s = statistics.median(times)
        return {
            "first_s": first_s,
            "times_s": times,
            "steady_s": steady_s,
            "sentences_per_s": workload.batch / steady_s,
        }
    first_s, _ = timed(implementation.train, workload, 1)

    def seconds_per_step() -> float:
        # The marginal time of `train_steps` more steps in one call: what a
        # long training run pays a step, without a call's set-up, which
        # differs by implementation (`fit` given arrays built a tf.data
        # pipeline on every call, as long as half a tiny step; the peers'
        # plain loops have none).
        one_step, _ = timed(implementation.train, workload, 1)
        more_steps, _ = timed(implementation.train, workload, 1 + train_steps)
        return (more_steps - one_step) / train_steps

    times = [seconds_per_step() for _ in range(repeats)]
    steady_s = statistics.median(times)
    return {
        "first_s": first_s,
        "times_s": times,
        "steady_s": steady_s,
        "tokens_per_s": workload.tokens_per_step / steady_s,
    }


def run(job: dict, result_path: Path) -> dict:
    result: dict = {"job": job, "workloads": {}}
    implementation = make_implementation(job)
    result["import_s"], result["load_s"] = implementation.import_s, implementation.load_s
    result["module_file"] = getattr(implementation, "module_file", None)
    workloads = [workload_from_dict(w) for w in job["workloads"]]
    check = check_workload(job["size"])
    if check in workloads:  # the check first: nothing is timed before it passes
        workloads.remove(check)
        first_s, tokens = timed(implementation.decode, check)
        scores = implementation.score(check)
        np.save(result_path.with_suffix(".check.npy"), tokens)
        np.save(result_path.with_suffix(".scores.npy"), scores)
        if job.get("reference"):
            reference = np.load(job["reference"] + ".check.npy"), np.load(job["reference"] + ".scores.npy")
            result["check"] = agreement(tokens, reference[0], scores, reference[1])
            if job.get("strict") and not passes(result["check"]):
                result["error"] = "outputs differ from the reference: not timed"
                return result
        entry = measure(implementation, check, job["repeats"], job["train_steps"])
        entry["first_s"] = first_s
        result["workloads"][check.name] = entry
    for workload in workloads:
        try:
            result["workloads"][workload.name] = measure(implementation, workload, job["repeats"], job["train_steps"])
        except NotImplementedError as error:
            result["workloads"][workload.name] = {"skipped": str(error)}
        except Exception as error:  # noqa: BLE001 - one failing workload must not lose the others
            result["workloads"][workload.name] = {"error": f"{type(error).__name__}: {error}"}
            traceback.print_exc()
    return result


def main() -> None:
    job_path, result_path = Path(sys.argv[1]), Path(sys.argv[2])
    job = json.loads(job_path.read_text())
    try:
        result = run(job, result_path)
    except Exception as error:  # noqa: BLE001 - reported in RESULTS.md
        traceback.print_exc()
        result = {"job": job, "workloads": {}, "error": f"{type(error).__name__}: {error}"}
    result["peak_rss_mb"] = peak_rss_mb()
    result_path.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
