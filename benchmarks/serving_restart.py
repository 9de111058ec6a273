"""An operator's restart: `serve` of shipped presets, from start to ready, its memory, and its first minute under load.

    python -m benchmarks.serving_restart multi30k_en_de multi30k_en_fr --rate 5 --seconds 60

Starts `keras-transformer serve PRESETS` with its defaults twice, each time
in a fresh process: the first start may fill the compile caches (cold, unless
they were warm already), the second finds them warm, as a restart does. For
each start: the seconds from the process's start to `/health` answering 200,
the resident memory of its process tree then, and, from that moment on,
Poisson arrivals of `--rate` messages a second for `--seconds` (1-3
Multi30k test sentences each, English into each preset's target in turn):
p50, p99 and failures of those requests, and the memory after them. The
targets of issue 54: a warm restart ready within 20 s, resident within
1.6 GB, and p99 within 500 ms right after ready.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import subprocess
import sys
import time

from benchmarks import REPO_ROOT
from benchmarks.serving import SOURCES
from benchmarks.serving_load import HELD_P99_S, percentile, poisson_schedule
from benchmarks.serving_shipped import tree_resident_bytes

READY_TARGET_S = 20.0
MEMORY_TARGET_BYTES = 1.6e9


def target_of(preset: str) -> str:
    """The target language of a shipped `multi30k_en_xx` preset."""
    return preset.rsplit("_", 1)[-1]


def messages(count: int, seed: int) -> list[list[str]]:
    """`count` messages of 1-3 consecutive test sentences."""
    import numpy as np

    with gzip.open(SOURCES, "rt", encoding="utf-8") as lines:
        sentences = [line.strip() for line in lines if line.strip()]
    rng = np.random.default_rng(seed)
    starts, sizes = rng.integers(0, len(sentences) - 3, count), rng.integers(1, 4, count)
    return [sentences[start : start + size] for start, size in zip(starts, sizes)]


def wait_until_ready(process: subprocess.Popen, url: str, timeout_s: float) -> float:
    """Seconds until `url/health` answers 200 (the process was started just before)."""
    import httpx

    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if process.poll() is not None:
            raise SystemExit(f"serve exited with {process.returncode} before it was ready")
        try:
            if httpx.get(f"{url}/health", timeout=1.0, trust_env=False).status_code == 200:
                return time.monotonic() - start
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"serve was not ready within {timeout_s} s")


async def first_minute(url: str, presets: list[str], rate: float, seconds: float, seed: int) -> dict:
    """Poisson arrivals right after ready: latencies and failures."""
    import httpx

    schedule = poisson_schedule(rate, seconds, 100_000, seed)
    bodies = [
        {"q": texts, "source": "en", "target": target_of(presets[i % len(presets)]), "format": "text"}
        for i, texts in enumerate(messages(len(schedule), seed))
    ]
    loop = asyncio.get_running_loop()

    async def send(client, body, due):
        await asyncio.sleep(max(due - loop.time(), 0))
        try:
            status = (await client.post(f"{url}/translate", json=body)).status_code
        except httpx.HTTPError:
            status = 0
        return status, loop.time() - due

    async with httpx.AsyncClient(timeout=30.0, trust_env=False) as client:
        start = loop.time()
        results = await asyncio.gather(*(send(client, b, start + t) for b, t in zip(bodies, schedule)))
    latencies = [latency for status, latency in results if status == 200]
    return {
        "sent": len(results),
        "failed": sum(status != 200 for status, _ in results),
        "p50_s": percentile(latencies, 50),
        "p99_s": percentile(latencies, 99) if len(latencies) == len(results) else float("inf"),
    }


def start_once(presets: list[str], port: int, rate: float, seconds: float, seed: int) -> dict:
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "keras_transformer.cli", "serve", *presets, "--port", str(port)]
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ready_s = wait_until_ready(process, url, timeout_s=600)
        memory_ready = tree_resident_bytes(process.pid)
        load = asyncio.run(first_minute(url, presets, rate, seconds, seed))
        memory_after = tree_resident_bytes(process.pid)
        return {"ready_s": ready_s, "memory_ready": memory_ready, "memory_after": memory_after, **load}
    finally:
        process.terminate()
        process.wait(60)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("presets", nargs="+")
    parser.add_argument("--rate", type=float, default=5.0, help="messages per second right after ready")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--port", type=int, default=5071)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(f"`serve {' '.join(args.presets)}`, {args.rate} messages/s for {args.seconds:.0f} s right after ready")
    print("| start | ready | memory ready | sent | failed | p50 | p99 | memory after |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in ("first", "restart"):
        r = start_once(args.presets, args.port, args.rate, args.seconds, args.seed)
        print(
            f"| {name} | {r['ready_s']:.1f} s | {r['memory_ready'] / 2**20:,.0f} MiB | {r['sent']} | {r['failed']} "
            f"| {r['p50_s'] * 1000:.0f} ms | {r['p99_s'] * 1000:.0f} ms | {r['memory_after'] / 2**20:,.0f} MiB |",
            flush=True,
        )
    met = r["ready_s"] <= READY_TARGET_S and r["memory_ready"] <= MEMORY_TARGET_BYTES and r["p99_s"] <= HELD_P99_S
    print(f"restart targets (ready <= {READY_TARGET_S:.0f} s, <= 1.6 GB, p99 <= 500 ms): {'met' if met else 'not met'}")


if __name__ == "__main__":
    main()
