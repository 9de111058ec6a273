"""The benchmark harness works end to end (at a micro size; no timings checked)."""

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("ctranslate2")

import keras  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not an installed package

from benchmarks import run  # noqa: E402
from benchmarks.checkpoint import MARIAN_DIR, build  # noqa: E402
from benchmarks.workloads import END_ID, SIZES, Decode, Train, training_flops  # noqa: E402


def test_workloads_are_deterministic_and_end_with_the_end_token():
    workload = Decode("micro", 3, 5, 5)
    sources = workload.sources()
    np.testing.assert_array_equal(sources, workload.sources())
    assert sources.shape == (3, 5) and np.all(sources[:, -1] == END_ID)
    assert np.all(sources[:, :-1] > 1) and np.all(sources < SIZES["micro"].vocabulary_size - 1)
    assert workload.targets().shape == (3, 5)
    arrays = Train("micro", 4, 6, 7).arrays()
    np.testing.assert_array_equal(arrays["decoder_input"][:, 1:], arrays["labels"][:, :-1])


def test_a_training_step_is_timed_without_the_calls_set_up():
    from benchmarks.worker import measure

    class SlowToStart:
        """Each call pays 0.2 s of set-up, then 0.05 s a step."""

        def train(self, workload, steps):
            time.sleep(0.2 + 0.05 * steps)

    entry = measure(SlowToStart(), Train("micro", 2, 3, 3), repeats=1, train_steps=4)
    assert 0.04 < entry["steady_s"] < 0.09  # with the set-up in, 0.1 a step or more


def test_training_flops_of_the_base_model():
    # 6 FLOPs per weight per token it sees: 128 x 32 source tokens through the
    # encoder (19M weights), 128 x 32 target tokens through the decoder (25M)
    # and the output projection (16M); attention scores add a few percent.
    d, ff, vocab = 512, 2048, 32000
    weights_seen = 6 * (4 * d * d + 2 * d * ff) + 6 * (8 * d * d + 2 * d * ff) + d * vocab
    by_weights = 6 * 128 * 32 * weights_seen
    assert by_weights < training_flops(Train("base")) < 1.1 * by_weights


def test_marian_weights_give_hugging_face_logits(tmp_path):
    import torch
    from transformers import MarianMTModel

    from benchmarks.marian_weights import backbone_from_marian
    from keras_transformer import Transformer

    build("micro", tmp_path)
    arrays = Train("micro", 2, 6, 5).arrays()
    hf = MarianMTModel.from_pretrained(tmp_path / MARIAN_DIR).eval()
    with torch.no_grad():
        expected = hf(
            input_ids=torch.from_numpy(arrays["source"]).long(),
            decoder_input_ids=torch.from_numpy(arrays["decoder_input"]).long(),
        ).logits.numpy()
    model = Transformer(backbone=backbone_from_marian(tmp_path / MARIAN_DIR))
    logits = model(
        {
            "encoder_token_ids": arrays["source"],
            "encoder_padding_mask": np.ones_like(arrays["source"]),
            "decoder_token_ids": arrays["decoder_input"],
            "decoder_padding_mask": np.ones_like(arrays["decoder_input"]),
        },
        training=False,
    )
    np.testing.assert_allclose(keras.ops.convert_to_numpy(logits), expected, atol=1e-4)


@pytest.mark.slow
def test_the_harness_runs_end_to_end(tmp_path):
    output = tmp_path / "RESULTS.md"
    output.write_text("# old results\n| old |\n\n## Profiles and other measurements\n\nkept by hand\n")
    run.main(
        [
            "--sizes",
            "micro",
            "--backends",
            keras.config.backend(),
            "--precisions",
            "float32",
            "--peers",
            "hf",
            "hf-bfloat16",
            "ct2-float32",
            "--repeats",
            "1",
            "--train-steps",
            "1",
            "--threads",
            "1",
            "--dev",
            "--quiet-check-seconds",
            "1",
            "--workdir",
            str(tmp_path / "work"),
            "--output",
            str(output),
        ]
    )
    text = output.read_text()
    assert "Development run" in text
    assert "Other processes' CPU use" in text
    assert "| old |" not in text and text.endswith("## Profiles and other measurements\n\nkept by hand\n")
    results = json.loads((tmp_path / "work" / "results.json").read_text())["results"]
    assert [r["job"]["label"] for r in results] == [
        "HF transformers MarianMT, torch float32",
        "HF transformers MarianMT, torch bfloat16 autocast",
        "CTranslate2 float32",
        f"this project, {keras.config.backend()}, float32",
    ]
    for result in results:
        assert "error" not in result, result["error"]
        if not result.get("is_reference") and result["job"]["precision"] == "float32":
            assert result["check"]["sentences_equal"] == 1.0
            assert result["check"]["max_log_prob_difference"] < 1e-3
        decoding = [e for e in result["workloads"].values() if "sentences_per_s" in e]
        assert len(decoding) == 2  # greedy and beam 4
    training = [e for r in results for e in r["workloads"].values() if "tokens_per_s" in e]
    assert len(training) == 3  # Hugging Face in float32 and bfloat16, and this project
    assert "## This project / fastest peer of the same precision class" in text
    # float32 is compared with float32 peers only, never with bfloat16 autocast.
    ratios = text.split("## This project / fastest peer")[1].split("\n## ")[0]
    assert "bfloat16" not in ratios.split("this project,")[1].split("\n")[0]


def test_the_peers_at_their_best_are_every_compute_type_the_cpu_supports():
    supported = {"float32", "int8", "int8_float32", "int16"}  # a CPU without bfloat16
    assert run.ct2_compute_types(["ct2-best"], supported) == ["float32", "int8", "int8_float32", "int16"]
    assert run.ct2_compute_types(["ct2-int8", "ct2-best"], supported)[0] == "int8"  # named first, once
    labels = [
        job["label"]
        for job in run.implementations(
            run.parse_args(["--peers", "hf-bfloat16", "ct2-int16", "--backends", "jax", "--precisions", "int8"])
        )
    ]
    assert labels == [
        "HF transformers MarianMT, torch bfloat16 autocast",
        "CTranslate2 int16",
        "this project, jax, int8",
    ]


def test_torch_compiled_decoding_is_a_job_of_its_own():
    arguments = ["--peers", "--backends", "torch", "--precisions", "float32", "int8", "--torch-compiled"]
    jobs = run.implementations(run.parse_args(arguments))
    assert [(job["backend"], job.get("jit_compile", "auto")) for job in jobs] == [
        ("torch", "auto"),
        ("torch", "auto"),
        ("torch", True),
    ]
    assert jobs[-1]["label"] == "this project, torch, float32, jit_compile=True"


def _busy_python(seconds: float, done: Path) -> str:
    return (
        f"import time\nend = time.process_time() + {seconds}\nwhile time.process_time() < end: pass\n"
        f"open({str(done)!r}, 'w').close()"
    )


# Measures other processes: needs no test running beside it (tools/test.sh runs slow tests one at a time).
@pytest.mark.slow
def test_other_processes_cpu_use_is_measured_without_the_benchmarks_own(tmp_path):
    import shlex
    import subprocess

    from benchmarks.machine_load import OtherLoadMeter

    if OtherLoadMeter().start().stop() is None:
        pytest.skip("no /proc/stat on this system")
    # The benchmark's own worker: waited for, so not "other" work.
    meter = OtherLoadMeter().start()
    subprocess.run([sys.executable, "-c", _busy_python(1.0, tmp_path / "own")], check=True)
    own = meter.stop()
    # A process this one does not wait for (the shell leaves it running).
    meter = OtherLoadMeter().start()
    busy = shlex.join([sys.executable, "-c", _busy_python(1.0, tmp_path / "other")])
    subprocess.run(["sh", "-c", busy + " &"], check=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "other").exists():
        assert time.monotonic() < deadline, "the busy process did not finish"
        time.sleep(0.05)
    other = meter.stop()
    assert other.cpu_seconds - own.cpu_seconds > 0.6, (own, other)


@pytest.mark.slow
@pytest.mark.skipif(keras.config.backend() == "torch", reason="the decoding profile times a search compiled by XLA")
def test_the_decoding_profile_takes_out_each_part(tmp_path, capsys):
    from benchmarks import decoding_profile

    decoding_profile.main(["--size", "micro", "--repeats", "1", "--threads", "1", "--workdir", str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in lines
        if line.startswith(("| greedy", "| beam"))
    ]
    parts = [(row[0], row[3]) for row in rows]
    assert parts == [
        ("greedy", "-"),
        ("greedy", "attention over the caches"),
        ("greedy", "output projection"),
        ("greedy", "encoder (once per batch)"),
        ("beam 4", "-"),
        ("beam 4", "cache reorder"),
        ("beam 4", "attention over the caches"),
        ("beam 4", "output projection"),
        ("beam 4", "encoder (once per batch)"),
    ]


@pytest.mark.slow
def test_the_gpu_benchmark_runs_without_tensorflow_or_ctranslate2(tmp_path):
    # As on the GPU machine, which has neither; here on the CPU at micro size.
    import os
    import subprocess

    tests = Path(__file__).resolve().parent
    env = {
        **os.environ,
        "BLOCKED_MODULES": "tensorflow,tensorflow_text,ctranslate2",
        "PYTHONPATH": os.pathsep.join([str(tests / "without_modules"), str(tests.parent)]),
    }
    subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.gpu",
            "--workdir",
            str(tmp_path),
            "--seconds",
            "900",
            "--device",
            "cpu",
            "--size",
            "micro",
            "--train-batch",
            "8",
        ],
        cwd=tests.parent,
        env=env,
        check=True,
        timeout=1200,
    )
    results = json.loads((tmp_path / "gpu_results.json").read_text())["results"]
    assert len(results) == 7 and not [r["error"] for r in results if "error" in r]
    trained = [r for r in results if r["job"]["workloads"][0]["kind"] == "train"]
    assert len(trained) == 4 and all(e["tokens_per_s"] > 0 for r in trained for e in r["workloads"].values())
    decoders = [r for r in results if r["job"]["implementation"] == "project" and "check" in r]
    assert len(decoders) == 2 and all(r["check"]["sentences_equal"] == 1.0 for r in decoders)
    assert all(len(r["workloads"]) == 2 for r in decoders)  # greedy and beam 4, timed after the check
    assert (tmp_path / "GPU.md").read_text().count("| this project") == 6


@pytest.mark.slow
def test_the_operation_profile_attributes_every_part_of_a_decoding_call(tmp_path):
    # Its own process: XLA reads the profiling and dumping flags when it starts.
    import os
    import subprocess
    import sys

    from benchmarks import decoding_ops

    environment = dict(os.environ, KERAS_BACKEND="tensorflow")
    command = [
        sys.executable,
        "-m",
        "benchmarks.decoding_ops",
        "--size",
        "micro",
        "--calls",
        "1",
        "--threads",
        "1",
        "--workdir",
        str(tmp_path),
    ]
    root = Path(__file__).resolve().parents[1]
    output = subprocess.run(command, env=environment, capture_output=True, text=True, check=True, cwd=root).stdout
    milliseconds = {
        row[0]: float(row[1])
        for row in ([cell.strip() for cell in line.strip("|").split("|")] for line in output.splitlines())
        if row[0] in decoding_ops.ROLES
    }
    assert len(milliseconds) == len(decoding_ops.ROLES), output
    assert all(ms > 0 for ms in milliseconds.values()), output  # each found among the operations
    assert "a call; operations cover" in output


def test_the_tokenizer_ceiling_times_every_tokenizer_path_on_the_same_ids(tmp_path, capsys):
    from benchmarks import tokenizer_speed

    tokenizer_speed.main(["--lines", "3000", "--workdir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "the same ids from all: True" in out
    paths = ("| tensorflow_text", "| sentencepiece", "| TransformerTokenizer")
    rows = [line for line in out.splitlines() if line.startswith(paths)]
    assert len(rows) >= 3 and all(float(row.split("|")[2].replace(",", "")) > 0 for row in rows)


def test_data_pipeline_times_training_from_the_process_start_and_between_step_ends():
    from benchmarks import data_pipeline

    times = data_pipeline.step_times(100.0, [(4, 112.5), (5, 113.0), (6, 114.5)])
    assert times == {"first_step": 4, "last_step": 6, "first_step_s": 12.5, "later_steps_s": 2.0}
    row = {"pairs": 2000, "path": "resume", **times, "backend": "tensorflow", "tokens_per_batch": 4000}
    row["peak_rss_mb"] = 1500.0
    table = data_pipeline.report([row], "python -m benchmarks.data_pipeline")
    assert "| 2,000 | resume |  |  |  |  |  | 12.5 s | 4-6 | 2.0 s | 1,500 MB |" in table
    assert "tensorflow backend" in table
    with pytest.raises(SystemExit):  # resume needs the run that train trains
        data_pipeline.main(["--kinds", "prepare", "resume"])
