"""The matrix-multiply peak that model FLOPs utilisation is measured against.

`python -m benchmarks.peak RESULT.json`, in its own process with the same
threads as the implementations: float32 2048 x 2048 matrix products with
numpy and with torch, median of 5 after a warm-up; the peak is the faster.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

N = 2048
REPEATS = 5


def gflops(multiply, a, b) -> float:
    multiply(a, b)
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        multiply(a, b)
        times.append(time.perf_counter() - start)
    return 2 * N**3 / statistics.median(times) / 1e9


def main() -> None:
    import numpy as np
    import torch

    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((N, N), dtype="float32") for _ in range(2))
    result = {
        "numpy_gflops": gflops(np.matmul, a, b),
        "torch_gflops": gflops(torch.matmul, torch.from_numpy(a), torch.from_numpy(b)),
        "size": N,
        "threads": threads,
    }
    result["peak_gflops"] = max(result["numpy_gflops"], result["torch_gflops"])
    with open(sys.argv[1], "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
