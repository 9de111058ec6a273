"""What the command line sets up before Keras starts and how `serve` ends: the
compile cache, the refused imports, the exit without finalization."""

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

from keras_transformer.cli import startup

STARTUP_FILE = Path(startup.__file__)


@pytest.fixture
def environment(monkeypatch):
    for name in (
        "KERAS_TRANSFORMER_COMPILE_CACHE",
        "TF_XLA_FLAGS",
        "JAX_COMPILATION_CACHE_DIR",
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
        "XDG_CACHE_HOME",
    ):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def installed(library):
    try:
        return importlib.metadata.version(library)
    except importlib.metadata.PackageNotFoundError:
        return None


def test_the_caches_of_tensorflow_and_jax_go_to_one_folder_per_version(environment, tmp_path):
    environment.setenv("XDG_CACHE_HOME", str(tmp_path))
    startup.use_compile_cache()
    root = tmp_path / "keras_transformer" / "compiled"
    tensorflow, jaxlib = installed("tensorflow"), installed("jaxlib")
    if tensorflow:
        folder = root / f"tensorflow-{tensorflow}"
        assert os.environ["TF_XLA_FLAGS"] == f"--tf_xla_persistent_cache_directory={folder}" and folder.is_dir()
    if jaxlib:
        folder = root / f"jaxlib-{jaxlib}"
        assert os.environ["JAX_COMPILATION_CACHE_DIR"] == str(folder) and folder.is_dir()
        # Every program, however quickly it compiled: a model's initializers too.
        assert os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"


def test_the_users_own_settings_are_kept_and_zero_turns_the_cache_off(environment, tmp_path):
    environment.setenv("KERAS_TRANSFORMER_COMPILE_CACHE", str(tmp_path))
    environment.setenv("TF_XLA_FLAGS", "--tf_xla_persistent_cache_directory=/mine --tf_xla_auto_jit=0")
    environment.setenv("JAX_COMPILATION_CACHE_DIR", "/mine")
    startup.use_compile_cache()
    assert os.environ["TF_XLA_FLAGS"] == "--tf_xla_persistent_cache_directory=/mine --tf_xla_auto_jit=0"
    assert os.environ["JAX_COMPILATION_CACHE_DIR"] == "/mine"

    environment.delenv("TF_XLA_FLAGS")
    environment.setenv("KERAS_TRANSFORMER_COMPILE_CACHE", "0")
    startup.use_compile_cache()
    assert "TF_XLA_FLAGS" not in os.environ


def test_other_tensorflow_flags_are_kept(environment, tmp_path):
    if not installed("tensorflow"):
        pytest.skip("TensorFlow is not installed")
    environment.setenv("KERAS_TRANSFORMER_COMPILE_CACHE", str(tmp_path))
    environment.setenv("TF_XLA_FLAGS", "--tf_xla_auto_jit=0")
    startup.use_compile_cache()
    assert os.environ["TF_XLA_FLAGS"].split() == [
        "--tf_xla_auto_jit=0",
        f"--tf_xla_persistent_cache_directory={tmp_path / ('tensorflow-' + installed('tensorflow'))}",
    ]


def test_the_backend_is_read_where_keras_reads_it(environment, tmp_path):
    environment.delenv("KERAS_BACKEND", raising=False)
    environment.setenv("KERAS_HOME", str(tmp_path))
    assert startup.configured_backend() == "tensorflow"  # no keras.json: Keras' default
    (tmp_path / "keras.json").write_text('{"backend": "jax"}')
    assert startup.configured_backend() == "jax"
    environment.setenv("KERAS_BACKEND", "torch")
    assert startup.configured_backend() == "torch"
    environment.delenv("KERAS_BACKEND")
    (tmp_path / "keras.json").write_text("{not json")
    assert startup.configured_backend() is None  # unsure: JAX is not refused


def run_python(program: str, **environment) -> subprocess.CompletedProcess:
    """`program` in a fresh interpreter that loads `cli/startup.py` from its
    file as `startup` (importing the package would start Keras)."""
    preamble = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('startup', {str(STARTUP_FILE)!r})\n"
        "startup = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(startup)\n"
    )
    env = {**os.environ, "KERAS_TRANSFORMER_VERBOSE": "1", "KERAS_TRANSFORMER_COMPILE_CACHE": "0", **environment}
    return subprocess.run(
        [sys.executable, "-c", preamble + program], capture_output=True, text=True, env=env, timeout=60
    )


@pytest.mark.parametrize("backend, refused", [("tensorflow", True), ("jax", False)])
def test_translate_refuses_optional_imports_until_the_package_is_imported(backend, refused):
    if not refused and not installed("jax"):
        pytest.skip("JAX is not installed")
    program = (
        "startup.prepare(['translate', '--preset', 'p', 'a dog .'])\n"
        "for name in ('IPython', 'matplotlib', 'pandas', 'jax'):\n"
        "    try:\n"
        "        __import__(name)\n"
        "        print(name, 'imported')\n"
        "    except ImportError:\n"
        "        print(name, 'refused')\n"
        "startup.after_imports()\n"
        "assert not [name for name in startup.OPTIONAL_IMPORTS if name in sys.modules and not sys.modules[name]]\n"
    )
    result = run_python(program, KERAS_BACKEND=backend)
    assert result.returncode == 0, result.stderr
    assert "IPython refused" in result.stdout and "matplotlib refused" in result.stdout
    assert "pandas refused" in result.stdout or not installed("pandas")
    assert ("jax refused" in result.stdout) is refused


@pytest.mark.parametrize(
    "command, backend, kept_out",
    [("serve", "jax", True), ("translate", "torch", True), ("translate", "tensorflow", False), ("train", "jax", False)],
)
def test_translate_and_serve_keep_tensorflow_out_on_jax_and_torch_for_good(command, backend, kept_out):
    program = (
        f"startup.prepare([{command!r}, '--preset', 'p'])\n"
        "startup.after_imports()\n"
        "for name in startup.TEXT_LIBRARIES:\n"
        "    print(name, 'kept out' if name in sys.modules and sys.modules[name] is None else 'importable')\n"
    )
    result = run_python(program, KERAS_BACKEND=backend)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == [
        f"{name} {'kept out' if kept_out else 'importable'}" for name in ("tensorflow", "tensorflow_text")
    ]


def test_translate_keeps_kagglehub_for_a_kaggle_preset():
    program = (
        "startup.prepare(['translate', '--preset', 'kaggle://me/model/keras/1', 'a dog .'])\n"
        "assert 'kagglehub' not in startup._refused\n"
        "assert 'matplotlib' in startup._refused\n"
        "startup.after_imports()\n"
    )
    result = run_python(program, KERAS_BACKEND="tensorflow")
    assert result.returncode == 0, result.stderr


def test_other_commands_import_everything():
    program = (
        "startup.prepare(['train', '--preset', 'p'])\n"
        "assert not any(module is None for module in sys.modules.values())\n"
        "startup.after_imports()\n"
    )
    result = run_python(program, KERAS_BACKEND="tensorflow")
    assert result.returncode == 0, result.stderr


def test_ending_the_process_flushes_the_output_and_runs_exit_handlers_only():
    program = (
        "import atexit\n"
        "class Finalized:\n"
        "    def __del__(self):\n"
        "        print('finalized', flush=True)\n"
        "kept = Finalized()\n"
        "atexit.register(lambda: print('exit handler', file=sys.stderr))\n"
        "sys.stdout.write('translation without a newline')\n"
        "startup.end_process(3)\n"
        "print('not reached')\n"
    )
    result = run_python(program)
    assert result.returncode == 3
    assert result.stdout == "translation without a newline"  # flushed; finalization (the __del__) skipped
    assert "exit handler" in result.stderr


def test_the_package_and_the_command_line_import_without_keras():
    # So that the command line's start-up (cli.main.command_line) runs before Keras starts.
    program = (
        "import sys\n"
        "import keras_transformer, keras_transformer.cli.main\n"
        "started = sorted({'keras', 'keras_hub', 'tensorflow', 'jax', 'torch'} & set(sys.modules))\n"
        "assert not started, started\n"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_the_package_used_as_a_library_changes_nothing_of_the_start_up(tmp_path):
    # Even with a command line's arguments: only cli.main.command_line prepares.
    program = (
        "import gc, os, stat, sys\n"
        "import keras_transformer as kt\n"
        "kt.Transformer\n"
        "assert gc.isenabled() and gc.get_freeze_count() == 0\n"
        "assert not [name for name in ('IPython', 'matplotlib', 'grain') if sys.modules.get(name, 0) is None]\n"
        "assert stat.S_ISREG(os.fstat(2).st_mode)  # still the file it was given, not a pipe\n"
    )
    with open(tmp_path / "stderr", "w") as stderr:
        result = subprocess.run(
            [sys.executable, "-c", program, "translate", "--preset", "p", "a dog ."],
            stdout=subprocess.PIPE,
            stderr=stderr,
            timeout=300,
        )
    assert result.returncode == 0, (tmp_path / "stderr").read_text()
