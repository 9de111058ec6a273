"""Serving under load: this project's translation server against CTranslate2, over HTTP.

    python -m benchmarks.serving                                  # the default implementations, base size
    python -m benchmarks.serving --rates 1 2 4 8 --seconds 30
    python -m benchmarks.serving --size tiny --implementations ct2-int8-requests tensorflow-float32-batched --dev

Each implementation runs as a server in its own process on 127.0.0.1
(`benchmarks.serving_server`), on the random Marian checkpoint of
`benchmarks.checkpoint` (the same weights for all, Opus-MT base dimensions
at `--size base`). This process is the client: for each rate of `--rates`
(messages per second, lowest first) it sends Poisson arrivals for
`--seconds` (at most `--max-requests`) to LibreTranslate's `POST /translate`
with asyncio and httpx, open loop (`benchmarks.serving_load`). A message is
1-3 sentences of Multi30k's test_2016_flickr (English), a list `q` of one
text per sentence; every sentence decodes to exactly `--new-tokens` tokens.

Per rate: p50/p95/p99 latency of all requests sent (from their scheduled
times; a refused, failed or unanswered request counts as never answered),
answered messages per second, and the share of 429 and 5xx answers. The sweep
of an implementation stops at the first rate whose p99 is over 2 s. Per
implementation: the highest rate held (p99 <= 500 ms at it and every lower
rate; and with p99 <= 2 s, which still tells capacities apart on a machine
too busy for any rate to hold the first), the latency of one idle message (one sentence of 11-13 tokens, the
median of `--idle-messages` sent one at a time), the server's resident
memory once ready, and how many such machines serve 5 million messages a
day at three times the average rate.

Implementations (`--implementations`), named `ENGINE-PRECISION-MODE[-beam4]`:

- `ct2-int8-requests`, `ct2-float32-requests`: CTranslate2 as LibreTranslate
  serves it, each request's sentences in a `translate_batch` call of their
  own, `--threads` calls at once;
- `ct2-int8-batcher`, `ct2-float32-batcher`: CTranslate2 behind this
  project's server and `Batcher`, each batch split into `--threads` parts
  that CTranslate2 decodes side by side, one thread each;
- `tensorflow-int8-batched`, `jax-float32-single`, ...: this project's
  server on a backend and precision, batching on (`--max-batch-size`) or off
  (batches of one sentence).

The servers as shipped (`benchmarks.serving_shipped`), measured on their own:

- `libretranslate`: the real LibreTranslate (`benchmarks.libretranslate`:
  its own virtual environment, `--libretranslate-venv`), serving the preset
  through an Argos package built from this project's export;
- `serve-tensorflow-float32`, `serve-jax-int8`, ...: `keras-transformer serve`
  of the preset on that backend and precision.

Both run the trained `multi30k_en_de` preset (`--size tiny`; random weights
never stop, see `serving_shipped.PRESETS`), beam 4 as both do by default
(`--beam-size`), and stop where the model does. Besides the above, per
server: seconds from its start to its first answer (LibreTranslate loads its
model then), the resident memory of its process tree then and after the
sweep, and what one more model costs (`--models N`: `serve` of N copies
against one; LibreTranslate: its memory after the model loaded less before).
Targets: at least 2x LibreTranslate's highest rate held, at most 2x its
memory per model, ready within 10 s of it.

Results go to `benchmarks/RESULTS-serving.md` (`RESULTS-libretranslate.md`
for the servers as shipped; `--output`) and the same name with `.json`,
rewritten after each implementation; what the markdown holds from its
"Reading these numbers" heading on is kept.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gzip
import json
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from benchmarks import REPO_ROOT, report
from benchmarks.libretranslate import build_package
from benchmarks.machine_load import QUIET_SHARE, OtherLoadMeter, sample_other_load
from benchmarks.run import pinned_cpus, thread_environment
from benchmarks.serving_load import (
    HELD_P99_S,
    LOOSE_P99_S,
    RateSummary,
    highest_rate_held,
    idle_latencies,
    offer_load,
    poisson_schedule,
    summarize,
)
from benchmarks.serving_server import SentencePieceIds, resident_bytes
from benchmarks.serving_shipped import (
    SHIPPED_KINDS,
    ShippedServer,
    memory_per_model,
    parse_shipped,
    preset_of,
    tree_resident_bytes,
)
from benchmarks.workloads import SIZES

BENCHMARKS = Path(__file__).resolve().parent
DATA = Path(os.environ.get("KERAS_TRANSFORMER_DATA", REPO_ROOT.parent / "shared" / "data")) / "multi30k"
SOURCES = DATA / "raw" / "test_2016_flickr.en.gz"
NOTES_HEADING = "## Reading these numbers"
ENGINES = ("ct2", "tensorflow", "jax", "torch")
MODES = {"ct2": ("requests", "batcher"), "project": ("batched", "single")}
DEFAULT_IMPLEMENTATIONS = (
    "ct2-int8-requests",
    "ct2-float32-requests",
    "ct2-int8-batcher",
    "tensorflow-int8-batched",
    "tensorflow-int8-single",
    "tensorflow-float32-batched",
    "tensorflow-float32-single",
    "jax-float32-batched",
)
MESSAGES_PER_DAY = 5_000_000
PEAK_FACTOR = 3
IDLE_TOKENS = (11, 13)  # the token counts of the idle messages' sentence


def parse_implementation(name: str, max_batch_size: int) -> dict:
    """The server spec of an implementation name (see the module docstring).

    Example:
    >>> spec = parse_implementation("jax-float32-single-beam4", 16)
    >>> spec["kind"], spec["backend"], spec["max_batch_size"], spec["beam_size"]
    ('project', 'jax', 1, 4)
    """
    parts = name.split("-")
    beam_size = 1
    if parts[-1].startswith("beam"):
        beam_size = int(parts.pop()[4:])
    if len(parts) != 3 or parts[0] not in ENGINES or parts[1] not in ("float32", "int8"):
        raise ValueError(f"{name!r} is not ENGINE-PRECISION-MODE[-beamN] with ENGINE in {ENGINES}, float32 or int8.")
    engine, precision, mode = parts
    family = "ct2" if engine == "ct2" else "project"
    if mode not in MODES[family]:
        raise ValueError(f"{name!r}: the mode of {engine} is one of {MODES[family]}; got {mode!r}.")
    if family == "ct2":
        kind, batch = f"ct2-{mode}", max_batch_size
    else:
        kind, batch = "project", max_batch_size if mode == "batched" else 1
    return {
        "name": name,
        "kind": kind,
        "backend": None if family == "ct2" else engine,
        "precision": precision,
        "beam_size": beam_size,
        "max_batch_size": batch,
    }


def precision_class(spec: dict) -> str:
    return "float32" if spec["precision"] == "float32" else "int8"


def source_sentences(tokenize, max_tokens: int) -> list[tuple[str, int]]:
    """test_2016_flickr's English sentences that fit the servers' widest source, with their token counts."""
    if not SOURCES.exists():
        raise SystemExit(f"Multi30k's {SOURCES.name} is not at {SOURCES}: set KERAS_TRANSFORMER_DATA to its folder.")
    with gzip.open(SOURCES, "rt", encoding="utf-8") as lines:
        sentences = [line.strip() for line in lines if line.strip()]
    counts = [len(ids) for ids in tokenize(sentences)]
    return [(s, n) for s, n in zip(sentences, counts) if n <= max_tokens]


def make_messages(sentences: list[str], seed: int) -> list[list[str]]:
    """The sentences in order, cut into messages of 1-3 (uniformly drawn) sentences.

    Example:
    >>> [len(m) for m in make_messages(list("abcdefgh"), seed=0)]
    [3, 2, 2, 1]
    """
    rng = np.random.default_rng(seed)
    messages, start = [], 0
    while start < len(sentences):
        size = int(rng.integers(1, 4))
        messages.append(sentences[start : start + size])
        start += size
    return messages


def machines_needed(rate_held: float | None) -> int | None:
    """Machines that serve `MESSAGES_PER_DAY` at `PEAK_FACTOR` times the average rate, each at `rate_held`.

    Example:
    >>> machines_needed(10.0)  # 5M/day = 57.9/s on average, 173.6/s at peak
    18
    """
    if not rate_held:
        return None
    return math.ceil(MESSAGES_PER_DAY / 86400 * PEAK_FACTOR / rate_held)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """One implementation's server process, from start to ready to stopped."""

    def __init__(self, spec: dict, workdir: Path, env: dict, cpus: list[int] | None):
        self.spec, self.port = spec, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        name = spec["name"]
        spec_path, self.status_path = workdir / f"serving-{name}.spec.json", workdir / f"serving-{name}.status.json"
        spec_path.write_text(json.dumps(spec, indent=1))
        self.status_path.unlink(missing_ok=True)
        self.log_path = workdir / f"serving-{name}.log"
        extra = {"KERAS_BACKEND": spec["backend"]} if spec["backend"] else {}
        pin = ["taskset", "-c", ",".join(map(str, cpus))] if cpus else []
        command = [*pin, sys.executable, "-m", "benchmarks.serving_server", str(spec_path), str(self.port)]
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                [*command, str(self.status_path)],
                cwd=REPO_ROOT,
                env={**env, **extra},
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def wait_until_ready(self, timeout_s: float) -> float:
        """Seconds from start to a 200 from `/health` (warm-up included)."""
        import httpx

        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}: see {self.log_path}")
            try:
                if httpx.get(self.url + "/health", timeout=5, trust_env=False).status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the server was not ready after {timeout_s:.0f} s: see {self.log_path}")

    def memory(self) -> dict:
        status = json.loads(self.status_path.read_text()) if self.status_path.exists() else {}
        return {
            "rss_after_imports": status.get("rss_after_imports"),
            "rss_ready": resident_bytes(self.process.pid),
            "rss_peak": resident_bytes(self.process.pid, "VmHWM"),
        }

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # uvicorn's graceful shutdown
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_server(spec: dict, args, env: dict, models: int = 1):
    cpus = pinned_cpus(args.threads)
    if spec["kind"] in SHIPPED_KINDS:
        return ShippedServer(spec, free_port(), args.workdir, env, cpus, models)
    return Server(spec, args.workdir, env, cpus)


def measure(spec: dict, args, env: dict, messages: list[list[str]], idle: list[list[str]]) -> dict:
    """One implementation: start its server, idle latency, the rate sweep, stop."""
    result = {"spec": spec, "rates": []}
    meter = OtherLoadMeter().start()
    server = start_server(spec, args, env)
    shipped = isinstance(server, ShippedServer)
    try:
        result["ready_s"] = server.wait_until_ready(args.ready_timeout, *([idle[0]] if shipped else []))
        idle_latencies(server.url + "/translate", idle[:3], 0.1, args.deadline)  # connections and caches
        result["idle_s"] = idle_latencies(server.url + "/translate", idle, 0.2, args.deadline)
        result["memory"] = server.memory()
        start = 0
        for index, rate in enumerate(sorted(args.rates)):
            schedule = poisson_schedule(rate, args.seconds, args.max_requests, seed=args.seed + index)
            batch = [messages[(start + i) % len(messages)] for i in range(len(schedule))]
            start += len(schedule)
            print(f"[serving] {spec['name']}: {rate:g} messages/s, {len(schedule)} requests", flush=True)
            outcomes, window = asyncio.run(offer_load(server.url + "/translate", batch, schedule, args.deadline))
            summary = summarize(rate, outcomes, max(window, args.seconds))
            result["rates"].append(asdict(summary))
            print(f"[serving]   p50 {summary.p50_s:.3f} s, p99 {summary.p99_s:.3f} s, {summary.throughput:.2f}/s")
            if not summary.within(LOOSE_P99_S):
                break
            time.sleep(1.0)
        result["memory"]["rss_peak"] = server.memory()["rss_peak"]
        if shipped:
            result["memory"]["rss_after_load"] = tree_resident_bytes(server.process.pid)
    except RuntimeError as error:
        result["error"] = str(error)
        print(f"[serving] {spec['name']}: {error}", flush=True)
    finally:
        server.stop()
    if shipped and "memory" in result:
        try:
            start = lambda models: start_server(spec, args, env, models)  # noqa: E731
            result["memory"].update(memory_per_model(spec, result["memory"], args.models, start, args.ready_timeout))
        except RuntimeError as error:
            result["memory"]["per_model_error"] = str(error)
    load = meter.stop()
    result["other_load"] = load and vars(load)
    return result


# --- the report ------------------------------------------------------------------------------------------------


def _seconds(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return "never answered" if math.isinf(value) else f"{value * 1000:.0f} ms"


def _rate(value: float | None) -> str:
    return "none" if value is None else f"{value:g}"


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:,.0f} MiB"


def _share(part: int, whole: int) -> str:
    return "-" if not whole else f"{part / whole:.0%}"


def _summaries(result: dict) -> list[RateSummary]:
    return [RateSummary(**r) for r in result["rates"]]


def held_rate(result: dict, p99_limit_s: float = HELD_P99_S) -> float | None:
    return highest_rate_held(_summaries(result), p99_limit_s) if result.get("rates") else None


def idle_median(result: dict) -> float | None:
    latencies = result.get("idle_s")
    return float(np.median(latencies)) if latencies else None


def _describe_load(load: dict | None) -> str:
    if not load:
        return "not measured (no /proc/stat)"
    share = load["cpu_seconds"] / load["wall_seconds"] if load["wall_seconds"] else 0.0
    return f"{share:.0%} of one CPU ({load['cpu_seconds']:.0f} CPU-seconds in {load['wall_seconds']:.0f} s)"


def _ratio(ours: float | None, theirs: float | None) -> str:
    if ours and theirs:
        return f"{ours / theirs:.2f}x ({ours:g} against {theirs:g})"
    return f"{_rate(ours)} against {_rate(theirs)}"


def _verdict(ours: float | None, theirs: float | None, factor: float) -> str:
    if ours and theirs:
        return "met" if ours >= factor * theirs else "not met"
    return "not determined (no rate held by " + ("either" if not ours and not theirs else "one") + ")"


def _targets(results: list[dict]) -> list[str]:
    """The rows of the targets table: each batching project greedy server against its
    peers, by the highest rate held at p99 <= 500 ms (and, for reference, <= 2 s)."""
    by_name = {r["spec"]["name"]: r for r in results}
    rows = []
    for result in results:
        spec = result["spec"]
        if spec["kind"] != "project" or spec["max_batch_size"] == 1 or spec["beam_size"] != 1:
            continue
        ours = held_rate(result), held_rate(result, LOOSE_P99_S)
        for mode, factor in (("requests", 2.0), ("batcher", 1.2)):
            peer = by_name.get(f"ct2-{spec['precision']}-{mode}")
            if peer is None:
                continue
            theirs = held_rate(peer), held_rate(peer, LOOSE_P99_S)
            target = f">= {factor:g}x `{peer['spec']['name']}`'s highest rate held"
            measured = f"{_ratio(ours[0], theirs[0])}; at p99 <= {LOOSE_P99_S:g} s: {_ratio(ours[1], theirs[1])}"
            verdict = _verdict(ours[0], theirs[0], factor)
            loose = _verdict(ours[1], theirs[1], factor)
            rows.append(f"| `{spec['name']}` | {target} | {measured} | {verdict}; at {LOOSE_P99_S:g} s: {loose} |")
        if spec["precision"] == "int8":
            idle = idle_median(result)
            verdict = "met" if idle is not None and idle <= 0.1 else "not met"
            rows.append(f"| `{spec['name']}` | one idle message in <= 100 ms | {_seconds(idle)} | {verdict} |")
    return rows


def _weights(context: dict) -> str:
    if context.get("shipped"):
        return f"the `{context['preset']}` preset's trained weights ({context['size']} size), served by each server"
    return f"{context['size']} size ({context['size_description']}), identical random weights for all"


def _decoding(context: dict) -> str:
    if context.get("shipped"):
        search = "greedy search" if context["beam_size"] == 1 else f"beam {context['beam_size']}"
        return (
            f"{search}, each server with its own length penalty (`serve`: alpha 0.6; LibreTranslate: 0.2), "
            "each sentence decoded until the model ends it"
            + (f"; `serve` with `{context['serve_args']}`" if context.get("serve_args") else "")
        )
    return (
        f"every sentence decodes to exactly {context['new_tokens']} tokens (translations of random weights are "
        "meaningless: only their cost is measured)"
    )


def _within(value: float | None, bound: float | None) -> str:
    if value is None or not bound:
        return "not determined"
    return "met" if value <= bound else "not met"


def _seconds_to_ready(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _shipped_section(results: list[dict]) -> list[str]:
    """The servers as shipped: readiness and memory, and the targets against LibreTranslate."""
    lines = [
        "",
        "## Servers as shipped",
        "",
        "Ready: seconds from the process's start to its first answer (LibreTranslate loads its model on the first "
        "request). Resident memory of the process tree. Per model: `serve` of N copies less one copy, over N - 1; "
        "LibreTranslate: after its model loaded less before (one language pair).",
        "",
        "| server | ready | idle message | highest rate held | held with p99 <= 2 s | memory ready | memory after "
        "the sweep | per model |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for result in results:
        memory = result.get("memory", {})
        per_model = memory.get("per_model")
        copies = f" ({memory['models']} models)" if memory.get("models", 1) > 1 else ""
        lines.append(
            f"| `{result['spec']['name']}` | {_seconds_to_ready(result.get('ready_s'))} "
            f"| {_seconds(idle_median(result))} | {_rate(held_rate(result))} | {_rate(held_rate(result, LOOSE_P99_S))} "
            f"| {_mib(memory.get('rss_ready'))} | {_mib(memory.get('rss_after_load'))} "
            f"| {_mib(None if per_model is None else int(per_model))}{copies} |"
        )
    peer = next((r for r in results if r["spec"]["kind"] == "libretranslate"), None)
    ours = [r for r in results if r["spec"]["kind"] == "serve"]
    if peer is None or not ours:
        return lines
    lines += ["", "| server | target | measured | |", "| --- | --- | --- | --- |"]
    theirs_memory, theirs_ready = peer.get("memory", {}).get("per_model"), peer.get("ready_s")
    for result in ours:
        name = f"`{result['spec']['name']}`"
        rates = held_rate(result), held_rate(peer)
        lines.append(
            f"| {name} | >= 2x LibreTranslate's highest rate held | {_ratio(*rates)} | {_verdict(*rates, 2.0)} |"
        )
        memory = result.get("memory", {}).get("per_model")
        verdict = _within(memory, theirs_memory and 2 * theirs_memory)
        shown = [_mib(None if m is None else int(m)) for m in (memory, theirs_memory)]
        lines.append(
            f"| {name} | <= 2x LibreTranslate's memory per model | {shown[0]} against {shown[1]} | {verdict} |"
        )
        ready = result.get("ready_s")
        verdict = _within(ready, None if theirs_ready is None else theirs_ready + 10)
        lines.append(
            f"| {name} | ready within 10 s of LibreTranslate | {_seconds_to_ready(ready)} against "
            f"{_seconds_to_ready(theirs_ready)} | {verdict} |"
        )
    return lines


def render(context: dict, results: list[dict]) -> str:
    machine = context["machine"]
    lines = ["# Serving benchmark", ""]
    other = context["other_load_during"]
    share = other["cpu_seconds"] / other["wall_seconds"] if other and other["wall_seconds"] else 0.0
    if context["dev"] or share > QUIET_SHARE:
        lines += [
            f"> **Shared machine.** Other processes used {_describe_load(other)} while this ran "
            f"(load average {context['load_average_before'][0]:.1f} at the start, on {machine['cpu_count']} CPUs): "
            "the servers got a fraction of the CPUs, so every number here is slower, and noisier, than on a "
            "quiet machine. Compare implementations only with that in mind.",
            "",
        ]
    lines += [
        f"Command: `{context['command']}`, started {context['started']}, finished {context['finished']}.",
        "",
        f"CPU: {machine['cpu_model']}, {machine['cpu_count']} CPUs; matrix instructions: "
        f"{', '.join(machine['matrix_extensions']) or 'none of note'}. {machine['platform']}.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in context["versions"].items()) + ".",
        "",
        f"Machine load: other processes used {_describe_load(context['other_load_before'])} in the "
        f"seconds before the run, {_describe_load(other)} during it (`benchmarks/machine_load.py`).",
        "",
        f"Workload: {_weights(context)}; "
        f"{context['messages']} messages of 1-3 Multi30k test_2016_flickr English sentences (at most "
        f"{context['max_tokens']} tokens each, {context['sentences']} sentences), tokenized with the "
        f"multi30k_en_de preset's SentencePiece model; {_decoding(context)}. "
        f"Poisson arrivals, {context['seconds']:g} s per rate (at most {context['max_requests']} requests), "
        f"each request's deadline {context['deadline']:g} s; threads per server: {context['threads']}; the client "
        "shares the machine with the server.",
        "",
        f"A rate is held when the p99 latency of all requests sent, from their scheduled times, is at most "
        f"{HELD_P99_S * 1000:.0f} ms (refused or failed requests count as never answered). Machines for "
        f"{MESSAGES_PER_DAY / 1e6:g} million messages a day at {PEAK_FACTOR}x the average rate "
        f"({MESSAGES_PER_DAY / 86400 * PEAK_FACTOR:.0f} messages/s).",
        "",
        f"| implementation | highest rate held (messages/s) | first rate not held | held with p99 <= "
        f"{LOOSE_P99_S:g} s | idle message | resident memory ready (libraries alone) | machines for 5M/day "
        f"(at p99 <= {LOOSE_P99_S:g} s) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for result in results:
        name = result["spec"]["name"]
        if "error" in result and not result["rates"]:
            lines.append(f"| `{name}` | failed: {result['error']} | | | | | |")
            continue
        summaries = _summaries(result)
        held = held_rate(result)
        failed = next((s.rate for s in sorted(summaries, key=lambda s: s.rate) if not s.held), None)
        loose = held_rate(result, LOOSE_P99_S)
        memory = result.get("memory", {})
        machines = machines_needed(held) or "-", machines_needed(loose) or "-"
        lines.append(
            f"| `{name}` | {_rate(held)} | {failed if failed is not None else 'none swept'} | {_rate(loose)} "
            f"| {_seconds(idle_median(result))} | {_mib(memory.get('rss_ready'))} "
            f"({_mib(memory.get('rss_after_imports'))}) | {machines[0]} ({machines[1]}) |"
        )
    targets = _targets(results)
    if targets:
        lines += ["", "## Targets", "", "| server | target | measured | |", "| --- | --- | --- | --- |", *targets]
    if context.get("shipped"):
        lines += _shipped_section(results)
    lines += [
        "",
        "## Every rate",
        "",
        'Messages per second offered, and answered (sentences in parentheses); p99 "never answered": more '
        "than 1% of requests failed or missed their deadline.",
        "",
        "| implementation | offered (messages/s) | sent | p50 | p95 | p99 | answered/s (sentences/s) | 429 | 5xx "
        "| unanswered |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for result in results:
        for s in _summaries(result):
            lines.append(
                f"| `{result['spec']['name']}` | {s.rate:g} | {s.sent} | {_seconds(s.p50_s)} | {_seconds(s.p95_s)} "
                f"| {_seconds(s.p99_s)} | {s.throughput:.2f} ({s.sentences_per_s:.1f}) | {_share(s.refused, s.sent)} "
                f"| {_share(s.server_errors, s.sent)} | {_share(s.unanswered, s.sent)} |"
            )
    lines += ["", "Other processes' CPU use while each implementation ran (start, warm-up and sweep):", ""]
    lines += [f"- `{r['spec']['name']}`: {_describe_load(r.get('other_load'))}" for r in results]
    return "\n".join(lines) + "\n"


def kept_notes(text: str) -> str:
    """What an earlier report holds from `NOTES_HEADING` on (written by hand), kept by a new run."""
    start = text.find(NOTES_HEADING)
    return "" if start < 0 else text[start:]


def write_report(output: Path, context: dict, results: list[dict]) -> None:
    """The markdown report at `output` (its notes kept) and everything measured beside it, as JSON."""
    notes = kept_notes(output.read_text()) if output.exists() else ""
    output.write_text(render(context, results) + ("\n" + notes if notes else ""))
    output.with_suffix(".json").write_text(json.dumps({"context": context, "results": results}, indent=1) + "\n")


# --- the command -----------------------------------------------------------------------------------------------


def build_parser(description: str = __doc__.splitlines()[0]) -> argparse.ArgumentParser:
    """The options of the servers, their workload and the report (`benchmarks.serving_soak` adds its own)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--size", choices=sorted(SIZES), default="base")
    parser.add_argument("--implementations", nargs="+", default=list(DEFAULT_IMPLEMENTATIONS))
    parser.add_argument("--rates", nargs="+", type=float, default=[0.5, 1, 2, 4], help="messages per second")
    parser.add_argument("--seconds", type=float, default=25.0, help="how long each rate is offered")
    parser.add_argument("--max-requests", type=int, default=1000, help="the most requests of one rate")
    parser.add_argument("--new-tokens", type=int, default=16, help="tokens every sentence decodes to")
    parser.add_argument("--max-batch-size", type=int, default=16, help="sentences per batch, batching on")
    parser.add_argument(
        "--max-source-bucket",
        type=int,
        default=16,
        help="the widest source this project's server compiles; messages hold sentences that fit (<s> and </s> too)",
    )
    parser.add_argument("--threads", type=int, default=2, help="threads of each server")
    parser.add_argument("--deadline", type=float, default=10.0, help="seconds a request may take, from its due time")
    parser.add_argument("--idle-messages", type=int, default=10)
    parser.add_argument("--ready-timeout", type=float, default=1200.0, help="seconds a server may take to warm up")
    parser.add_argument("--seed", type=int, default=2016)
    parser.add_argument("--workdir", type=Path, default=BENCHMARKS / ".work")
    parser.add_argument(
        "--output", type=Path, help="the markdown report (default RESULTS-serving.md, RESULTS-libretranslate.md)"
    )
    shipped = parser.add_argument_group("the servers as shipped (libretranslate, serve-BACKEND-PRECISION)")
    shipped.add_argument("--beam-size", type=int, default=4, help="beams per sentence, 1 for greedy (default 4)")
    shipped.add_argument(
        "--models", type=int, default=1, help="also start `serve` with this many copies: memory per model"
    )
    shipped.add_argument(
        "--serve-args",
        default="",
        help='more options of `keras-transformer serve`, one string (e.g. "--max-source-tokens 16")',
    )
    shipped.add_argument(
        "--libretranslate-venv",
        type=Path,
        default=Path(os.environ.get("LIBRETRANSLATE_VENV", BENCHMARKS / ".work" / "libretranslate-venv")),
        help="LibreTranslate's virtual environment (`python -m benchmarks.libretranslate setup --venv DIR`)",
    )
    parser.add_argument("--dev", action="store_true", help="mark the results as a development run")
    parser.add_argument("--quiet-check-seconds", type=float, default=10.0)
    return parser


def parse_args(argv=None, parser: argparse.ArgumentParser | None = None, report_name: str | None = None):
    """The options, with `specs` (each implementation's), `shipped` and the default `output` filled in."""
    parser = parser or build_parser()
    args = parser.parse_args(argv)
    try:
        args.specs = [parse_shipped(n) or parse_implementation(n, args.max_batch_size) for n in args.implementations]
    except ValueError as error:
        parser.error(str(error))
    args.shipped = any(spec["kind"] in SHIPPED_KINDS for spec in args.specs)
    if args.shipped and not all(spec["kind"] in SHIPPED_KINDS for spec in args.specs):
        parser.error(
            "libretranslate and serve-BACKEND-PRECISION run a trained preset, the others random weights at fixed "
            "lengths: measure them in separate runs."
        )
    if args.beam_size < 1 or args.models < 1:
        parser.error(f"--beam-size and --models must be at least 1; got {args.beam_size} and {args.models}.")
    if args.output is None:
        name = report_name or ("libretranslate" if args.shipped else "serving")
        args.output = BENCHMARKS / f"RESULTS-{name}.md"
    return args


def prepare_weights(args) -> dict:
    """What every server of the run loads, built if needed: the random checkpoint,
    or the preset (and LibreTranslate's package of it) for the servers as shipped."""
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.shipped:
        weights = {"preset": preset_of(args.size), "beam_size": args.beam_size, "serve_args": args.serve_args}
        if any(spec["kind"] == "libretranslate" for spec in args.specs):
            home = args.workdir / "libretranslate"
            build_package(weights["preset"], home, args.libretranslate_venv)
            weights.update(libretranslate_home=str(home), libretranslate_venv=str(args.libretranslate_venv))
        return weights
    weights = {"checkpoint": str(args.workdir / args.size), "new_tokens": args.new_tokens}
    built = subprocess.run(
        [sys.executable, "-m", "benchmarks.checkpoint", "--size", args.size, "--out", weights["checkpoint"]],
        cwd=REPO_ROOT,
    )
    if built.returncode:
        raise SystemExit(f"could not build the {args.size} checkpoint in {weights['checkpoint']}")
    return weights


def server_environment(threads: int) -> dict:
    env = {**os.environ, **thread_environment(threads)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return env


def main(argv=None) -> None:
    args = parse_args(argv)
    command = "python -m benchmarks.serving " + shlex.join(sys.argv[1:] if argv is None else argv)
    load_before = os.getloadavg()
    other_before = sample_other_load(args.quiet_check_seconds)
    meter = OtherLoadMeter().start()
    started = datetime.datetime.now(datetime.timezone.utc)
    weights = prepare_weights(args)
    max_tokens = args.max_source_bucket - 2
    sentences = source_sentences(SentencePieceIds(), max_tokens)
    messages = make_messages([s for s, _ in sentences], args.seed)
    idle = [[s] for s, n in sentences if IDLE_TOKENS[0] <= n <= IDLE_TOKENS[1]][: args.idle_messages]
    env = server_environment(args.threads)
    size = SIZES[args.size]
    context = {
        "command": command,
        "started": started.isoformat(timespec="seconds"),
        "load_average_before": load_before,
        "other_load_before": other_before and vars(other_before),
        "dev": args.dev,
        "machine": report.machine(),
        "versions": report.versions(),
        "size": args.size,
        "size_description": f"{size.layers}+{size.layers} layers, d_model {size.hidden_dim}, {size.num_heads} heads, "
        f"FFN {size.intermediate_dim}, vocabulary {size.vocabulary_size:,}",
        "messages": len(messages),
        "sentences": len(sentences),
        "max_tokens": max_tokens,
        "new_tokens": args.new_tokens,
        "seconds": args.seconds,
        "max_requests": args.max_requests,
        "deadline": args.deadline,
        "threads": args.threads,
        "shipped": args.shipped,
        "preset": weights.get("preset"),
        "beam_size": args.beam_size,
        "serve_args": args.serve_args,
    }
    results = []
    for spec in args.specs:
        spec = {**spec, **weights, "threads": args.threads, "max_source_bucket": args.max_source_bucket}
        print(f"[serving] {spec['name']}", flush=True)
        results.append(measure(spec, args, env, messages, idle))
        other = meter.stop()
        context.update(finished=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
        context["other_load_during"] = other and vars(other)
        (args.workdir / "serving-results.json").write_text(json.dumps({"context": context, "results": results}))
        write_report(args.output, context, results)
    print(f"[serving] wrote {args.output}", flush=True)


if __name__ == "__main__":
    main()
