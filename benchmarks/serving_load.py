"""The serving benchmark's client: open-loop Poisson load over HTTP, and what it measured.

Open loop: each request is sent at its scheduled time whether or not earlier
ones were answered, as independent users send them (a closed loop, which
waits for each answer, slows down with the server and hides its queue).
Latency is counted from the scheduled time, not from when the request left,
so a client held up by a busy CPU or a server slow to accept connections
shows up in the tail instead of being hidden. A request refused (429), failed
(5xx), or not answered within its deadline counts as never answered: it sits
at the top of the latency distribution, so p99 <= 500 ms also means at most
1% of requests failed.

Example:
>>> schedule = poisson_schedule(rate=10, seconds=2, max_requests=100, seed=1)
>>> bool(0 < len(schedule) < 60 and all(0 <= t < 2 for t in schedule))
True
>>> percentile([0.1, 0.2, 0.3, float("inf")], 50), percentile([0.1, 0.2, 0.3, float("inf")], 99)
(0.2, inf)
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

import numpy as np

# The latency a rate must keep at its 99th percentile to count as held; the
# looser one still tells capacities apart where no rate holds the first (a shared machine).
HELD_P99_S = 0.5
LOOSE_P99_S = 2.0


def poisson_schedule(rate: float, seconds: float, max_requests: int, seed: int) -> list[float]:
    """Send times (seconds from the start) of Poisson arrivals at `rate` per
    second: exponential gaps, cut at `seconds` or `max_requests`, whichever comes first."""
    if rate <= 0 or seconds <= 0 or max_requests < 1:
        raise ValueError(f"rate, seconds and max_requests must be positive; got {rate}, {seconds}, {max_requests}.")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=max_requests)
    times = np.cumsum(gaps)
    return [float(t) for t in times[times < seconds]]


def percentile(values: list[float], share: float) -> float:
    """The nearest-rank percentile: the smallest value with at least `share`%
    of `values` at or below it (`inf` for a request never answered stays `inf`)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(share / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class Outcome:
    """One request: when it was due, its HTTP status (0: no answer by its deadline
    or a broken connection) and its latency from the due time."""

    scheduled_s: float
    status: int
    latency_s: float
    sentences: int


@dataclass(frozen=True)
class RateSummary:
    """What one offered rate gave."""

    rate: float
    sent: int
    answered: int
    refused: int  # 429
    server_errors: int  # 5xx
    unanswered: int  # no answer by the deadline, or the connection failed
    p50_s: float
    p95_s: float
    p99_s: float
    throughput: float  # answered messages per second
    sentences_per_s: float

    @property
    def held(self) -> bool:
        return self.within(HELD_P99_S)

    def within(self, p99_limit_s: float) -> bool:
        return self.sent > 0 and self.p99_s <= p99_limit_s


def summarize(rate: float, outcomes: list[Outcome], window_s: float) -> RateSummary:
    """The percentiles of all requests sent (failures as never answered) and the
    answers per second over `window_s` (the seconds the rate was offered, or
    until the last answer if that came later)."""
    answered = [o for o in outcomes if o.status == 200]
    latencies = [o.latency_s if o.status == 200 else math.inf for o in outcomes]
    window_s = max(window_s, 1e-9)
    return RateSummary(
        rate=rate,
        sent=len(outcomes),
        answered=len(answered),
        refused=sum(o.status == 429 for o in outcomes),
        server_errors=sum(o.status >= 500 for o in outcomes),
        unanswered=sum(o.status == 0 for o in outcomes),
        p50_s=percentile(latencies, 50),
        p95_s=percentile(latencies, 95),
        p99_s=percentile(latencies, 99),
        throughput=len(answered) / window_s,
        sentences_per_s=sum(o.sentences for o in answered) / window_s,
    )


def highest_rate_held(summaries: list[RateSummary], p99_limit_s: float = HELD_P99_S) -> float | None:
    """The highest rate whose p99 is within `p99_limit_s`, every lower rate of the
    sweep's too (`None` if the lowest's was not)."""
    best = None
    for summary in sorted(summaries, key=lambda s: s.rate):
        if not summary.within(p99_limit_s):
            break
        best = summary.rate
    return best


def request_body(sentences: list[str]) -> dict:
    """LibreTranslate's JSON `/translate` body for one message (a list `q`: one text per sentence)."""
    return {"q": sentences, "source": "en", "target": "de", "format": "text"}


async def _send(client, url: str, sentences: list[str], due: float, deadline_s: float) -> Outcome:
    loop = asyncio.get_running_loop()
    import httpx

    try:
        response = await asyncio.wait_for(client.post(url, json=request_body(sentences)), deadline_s)
        status = response.status_code
    except (asyncio.TimeoutError, httpx.HTTPError):
        status = 0
    return Outcome(due, status, loop.time() - due, len(sentences))


async def offer_load(
    url: str, messages: list[list[str]], schedule: list[float], deadline_s: float
) -> tuple[list[Outcome], float]:
    """Sends `messages[i]` at `schedule[i]` without waiting for earlier answers;
    returns every outcome (times relative to the start) and the seconds from
    the start to the last answer. Each request gets `deadline_s` from its due time."""
    import httpx

    if len(messages) < len(schedule):
        raise ValueError(f"{len(schedule)} requests are scheduled but only {len(messages)} messages were given.")
    loop = asyncio.get_running_loop()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(limits=limits, timeout=None, trust_env=False) as client:
        start = loop.time() + 0.05
        tasks = []
        for offset, sentences in zip(schedule, messages):
            due = start + offset
            if (delay := due - loop.time()) > 0:
                await asyncio.sleep(delay)
            remaining = max(deadline_s - (loop.time() - due), 0.001)
            tasks.append(asyncio.create_task(_send(client, url, sentences, due, remaining)))
        outcomes = await asyncio.gather(*tasks)
        finished = loop.time()
    relative = [Outcome(o.scheduled_s - start, o.status, o.latency_s, o.sentences) for o in outcomes]
    return relative, finished - start


def idle_latencies(url: str, messages: list[list[str]], pause_s: float, deadline_s: float) -> list[float]:
    """Each message sent alone, the next `pause_s` after the answer (latency in
    seconds; `inf` for a failed one)."""

    async def one_at_a_time() -> list[float]:
        latencies = []
        for sentences in messages:
            outcomes, _ = await offer_load(url, [sentences], [0.0], deadline_s)
            latencies.append(outcomes[0].latency_s if outcomes[0].status == 200 else math.inf)
            await asyncio.sleep(pause_s)
        return latencies

    return asyncio.run(one_at_a_time())
