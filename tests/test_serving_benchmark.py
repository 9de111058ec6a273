"""The serving benchmark's harness: its schedule and statistics, and one rate end to end at micro size."""

import math
import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not an installed package

from benchmarks import serving  # noqa: E402
from benchmarks.serving_load import Outcome, highest_rate_held, percentile, poisson_schedule, summarize  # noqa: E402


def test_the_schedule_is_poisson_and_bounded():
    schedule = poisson_schedule(rate=50, seconds=20, max_requests=10_000, seed=3)
    assert schedule == poisson_schedule(rate=50, seconds=20, max_requests=10_000, seed=3)
    assert all(0 <= a < b < 20 for a, b in zip(schedule, schedule[1:]))
    assert abs(len(schedule) - 1000) < 4 * math.sqrt(1000)  # a Poisson count: mean = variance = 1000
    gaps = np.diff(schedule)
    assert abs(gaps.mean() - 0.02) < 0.002 and abs(gaps.std() / gaps.mean() - 1) < 0.1  # exponential: cv 1
    assert len(poisson_schedule(rate=50, seconds=20, max_requests=7, seed=3)) == 7


def test_percentiles_count_failed_requests_as_never_answered():
    assert percentile([3, 1, 2, 4], 50) == 2 and percentile([3, 1, 2, 4], 75) == 3 and percentile([5], 99) == 5
    outcomes = [Outcome(i / 100, 200, 0.1, 2) for i in range(99)] + [Outcome(0.99, 429, 0.001, 1)]
    summary = summarize(10, outcomes, window_s=10)
    assert summary.p99_s == 0.1 and summary.held  # 1 failure in 100 is the 1% p99 allows
    summary = summarize(10, outcomes + [Outcome(1.0, 503, 0.002, 1)], window_s=10)
    assert math.isinf(summary.p99_s) and not summary.held
    assert (summary.sent, summary.answered, summary.refused, summary.server_errors) == (101, 99, 1, 1)
    assert summary.throughput == pytest.approx(9.9) and summary.sentences_per_s == pytest.approx(19.8)


def test_the_highest_rate_held_needs_every_lower_rate_held():
    def at(rate, latency):
        return summarize(rate, [Outcome(0.0, 200, latency, 1)], window_s=1)

    assert highest_rate_held([at(4, 0.9), at(1, 0.1), at(2, 0.2)]) == 2
    assert highest_rate_held([at(1, 0.6), at(2, 0.1)]) is None
    assert highest_rate_held([at(4, 0.9), at(1, 0.1), at(2, 0.2)], p99_limit_s=2.0) == 4
    assert serving.machines_needed(2) == 87 and serving.machines_needed(None) is None


def test_implementation_names():
    assert serving.parse_implementation("ct2-int8-requests", 16)["kind"] == "ct2-requests"
    batched = serving.parse_implementation("tensorflow-float32-batched", 16)
    assert (batched["kind"], batched["backend"], batched["max_batch_size"], batched["beam_size"]) == (
        "project",
        "tensorflow",
        16,
        1,
    )
    with pytest.raises(ValueError, match="mode of ct2"):
        serving.parse_implementation("ct2-int8-batched", 16)
    with pytest.raises(ValueError, match="ENGINE-PRECISION-MODE"):
        serving.parse_implementation("tensorflow-bfloat16-batched", 16)


def test_one_rate_end_to_end_against_a_micro_ctranslate2_server(tmp_path):
    pytest.importorskip("ctranslate2")
    pytest.importorskip("uvicorn")
    from benchmarks.checkpoint import build
    from benchmarks.run import thread_environment

    if not serving.SOURCES.exists():
        pytest.skip(f"Multi30k's test set is not at {serving.SOURCES}")
    build("micro", tmp_path)
    sentences = serving.source_sentences(serving.SentencePieceIds(), 14)
    messages = serving.make_messages([s for s, _ in sentences[:60]], seed=0)
    assert {len(m) for m in messages} == {1, 2, 3}
    spec = {
        **serving.parse_implementation("ct2-int8-requests", 4),
        "checkpoint": str(tmp_path),
        "new_tokens": 4,
        "threads": 1,
        "max_source_bucket": 16,
    }
    args = types.SimpleNamespace(
        workdir=tmp_path, threads=1, ready_timeout=60, deadline=5, rates=[20.0], seconds=1.0, max_requests=40, seed=0
    )
    env = {**os.environ, **thread_environment(1), "PYTHONPATH": str(serving.REPO_ROOT)}
    result = serving.measure(spec, args, env, messages, [[s] for s, _ in sentences[:2]])
    assert "error" not in result, result.get("error")
    (rate,) = result["rates"]
    assert rate["sent"] > 5 and rate["answered"] == rate["sent"]
    assert 0 < rate["p50_s"] <= rate["p99_s"] < 5 and len(result["idle_s"]) == 2
    assert result["memory"]["rss_ready"] > result["memory"]["rss_after_imports"] > 0
    context = {
        "command": "test",
        "started": "-",
        "finished": "-",
        "load_average_before": (0.0, 0.0, 0.0),
        "other_load_before": None,
        "other_load_during": result["other_load"],
        "dev": True,
        "machine": {"cpu_model": "test", "cpu_count": 1, "matrix_extensions": [], "platform": "test"},
        "versions": {},
        "size": "micro",
        "size_description": "-",
        "messages": len(messages),
        "sentences": 60,
        "max_tokens": 14,
        "new_tokens": 4,
        "seconds": 1.0,
        "max_requests": 40,
        "deadline": 5,
        "threads": 1,
    }
    output = tmp_path / "RESULTS-serving.md"
    output.write_text("old\n" + serving.NOTES_HEADING + "\nkept by hand\n")
    serving.write_report(output, context, [result])
    text = output.read_text()
    assert "| `ct2-int8-requests` | 20 |" in text and text.endswith(serving.NOTES_HEADING + "\nkept by hand\n")
