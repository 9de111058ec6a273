"""The `keras-transformer` command as a user runs it: exit codes and messages.

0 on success, 1 for a failure (one sentence on stderr, no traceback), 2 for
wrong usage (argparse). Each test starts `python -m keras_transformer.cli`
in a subprocess.
"""

import os
import re
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, make_model

pytestmark = pytest.mark.slow  # each test starts Python and TensorFlow (~5-15 s)

# TensorFlow's C++ start-up lines (absl logging ignores TF_CPP_MIN_LOG_LEVEL
# before the CLI can set it); they are not the command's output.
NATIVE_LOG = re.compile(r"^(WARNING: All log messages before absl|[IWEF]\d{4} |To enable the following instructions)")


def run_cli(*args, stdin="", cwd=None):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("KERAS_TRANSFORMER_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "keras_transformer.cli", *map(str, args)],
        input=stdin, capture_output=True, text=True, env=env, cwd=cwd, timeout=300,
    )


def messages(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip() and not NATIVE_LOG.match(line)]


def assert_user_error(result, command: str, *fragments: str):
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    lines = messages(result.stderr)
    assert len(lines) == 1, lines  # one sentence, nothing else
    assert lines[0].startswith(f"keras-transformer {command}: error: ") and lines[0].endswith("."), lines[0]
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.fixture(scope="module")
def preset(tokenizer, tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "tiny_preset"
    make_model(tokenizer).save_to_preset(str(path))
    return path


def test_translate_succeeds_with_arguments_and_stdin(preset):
    result = run_cli("translate", "--preset", preset, "--beam-size", "2", "a dog runs .", "")
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 2  # one line per sentence, "" for ""
    assert "Traceback" not in result.stderr

    result = run_cli("translate", "--preset", preset, stdin="a cat sleeps .\ntwo dogs play .\n\n")
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 3


@pytest.mark.parametrize(
    "args, command, fragments",
    [
        (["translate", "--preset", "base_en_dee", "hi"], "translate", ["Unknown preset 'base_en_dee'", "base_en_de"]),
        (["translate", "--preset", "no/such/folder", "hi"], "translate", ["no/such/folder"]),
        (["train", "--src", "missing.en", "--tgt", "missing.de", "--preset", "transformer_tiny", "--out", "run"], "train", ["cannot open missing.en"]),
        (["average", "not_a_run", "--out", "preset"], "average", ["not_a_run is not a training run folder"]),
    ],
)
def test_user_mistakes_are_one_sentence_and_exit_1(args, command, fragments, tmp_path):
    assert_user_error(run_cli(*args, cwd=tmp_path), command, *fragments)


def test_bad_values_for_a_preset_are_one_sentence_and_exit_1(preset):
    assert_user_error(run_cli("translate", "--preset", preset, "--beam-size", "0", "a dog ."), "translate", "beam_size")
    long = " ".join(["a dog runs"] * 10)
    assert_user_error(run_cli("translate", "--preset", preset, "--too-long", "error", long), "translate", "more than the 14")


@pytest.mark.parametrize(
    "args",
    [
        [],  # no command
        ["fly"],  # unknown command
        ["translate", "hi"],  # --preset missing
        ["translate", "--preset", "p", "--beam-size", "four"],
        ["average", "run", "--out", "p", "--no-such-flag"],
    ],
)
def test_wrong_usage_exits_2(args):
    result = run_cli(*args)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert messages(result.stderr)[0].startswith("usage: keras-transformer")


def test_help_exits_0():
    result = run_cli("--help")
    assert result.returncode == 0
    assert all(command in result.stdout for command in ("translate", "train", "average", "evaluate"))
