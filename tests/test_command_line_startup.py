"""What the command line sets up before Keras starts: the compile cache."""

import importlib.metadata

import pytest

from keras_transformer.cli import startup


@pytest.fixture
def environment(monkeypatch):
    for name in ("KERAS_TRANSFORMER_COMPILE_CACHE", "TF_XLA_FLAGS", "JAX_COMPILATION_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def installed(library):
    try:
        return importlib.metadata.version(library)
    except importlib.metadata.PackageNotFoundError:
        return None


def test_the_caches_of_tensorflow_and_jax_go_to_one_folder_per_version(environment, tmp_path):
    import os

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


def test_the_users_own_settings_are_kept_and_zero_turns_the_cache_off(environment, tmp_path):
    import os

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
    import os

    if not installed("tensorflow"):
        pytest.skip("TensorFlow is not installed")
    environment.setenv("KERAS_TRANSFORMER_COMPILE_CACHE", str(tmp_path))
    environment.setenv("TF_XLA_FLAGS", "--tf_xla_auto_jit=0")
    startup.use_compile_cache()
    assert os.environ["TF_XLA_FLAGS"].split() == [
        "--tf_xla_auto_jit=0",
        f"--tf_xla_persistent_cache_directory={tmp_path / ('tensorflow-' + installed('tensorflow'))}",
    ]
