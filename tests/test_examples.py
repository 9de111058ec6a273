"""Every script in examples/ runs, at tiny sizes, as a user would run it.

Each test starts the script in a fresh Python (or bash) in a temporary folder, offline,
on TensorFlow, with the worktree first on PYTHONPATH, and checks what it wrote. The
sizes are chosen for a quiet 2-core machine: each test takes well under a minute
(`--run-eagerly` skips graph compilation, `TINY=1` shrinks the distributed run).
"""

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO_ROOT

EXAMPLES = REPO_ROOT / "examples"
PAIRS = [
    ("A dog runs across the green field.", "Ein Hund rennt über die grüne Wiese."),
    ("Two children are playing in the snow.", "Zwei Kinder spielen im Schnee."),
    ("The woman reads a book in the garden.", "Die Frau liest ein Buch im Garten."),
    ("A man is riding a bicycle down the street.", "Ein Mann fährt mit dem Fahrrad die Straße entlang."),
]


def run_example(command: list[str], cwd: Path, timeout: float = 300, **env) -> subprocess.CompletedProcess:
    """Runs `command` in `cwd`, offline on TensorFlow; fails with its output if it fails."""
    environment = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "HF_HUB_OFFLINE": "1",
        "KERAS_BACKEND": "tensorflow",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        **env,
    }
    result = subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{command} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


def write_tsv(path: Path, pairs) -> Path:
    path.write_text("".join(f"{source}\t{target}\n" for source, target in pairs), encoding="utf-8")
    return path


@pytest.mark.slow
def test_translate_example(tmp_path):
    result = run_example([sys.executable, str(EXAMPLES / "translate.py"), "Two dogs play in the snow."], tmp_path)
    assert result.stdout.splitlines() == ["Two dogs play in the snow.\tZwei Hunde spielen im Schnee."]


@pytest.mark.slow
def test_fine_tune_example_saves_a_preset_that_loads(tmp_path):
    tsv = write_tsv(tmp_path / "pairs.tsv", PAIRS)
    result = run_example(
        [
            sys.executable,
            str(EXAMPLES / "fine_tune.py"),
            str(tsv),
            "--out",
            "my_preset",
            "--epochs",
            "1",
            "--batch-size",
            "2",
            "--run-eagerly",
        ],
        tmp_path,
    )
    assert "4 pairs from" in result.stdout
    preset = tmp_path / "my_preset"
    assert (preset / "config.json").exists() and (preset / "model.weights.h5").exists()
    translations = [line.split("\t") for line in result.stdout.splitlines() if "\t" in line]
    assert len(translations) == 3
    assert {source for source, _ in translations} <= {source for source, _ in PAIRS}
    assert all(translation.strip() for _, translation in translations)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["jax", "mirrored"])
def test_train_distributed_example_runs_tiny(mode, tmp_path):
    """TINY=1 on CPU: JAX over 2 host devices through the multi-process start-up with one
    process; TensorFlow's MirroredStrategy over the one CPU device."""
    if mode == "jax":
        pytest.importorskip("jax")
    from helpers import PAIRS as SHORT_PAIRS

    (tmp_path / "train.en").write_text("".join(f"{s}\n" for s, _ in SHORT_PAIRS) * 5, encoding="utf-8")
    (tmp_path / "train.de").write_text("".join(f"{t}\n" for _, t in SHORT_PAIRS) * 5, encoding="utf-8")
    result = run_example(
        ["bash", str(EXAMPLES / "train_distributed.sh"), mode],
        tmp_path,
        TINY="1",
        SRC="train.en",
        TGT="train.de",
        OUT="run",
        KERAS_TRANSFORMER=f"{sys.executable} -m keras_transformer.cli",
    )
    assert "trained to step 2" in result.stdout
    assert (tmp_path / "run" / "checkpoints" / "ckpt-00000002.npz").exists()


@pytest.fixture(scope="module")
def opus_mt_cache(tmp_path_factory):
    """A huggingface_hub cache holding a tiny `Helsinki-NLP/opus-mt-en-de` (tests/marian_fixtures.py)."""
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    import marian_fixtures

    root = tmp_path_factory.mktemp("opus_mt")
    # 150 Adam steps make outputs that tests/test_marian.py compares token by token;
    # this test only needs a model that translates, so fewer steps (a new seed keeps
    # the cached checkpoint of test_marian.py apart).
    with pytest.MonkeyPatch.context() as patch:
        brief = functools.partial(marian_fixtures.train_briefly, steps=40)
        patch.setattr(marian_fixtures, "train_briefly", brief)
        info = marian_fixtures.write_marian_repo(root / "folder", "base", "safetensors", seed=11)
    marian_fixtures.publish(info["folder"], root / "hub", "Helsinki-NLP/opus-mt-en-de")
    return root / "hub"


@pytest.mark.slow
def test_opus_mt_export_example_converts_and_exports(tmp_path, opus_mt_cache):
    result = run_example(
        [sys.executable, str(EXAMPLES / "opus_mt_export.py"), "--out", "exported"],
        tmp_path,
        HF_HUB_CACHE=str(opus_mt_cache),
    )
    outputs = dict(
        line.split(": ", 1)
        for line in result.stdout.splitlines()
        if line.startswith(("loaded:", "converted:", "SavedModel:"))
    )
    assert outputs["loaded"] == outputs["converted"] == outputs["SavedModel"] and outputs["loaded"].strip(" |")
    preset = tmp_path / "exported" / "preset"
    assert (preset / "config.json").exists() and (preset / "README.md").exists()
    assert (tmp_path / "exported" / "savedmodel" / "1" / "saved_model.pb").exists()


@pytest.mark.slow
def test_keras_pipeline_example(tmp_path):
    tsv = write_tsv(tmp_path / "pairs.tsv", PAIRS * 3)
    result = run_example(
        [
            sys.executable,
            str(EXAMPLES / "keras_pipeline.py"),
            str(tsv),
            "--out",
            "run",
            "--epochs",
            "2",
            "--batch-size",
            "8",
            "--run-eagerly",
        ],
        tmp_path,
    )
    assert "val_loss per epoch:" in result.stdout
    assert (tmp_path / "run" / "best.keras").exists()
    assert not (tmp_path / "run" / "backup").exists()  # BackupAndRestore cleans up after a finished run
    translations = [line.split("\t") for line in result.stdout.splitlines() if "\t" in line]
    assert [source for source, _ in translations] == [source for source, _ in PAIRS[-2:]]


@pytest.mark.slow
def test_opus_mt_export_example_exports_a_native_preset_in_full(tmp_path, trained_model):
    """The example's whole path, SavedModel included, on a tiny native preset (one
    that has memorised its pairs: an untrained model's near-ties could decode
    differently in the SavedModel's graph)."""
    from helpers import PAIRS as MEMORISED

    trained_model.save_to_preset(tmp_path / "tiny")
    sentences = [flag for source, _ in MEMORISED[:2] for flag in ("--sentence", source)]
    result = run_example(
        [sys.executable, str(EXAMPLES / "opus_mt_export.py"), "tiny", "--out", "exported", *sentences], tmp_path
    )
    outputs = dict(
        line.split(": ", 1)
        for line in result.stdout.splitlines()
        if line.startswith(("loaded:", "converted:", "SavedModel:"))
    )
    assert outputs["loaded"] == outputs["converted"] == outputs["SavedModel"]
    assert (tmp_path / "exported" / "savedmodel" / "1" / "saved_model.pb").exists()
