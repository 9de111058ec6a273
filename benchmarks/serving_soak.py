"""A soak: one server under a steady load for half an hour: does its memory grow, does it fail, does its tail drift?

    python -m benchmarks.serving_soak --size tiny --implementations serve-tensorflow-float32 --rate 7
    python -m benchmarks.serving_soak --size tiny --implementations libretranslate --rate 3 --minutes 30

One implementation (any of `benchmarks.serving`'s, whose options for the
server and its workload this command takes too) under open-loop Poisson
arrivals at `--rate` messages per second for `--minutes` (30): the rate
should be 70% of the highest rate it held in `benchmarks.serving` (the JSON
beside that report has it), a load it carries with room to spare, so that
anything that accumulates shows. Every `--sample-seconds` (10) it reads the
resident memory of the server's process tree; per minute of arrivals, the
p50/p99 of that minute's requests and its failures (429, 5xx, unanswered).

Targets, the exit status 1 if one is missed:

- memory grows at most `--max-growth` (5%): the last sample against the
  one at the end of the first minute (which the first requests' buffers and
  caches have filled);
- no request failed;
- p99 steady: every minute's p99 at most `--p99-limit` (500 ms, the bound of
  a rate held).

The report goes to `benchmarks/RESULTS-soak.md` (`--output`) and the same
name with `.json`.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import shlex
import sys
from dataclasses import asdict

from benchmarks import report, serving
from benchmarks.machine_load import OtherLoadMeter
from benchmarks.serving_load import HELD_P99_S, Outcome, RateSummary, offer_load, poisson_schedule, summarize
from benchmarks.serving_server import SentencePieceIds
from benchmarks.serving_shipped import tree_resident_bytes

MINUTE_S = 60.0


def parse_args(argv=None):
    parser = serving.build_parser(__doc__.splitlines()[0])
    soak = parser.add_argument_group("the soak")
    soak.add_argument("--rate", type=float, required=True, help="messages per second (70%% of the highest held)")
    soak.add_argument("--minutes", type=float, default=30.0)
    soak.add_argument("--sample-seconds", type=float, default=10.0, help="how often resident memory is read")
    soak.add_argument("--max-growth", type=float, default=0.05, help="the most resident memory may grow (a share)")
    soak.add_argument("--p99-limit", type=float, default=HELD_P99_S, help="the most any minute's p99 may be (s)")
    args = serving.parse_args(argv, parser, report_name="soak")
    if len(args.specs) != 1:
        parser.error(f"a soak runs one implementation; got {len(args.specs)}: {args.implementations}.")
    if args.rate <= 0 or args.minutes <= 0 or args.sample_seconds <= 0:
        parser.error("--rate, --minutes and --sample-seconds must be positive.")
    return args


def per_minute(rate: float, outcomes: list[Outcome]) -> list[RateSummary]:
    """The requests due in each minute of the soak, summarized (the last minute may be partial).

    Example:
    >>> outcomes = [Outcome(0.5, 200, 0.1, 1), Outcome(61.0, 200, 0.3, 1), Outcome(62.0, 503, 0.0, 1)]
    >>> [(m.sent, m.server_errors, m.p50_s) for m in per_minute(1.0, outcomes)]
    [(1, 0, 0.1), (2, 1, 0.3)]
    """
    minutes: dict[int, list[Outcome]] = {}
    for outcome in outcomes:
        minutes.setdefault(int(outcome.scheduled_s // MINUTE_S), []).append(outcome)
    return [summarize(rate, minutes.get(i, []), MINUTE_S) for i in range(max(minutes, default=-1) + 1)]


def memory_growth(samples: list[tuple[float, int | None]]) -> float | None:
    """The last sample's resident memory against the first one at or after a minute, less 1.

    Example:
    >>> memory_growth([(0, 80), (60, 100), (120, 103), (180, 104)])
    0.04
    """
    measured = [(t, rss) for t, rss in samples if rss]
    baseline = next((rss for t, rss in measured if t >= MINUTE_S), None)
    if baseline is None or measured[-1][0] <= MINUTE_S:
        return None
    return round(measured[-1][1] / baseline - 1, 6)


def missed_targets(minutes: list[RateSummary], growth: float | None, max_growth: float, p99_limit: float) -> list[str]:
    """What the soak missed, in words (empty: every target met).

    Example:
    >>> ok = summarize(1.0, [Outcome(0.0, 200, 0.2, 1)], 60)
    >>> missed_targets([ok, ok], 0.01, 0.05, 0.5)
    []
    >>> slow = summarize(1.0, [Outcome(60.0, 200, 0.9, 1), Outcome(61.0, 429, 0.0, 1)], 60)
    >>> missed_targets([ok, slow], 0.08, 0.05, 0.5)  # doctest: +NORMALIZE_WHITESPACE
    ['resident memory grew 8.0%, more than 5%', '1 of 3 requests failed (429, 5xx or unanswered)',
     "minute 2's p99 was never answered, over 500 ms"]
    """
    missed = []
    if growth is None:
        missed.append("resident memory growth not measured (the soak must last more than a minute)")
    elif growth > max_growth:
        missed.append(f"resident memory grew {growth:.1%}, more than {max_growth:.0%}")
    failed = sum(m.sent - m.answered for m in minutes)
    if failed:
        missed.append(f"{failed} of {sum(m.sent for m in minutes)} requests failed (429, 5xx or unanswered)")
    for index, minute in enumerate(minutes):
        if not minute.within(p99_limit):
            missed.append(
                f"minute {index + 1}'s p99 was {serving._seconds(minute.p99_s)}, over {p99_limit * 1000:.0f} ms"
            )
    return missed


async def soak(url: str, messages, schedule, deadline_s: float, pid: int, sample_s: float):
    """`offer_load` while the server's resident memory is sampled every `sample_s` seconds."""
    loop = asyncio.get_running_loop()
    start, samples = loop.time(), []

    async def sample() -> None:
        while True:
            samples.append((loop.time() - start, tree_resident_bytes(pid)))
            await asyncio.sleep(sample_s)

    sampler = asyncio.create_task(sample())
    outcomes, window = await offer_load(url, messages, schedule, deadline_s)
    sampler.cancel()
    samples.append((loop.time() - start, tree_resident_bytes(pid)))
    return outcomes, window, samples


def render(context: dict, result: dict) -> str:
    lines = [
        "# Soak",
        "",
        f"Command: `{context['command']}`, started {context['started']}, finished {context['finished']}.",
        "",
        f"CPU: {context['machine']['cpu_model']}, {context['machine']['cpu_count']} CPUs. Versions: "
        + ", ".join(f"{k} {v}" for k, v in context["versions"].items())
        + ".",
        "",
        f"Machine load: other processes used {serving._describe_load(context['other_load'])} during the soak "
        "(`benchmarks/machine_load.py`).",
        "",
        f"`{result['spec']['name']}` at {context['rate']:g} messages/s for {context['minutes']:g} minutes "
        f"({result['sent']} requests), ready in {result['ready_s']:.1f} s. Resident memory (process tree) "
        f"at the end of the first minute {serving._mib(result['baseline_rss'])}, at the end "
        f"{serving._mib(result['samples'][-1][1])}: growth "
        + ("not measured" if result["growth"] is None else f"{result['growth']:.1%}")
        + ".",
        "",
        "Targets: " + ("all met." if not result["missed"] else "missed: " + "; ".join(result["missed"]) + "."),
        "",
        "| minute | sent | p50 | p99 | failed |",
        "| --- | --- | --- | --- | --- |",
    ]
    for index, minute in enumerate(RateSummary(**m) for m in result["minutes"]):
        lines.append(
            f"| {index + 1} | {minute.sent} | {serving._seconds(minute.p50_s)} | {serving._seconds(minute.p99_s)} "
            f"| {minute.sent - minute.answered} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    command = "python -m benchmarks.serving_soak " + shlex.join(sys.argv[1:] if argv is None else argv)
    started = datetime.datetime.now(datetime.timezone.utc)
    weights = serving.prepare_weights(args)
    sentences = serving.source_sentences(SentencePieceIds(), args.max_source_bucket - 2)
    messages = serving.make_messages([s for s, _ in sentences], args.seed)
    spec = {**args.specs[0], **weights, "threads": args.threads, "max_source_bucket": args.max_source_bucket}
    seconds = args.minutes * MINUTE_S
    schedule = poisson_schedule(args.rate, seconds, int(args.rate * seconds * 2 + 100), seed=args.seed)
    batch = [messages[i % len(messages)] for i in range(len(schedule))]
    meter = OtherLoadMeter().start()
    server = serving.start_server(spec, args, serving.server_environment(args.threads))
    try:
        shipped = isinstance(server, serving.ShippedServer)
        ready_s = server.wait_until_ready(args.ready_timeout, *([messages[0]] if shipped else []))
        print(f"[soak] {spec['name']} ready in {ready_s:.1f} s; {len(schedule)} requests", flush=True)
        outcomes, _, samples = asyncio.run(
            soak(server.url + "/translate", batch, schedule, args.deadline, server.process.pid, args.sample_seconds)
        )
    finally:
        server.stop()
    load = meter.stop()
    minutes = per_minute(args.rate, outcomes)
    growth = memory_growth(samples)
    result = {
        "spec": spec,
        "ready_s": ready_s,
        "sent": len(outcomes),
        "minutes": [asdict(m) for m in minutes],
        "samples": samples,
        "baseline_rss": next((rss for t, rss in samples if rss and t >= MINUTE_S), None),
        "growth": growth,
        "missed": missed_targets(minutes, growth, args.max_growth, args.p99_limit),
    }
    context = {
        "command": command,
        "started": started.isoformat(timespec="seconds"),
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": report.machine(),
        "versions": report.versions(),
        "rate": args.rate,
        "minutes": args.minutes,
        "other_load": load and vars(load),
    }
    args.output.write_text(render(context, result))
    args.output.with_suffix(".json").write_text(json.dumps({"context": context, "result": result}, indent=1) + "\n")
    print(render(context, result), flush=True)
    return 1 if result["missed"] else 0


if __name__ == "__main__":
    sys.exit(main())
