"""The `keras-transformer` command as a user runs it: exit codes and messages.

0 on success, 1 for a failure (one sentence on stderr, no traceback), 2 for
wrong usage (argparse). Each test starts `python -m keras_transformer.cli`
in a subprocess.
"""

import argparse
import os
import queue
import re
import subprocess
import sys
import threading

import pytest

from helpers import REPO_ROOT, make_model

pytestmark = pytest.mark.slow  # each test starts Python and TensorFlow (~5-15 s)

# TensorFlow's C++ log lines: the command line keeps them off stderr unless
# --verbose (tests below); `messages` ignores them all the same.
NATIVE_LOG = re.compile(r"^(WARNING: All log messages before absl|[IWEF]\d{4} |To enable the following instructions)")


@pytest.fixture(scope="module", autouse=True)
def compile_cache(tmp_path_factory):
    """The commands keep compiled programs in a folder of this test run, not
    in the user's cache."""
    folder = tmp_path_factory.mktemp("compiled")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KERAS_TRANSFORMER_COMPILE_CACHE", str(folder))
        yield folder


def cli_environment(**environment) -> dict:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    )
    env.update(environment)
    env.pop("KERAS_TRANSFORMER_DEBUG", None)
    return env


def run_cli(*args, stdin="", cwd=None, **environment):
    return subprocess.run(
        [sys.executable, "-m", "keras_transformer.cli", *map(str, args)],
        input=stdin,
        capture_output=True,
        text=True,
        env=cli_environment(**environment),
        cwd=cwd,
        timeout=300,
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


def test_translate_answers_each_line_of_standard_input_as_it_arrives(preset):
    # One process: each translation is read before the next line is written
    # and before standard input closes; a reader that waited for more would
    # time out here instead of hanging the test.
    sentences = ["a dog runs .", "two cats play in the snow .", "", "a man walks ."]
    batched = run_cli("translate", "--preset", preset, "--beam-size", "2", *sentences)
    assert batched.returncode == 0, batched.stderr
    process = subprocess.Popen(
        [sys.executable, "-m", "keras_transformer.cli", "translate", "--preset", str(preset), "--beam-size", "2"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_environment(),
    )
    answers = queue.Queue()
    threading.Thread(target=lambda: [answers.put(line) for line in process.stdout], daemon=True).start()
    try:
        for sentence, expected in zip(sentences, batched.stdout.splitlines(keepends=True), strict=True):
            process.stdin.write(sentence + "\n")
            process.stdin.flush()
            try:
                assert answers.get(timeout=120) == expected
            except queue.Empty:
                pytest.fail(f"no translation of {sentence!r} while standard input stayed open")
        process.stdin.close()
        assert process.wait(timeout=60) == 0, process.stderr.read()
    finally:
        process.kill()


@pytest.mark.parametrize(
    "args, command, fragments",
    [
        (["translate", "--preset", "base_en_dee", "hi"], "translate", ["Unknown preset 'base_en_dee'", "base_en_de"]),
        (["translate", "--preset", "no/such/folder", "hi"], "translate", ["no/such/folder"]),
        (
            ["train", "--src", "missing.en", "--tgt", "missing.de", "--preset", "transformer_tiny", "--out", "run"],
            "train",
            ["cannot open missing.en"],
        ),
        (["average", "not_a_run", "--out", "preset"], "average", ["not_a_run is not a training run folder"]),
    ],
)
def test_user_mistakes_are_one_sentence_and_exit_1(args, command, fragments, tmp_path):
    assert_user_error(run_cli(*args, cwd=tmp_path), command, *fragments)


def test_bad_values_for_a_preset_are_one_sentence_and_exit_1(preset):
    assert_user_error(run_cli("translate", "--preset", preset, "--beam-size", "0", "a dog ."), "translate", "beam_size")
    long = " ".join(["a dog runs"] * 10)
    assert_user_error(
        run_cli("translate", "--preset", preset, "--too-long", "error", long), "translate", "more than the 14"
    )


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


def test_translate_shows_no_native_log_lines():
    result = run_cli("translate", "--preset", "multi30k_en_de", "Two dogs play in the snow.")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Zwei Hunde spielen im Schnee.\n"
    noise = ("I0000", "W0000", "E0000", "WARNING: All log messages")
    assert not [line for line in result.stderr.splitlines() if line.startswith(noise)], result.stderr
    assert "Traceback" not in result.stderr


def test_native_log_filter_keeps_everything_else():
    # The module is loaded from its file: importing the package would start
    # TensorFlow, whose own start-up lines are not what this test writes.
    startup_file = REPO_ROOT / "keras_transformer" / "cli" / "startup.py"
    program = (
        "import importlib.util, os, sys\n"
        f"spec = importlib.util.spec_from_file_location('startup', {str(startup_file)!r})\n"
        "startup = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(startup)\n"
        "startup.install_native_log_filter()\n"
        "os.write(2, b'I0000 00:00:1796028103.351484   10885 port.cc:153] oneDNN custom operations are on.\\n')\n"
        "os.write(2, b'WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\\n')\n"
        "os.write(2, b'E0000 00:00:1796028229.480159   12258 cuda_platform.cc:52] failed call to cuInit\\n')\n"
        "os.write(2, b'2019-08-26 11:45:20.776347: I tensorflow/core/gpu_device.cc:1618] Found device 0\\n')\n"
        "os.write(2, b'a native line of another kind\\n')\n"
        "print('from Python', file=sys.stderr)\n"
        "os.write(2, b'no newline at the end')\n"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    # Python's stderr skips the filter, so the order of lines may differ.
    assert sorted(result.stderr.splitlines()) == [
        "a native line of another kind",
        "from Python",
        "no newline at the end",
    ]


def test_verbose_names_the_backend_and_backend_sets_it(preset):
    pytest.importorskip("jax")
    result = run_cli("--verbose", "translate", "--backend", "jax", "--preset", preset, "a dog runs .")
    assert result.returncode == 0, result.stderr
    assert "on jax." in result.stderr
    assert len(result.stdout.splitlines()) == 1


def test_translate_reads_a_file_one_line_per_line(preset, tmp_path):
    source = tmp_path / "source.txt"
    source.write_text("a dog runs .\n\ntwo cats play .\n", encoding="utf-8")
    from_file = run_cli("translate", "--preset", preset, "--input", source, "--greedy")
    assert from_file.returncode == 0, from_file.stderr
    lines = from_file.stdout.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""  # three lines, the empty one kept
    from_arguments = run_cli("translate", "--preset", preset, "--greedy", "a dog runs .", "", "two cats play .")
    assert from_arguments.stdout == from_file.stdout


def test_translate_compiles_the_search_only_where_it_pays():
    import keras

    from keras_transformer.cli.commands.translate import EAGER_MAX_SENTENCES, _compile_search

    def compiles(total, compile="auto"):
        return _compile_search(argparse.Namespace(compile=compile, batch_size=32), total)

    on_tensorflow = keras.config.backend() == "tensorflow"
    assert compiles(EAGER_MAX_SENTENCES) is not on_tensorflow  # a few sentences: eager on TensorFlow
    assert compiles(EAGER_MAX_SENTENCES + 1) and compiles(None)  # more, or unknown (standard input)
    assert compiles(1, "yes") and not compiles(1000, "no")


def test_compiled_and_eager_translations_agree(preset, tmp_path):
    sentences = ["a dog runs .", "two cats play in the snow ."]
    compiled = run_cli("translate", "--preset", preset, "--compile", "yes", *sentences)
    eager = run_cli(
        "translate", "--preset", preset, "--compile", "no", *sentences, KERAS_TRANSFORMER_COMPILE_CACHE=str(tmp_path)
    )
    assert compiled.returncode == 0 and eager.returncode == 0, compiled.stderr + eager.stderr
    assert compiled.stdout == eager.stdout and len(eager.stdout.splitlines()) == 2
    # Eager TensorFlow compiles an XLA op on its first use of each shape:
    # the eager search uses none (`speed_paths.eager_ops.slice_update`).
    programs = [path.name for path in tmp_path.glob("tensorflow-*/*")]
    assert not programs, programs


@pytest.mark.skipif(os.environ.get("KERAS_BACKEND", "tensorflow") == "torch", reason="PyTorch decodes eagerly")
def test_a_compiled_search_is_kept_on_disk_and_reused(preset, tmp_path):
    import keras

    library = {"tensorflow": "tensorflow", "jax": "jaxlib"}[keras.config.backend()]
    environment = {"KERAS_TRANSFORMER_COMPILE_CACHE": str(tmp_path), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    args = ("translate", "--preset", preset, "--compile", "yes", "a dog runs .")
    first = run_cli(*args, **environment)
    assert first.returncode == 0, first.stderr
    (folder,) = tmp_path.glob(f"{library}-*")
    programs = sorted(p.name for p in folder.rglob("*") if p.is_file())
    assert programs, f"nothing compiled was kept in {folder}"
    second = run_cli(*args, **environment)
    assert second.returncode == 0 and second.stdout == first.stdout, second.stderr
    assert sorted(p.name for p in folder.rglob("*") if p.is_file()) == programs  # reused, not compiled again

    off = run_cli(*args, KERAS_TRANSFORMER_COMPILE_CACHE="0", TF_XLA_FLAGS="", JAX_COMPILATION_CACHE_DIR="")
    assert off.returncode == 0 and off.stdout == first.stdout, off.stderr


@pytest.mark.skipif(
    os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow",
    reason="JAX warns about a damaged cache entry and compiles; TensorFlow stops",
)
def test_a_damaged_compiled_program_is_one_sentence_and_the_next_run_works(preset, tmp_path):
    args = ("translate", "--preset", preset, "--compile", "yes", "a dog runs .")
    first = run_cli(*args, KERAS_TRANSFORMER_COMPILE_CACHE=str(tmp_path))
    assert first.returncode == 0, first.stderr
    programs = list(tmp_path.glob("tensorflow-*/*.pb"))
    assert programs
    for program in programs:
        program.write_bytes(program.read_bytes()[:1000])  # as a full disk or a crashed copy would leave it

    damaged = run_cli(*args, KERAS_TRANSFORMER_COMPILE_CACHE=str(tmp_path))
    assert_user_error(damaged, "translate", "could not be read", str(programs[0].parent))
    assert not any(program.exists() for program in programs)
    again = run_cli(*args, KERAS_TRANSFORMER_COMPILE_CACHE=str(tmp_path))
    assert again.returncode == 0 and again.stdout == first.stdout, again.stderr


@pytest.mark.parametrize("precision", ["bfloat16", "int8"])
def test_translate_precision_loads_the_preset_in_that_precision(preset, precision):
    from keras_transformer.presets.precision import load_model

    model = load_model(str(preset), precision)
    if precision == "bfloat16":
        assert model.backbone.compute_dtype == "bfloat16" and model.backbone.variable_dtype == "float32"
    else:
        assert any(w.dtype == "int8" for w in model.backbone.weights)
    assert len(model.translate(["a dog runs .", "two cats ."], beam_size=2)) == 2


def test_translate_with_int8_weights_from_the_command_line(preset):
    result = run_cli("translate", "--preset", preset, "--precision", "int8", "a dog runs .")
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 1


def test_translate_options_that_exclude_each_other(preset, tmp_path):
    result = run_cli("translate", "--preset", preset, "--greedy", "--beam-size", "2", "a dog .")
    assert result.returncode == 2 and "not allowed with" in result.stderr
    source = tmp_path / "source.txt"
    source.write_text("a dog .\n", encoding="utf-8")
    assert_user_error(run_cli("translate", "--preset", preset, "--input", source, "a dog ."), "translate", "not both")


def test_every_command_has_help_with_an_example():
    from keras_transformer.cli import main as cli

    parser = cli.build_parser(cli._commands())
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(subparsers.choices) == {
        "translate",
        "train",
        "average",
        "evaluate",
        "export",
        "attention",
        "upload",
        "convert",
        "serve",
        "prepare",
    }
    for name, sub in subparsers.choices.items():
        text = sub.format_help()
        assert "Example" in text and f"keras-transformer {name}" in text, name
        assert "--verbose" in text, name
    assert "Example" in parser.format_help()


def test_attention_writes_a_picture(preset, tmp_path):
    picture = tmp_path / "att.png"
    result = run_cli("attention", "--preset", preset, "a dog runs .", "--out", picture, "--heads", "0,1")
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 1  # the translation
    import matplotlib.image

    height, width = matplotlib.image.imread(picture).shape[:2]
    assert height > 200 and width > 300
    assert_user_error(
        run_cli("attention", "--preset", preset, "a dog .", "--out", picture, "--layer", "5"),
        "attention",
        "--layer 5 is out of range",
    )


def test_export_refuses_a_folder_with_files_and_runs_on_tensorflow(preset, tmp_path):
    (tmp_path / "mine.txt").write_text("keep")
    assert_user_error(run_cli("export", preset, tmp_path), "export", "not empty", "--overwrite")
    assert (tmp_path / "mine.txt").read_text() == "keep"
    # Whatever KERAS_BACKEND says, export runs on TensorFlow.
    result = run_cli("export", preset, tmp_path, "--overwrite", KERAS_BACKEND="jax")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "saved_model.pb").exists() and not (tmp_path / "mine.txt").exists()
