"""The serving benchmark's servers as shipped (the real LibreTranslate, `keras-transformer serve`) and the soak:
their names, commands, memory bookkeeping, report and verdicts. The measurements themselves are benchmarks."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not an installed package

from benchmarks import libretranslate, serving, serving_shipped, serving_soak  # noqa: E402
from benchmarks.serving_load import Outcome, summarize  # noqa: E402


def test_shipped_names_and_the_serve_command():
    spec = serving_shipped.parse_shipped("serve-tensorflow-int8")
    assert (spec["kind"], spec["backend"], spec["precision"]) == ("serve", "tensorflow", "int8")
    assert serving_shipped.parse_shipped("libretranslate")["kind"] == "libretranslate"
    assert serving_shipped.parse_shipped("ct2-int8-requests") is None
    with pytest.raises(ValueError, match="serve-BACKEND-PRECISION"):
        serving_shipped.parse_shipped("serve-tensorflow-float16")
    command = serving_shipped.serve_command(spec, "multi30k_en_de", 5002, 3, 4)
    assert command[3:7] == ["serve", "multi30k_en_de=en:de", "multi30k_en_de=fr:it", "multi30k_en_de=es:pt"]
    assert command[-2:] == ["--beam-size", "4"] and "--greedy" not in command
    with pytest.raises(ValueError, match="at most"):
        serving_shipped.serve_command(spec, "multi30k_en_de", 5002, 99, 1)


def test_the_shipped_servers_run_apart_from_the_fixed_length_ones(capsys):
    args = serving.parse_args(["--size", "tiny", "--implementations", "libretranslate", "serve-jax-float32"])
    assert args.shipped and args.output.name == "RESULTS-libretranslate.md" and args.beam_size == 4
    assert not serving.parse_args(["--implementations", "ct2-int8-requests"]).shipped
    with pytest.raises(SystemExit):
        serving.parse_args(["--implementations", "libretranslate", "ct2-int8-requests"])
    assert "separate runs" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="random weights"):
        serving_shipped.preset_of("base")


def test_the_soak_takes_one_implementation_and_a_rate(capsys):
    args = serving_soak.parse_args(["--size", "tiny", "--implementations", "libretranslate", "--rate", "3"])
    assert (args.rate, args.minutes, args.sample_seconds, args.max_growth) == (3.0, 30.0, 10.0, 0.05)
    assert args.output.name == "RESULTS-soak.md"  # not the report of the servers' sweep
    for argv in (
        ["--rate", "1"],
        ["--implementations", "ct2-int8-requests"],
        ["--implementations", "x", "--rate", "0"],
    ):
        with pytest.raises(SystemExit):
            serving_soak.parse_args(argv)
    errors = capsys.readouterr().err
    assert "one implementation" in errors and "'x' is not ENGINE-PRECISION-MODE" in errors and "--rate" in errors


def test_the_soak_verdicts():
    samples = [(0.0, 900), (10.0, 950), (60.0, 1000), (1800.0, 1049)]
    assert serving_soak.memory_growth(samples) == pytest.approx(0.049)
    assert serving_soak.memory_growth([(0.0, 1000), (30.0, 2000)]) is None  # no minute yet: not measured
    outcomes = [Outcome(m * 60.0 + 1, 200, 0.2, 2) for m in range(3)] + [Outcome(125.0, 0, 10.0, 1)]
    minutes = serving_soak.per_minute(2.0, outcomes)
    assert [(m.sent, m.answered) for m in minutes] == [(1, 1), (1, 1), (2, 1)]
    assert serving_soak.missed_targets(minutes[:2], 0.049, 0.05, 0.5) == []
    missed = serving_soak.missed_targets(minutes, 0.051, 0.05, 0.5)
    assert missed[0].startswith("resident memory grew 5.1%") and missed[1].startswith("1 of 4 requests failed")
    assert missed[2].startswith("minute 3's p99 was never answered")
    assert "not measured" in serving_soak.missed_targets(minutes[:2], None, 0.05, 0.5)[0]


def test_the_soak_report():
    minutes = serving_soak.per_minute(1.0, [Outcome(1.0, 200, 0.2, 1), Outcome(61.0, 429, 0.0, 1)])
    result = {
        "spec": {"name": "libretranslate"},
        "ready_s": 3.0,
        "sent": 2,
        "minutes": [vars(m) for m in minutes],
        "samples": [(0.0, 100 * 2**20), (60.0, 200 * 2**20), (120.0, 220 * 2**20)],
        "baseline_rss": 200 * 2**20,
        "growth": 0.1,
        "missed": ["resident memory grew 10.0%, more than 5%"],
    }
    context = {
        "command": "test",
        "started": "-",
        "finished": "-",
        "machine": {"cpu_model": "test", "cpu_count": 2},
        "versions": {},
        "rate": 1.0,
        "minutes": 2.0,
        "other_load": None,
    }
    text = serving_soak.render(context, result)
    assert "at the end of the first minute 200 MiB, at the end 220 MiB: growth 10.0%" in text
    assert "Targets: missed: resident memory grew 10.0%, more than 5%." in text
    assert "| 1 | 1 | 200 ms | 200 ms | 0 |\n| 2 | 1 | never answered | never answered | 1 |" in text


def _result(name: str, kind: str, ready_s: float, per_model: float, latencies: dict) -> dict:
    rates = [
        vars(summarize(rate, [Outcome(0.0, 200, latency, 1)], window_s=1.0)) for rate, latency in latencies.items()
    ]
    memory = {"rss_ready": 300 * 2**20, "rss_after_load": 310 * 2**20, "per_model": per_model, "models": 2}
    return {"spec": {"name": name, "kind": kind}, "rates": rates, "ready_s": ready_s, "idle_s": [0.1], "memory": memory}


def test_the_report_of_the_shipped_servers_and_its_targets():
    peer = _result("libretranslate", "libretranslate", 3.0, 100 * 2**20, {1: 0.2, 2: 0.9})
    ours = _result("serve-jax-int8", "serve", 14.0, 150 * 2**20, {1: 0.1, 2: 0.2, 4: 0.4, 8: 0.6})
    slow = _result("serve-torch-float32", "serve", 13.0, 250 * 2**20, {1: 0.3, 2: 0.6})
    lines = "\n".join(serving._shipped_section([peer, ours, slow]))
    assert "| `libretranslate` | 3.0 s | 100 ms | 1 | 2 | 300 MiB | 310 MiB | 100 MiB (2 models) |" in lines
    assert "| `serve-jax-int8` | >= 2x LibreTranslate's highest rate held | 4.00x (4 against 1) | met |" in lines
    assert "| `serve-jax-int8` | <= 2x LibreTranslate's memory per model | 150 MiB against 100 MiB | met |" in lines
    assert "| `serve-jax-int8` | ready within 10 s of LibreTranslate | 14.0 s against 3.0 s | not met |" in lines
    assert (
        "| `serve-torch-float32` | >= 2x LibreTranslate's highest rate held | 1.00x (1 against 1) | not met |" in lines
    )
    assert (
        "| `serve-torch-float32` | <= 2x LibreTranslate's memory per model | 250 MiB against 100 MiB | not met |"
        in (lines)
    )
    assert "| `serve-torch-float32` | ready within 10 s of LibreTranslate | 13.0 s against 3.0 s | met |" in lines


def test_memory_per_model():
    libre = {"kind": "libretranslate"}
    assert serving_shipped.memory_per_model(libre, {"rss_before_model": 100, "rss_ready": 160}, 3, None, 1) == {
        "per_model": 60,
        "models": 1,
    }

    class Copies:  # a server of three copies
        def wait_until_ready(self, timeout_s):
            self.waited = timeout_s

        def memory(self):
            return {"rss_ready": 1000}

        def stop(self):
            self.stopped = True

    server = Copies()
    per_model = serving_shipped.memory_per_model({"kind": "serve"}, {"rss_ready": 400}, 3, lambda n: server, 60)
    assert per_model == {"per_model": 300, "models": 3, "rss_ready_models": 1000} and server.stopped


def test_the_resident_memory_of_a_process_tree():
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import time; time.sleep(30)'])",
        ]
    )
    try:
        deadline = time.monotonic() + 10
        while len(serving_shipped.process_tree(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = serving_shipped.process_tree(parent.pid)
        assert len(tree) == 2 and tree[0] == parent.pid
        alone = serving.resident_bytes(parent.pid)
        assert serving_shipped.tree_resident_bytes(parent.pid) > alone > 0
    finally:
        for pid in reversed(serving_shipped.process_tree(parent.pid)):
            subprocess.run(["kill", str(pid)])
        parent.wait()


def test_libretranslate_stays_offline_and_inside_its_home(tmp_path):
    env = libretranslate.environment(tmp_path, threads=2, beam_size=1)
    assert json.loads((tmp_path / "index" / "index.json").read_text()) == []
    assert env["ARGOS_PACKAGE_INDEX"] == (tmp_path / "index").as_uri() + "/"
    assert (tmp_path / "cache" / "argos-translate" / "spacy" / "senter" / "model").exists()
    assert (env["ARGOS_CHUNK_TYPE"], env["ARGOS_BEAM_SIZE"], env["OMP_NUM_THREADS"]) == ("SPACY", "1", "2")
    assert all(
        env[k].startswith(str(tmp_path)) for k in ("HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "ARGOS_PACKAGES_DIR")
    )
    with pytest.raises(SystemExit, match="benchmarks.libretranslate setup"):
        libretranslate.command(tmp_path / "no-venv", 5000)
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "libretranslate").touch()
    command = libretranslate.command(tmp_path / "venv", 5003)
    assert command[1:] == ["--host", "127.0.0.1", "--port", "5003", "--load-only", "en,de"]


@pytest.mark.slow
def test_the_real_libretranslate_translates_as_this_project_does(tmp_path):
    venv = Path(serving.parse_args(["--implementations", "libretranslate"]).libretranslate_venv)
    if not (venv / "bin" / "libretranslate").exists():
        pytest.skip(f"LibreTranslate is not installed in {venv} (set LIBRETRANSLATE_VENV)")
    import keras_transformer as kt
    from benchmarks.run import thread_environment

    home = tmp_path / "home"
    libretranslate.build_package("multi30k_en_de", home, venv)
    spec = {
        **serving_shipped.parse_shipped("libretranslate"),
        "libretranslate_home": str(home),
        "libretranslate_venv": str(venv),
        "threads": 1,
        "beam_size": 4,
    }
    env = {**os.environ, **thread_environment(1)}
    server = serving_shipped.ShippedServer(spec, serving.free_port(), tmp_path, env, None)
    sentences = ["A man in an orange hat starring at something.", "Two dogs play in the snow."]
    try:
        assert 0 < server.wait_until_ready(120, sentences[:1]) < 120
        import httpx

        body = {"q": sentences, "source": "en", "target": "de"}
        answer = httpx.post(server.url + "/translate", json=body, timeout=60, trust_env=False)
        memory = server.memory()
    finally:
        server.stop()
    assert answer.json()["translatedText"] == kt.Transformer.from_preset("multi30k_en_de").translate(sentences)
    assert memory["rss_ready"] > memory["rss_before_model"] > 0
