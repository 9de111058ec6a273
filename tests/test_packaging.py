"""A wheel built from the source tree carries every package and every shipped preset."""

import subprocess
import sys
import zipfile

import pytest

from helpers import REPO_ROOT

SHIPPED = ["multi30k_en_de", "multi30k_en_fr"]


def test_pyproject_lists_every_package_of_the_source_tree():
    # setuptools installs only the packages listed: a package left out installs nowhere.
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11's TOML reader")
    listed = set(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    in_tree = {
        ".".join(init.parent.relative_to(REPO_ROOT).parts)
        for init in (REPO_ROOT / "keras_transformer").rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert in_tree - listed == set(), "packages that pyproject.toml's [tool.setuptools] packages leaves out"


CHILD = """
import sys
import keras_transformer as kt
assert kt.__file__.startswith(sys.argv[1]), kt.__file__
for name in sys.argv[2:]:
    model = kt.Transformer.from_preset(name)
    print(name, model.translate("Two dogs play in the snow.", beam_size=None))
"""


@pytest.mark.slow
def test_a_wheel_installs_and_loads_every_shipped_preset_offline(tmp_path):
    setuptools = pytest.importorskip("setuptools", reason="the wheel is built without build isolation")
    if int(setuptools.__version__.split(".")[0]) < 69:
        pytest.skip(f"pyproject.toml needs setuptools>=69 to build; {setuptools.__version__} is installed")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(REPO_ROOT),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
        ],
        check=True,
    )
    (wheel,) = (tmp_path / "dist").glob("keras_transformer-*.whl")
    installed = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        archive.extractall(installed)
    for name in SHIPPED:
        for file in (
            "config.json",
            "model.weights.h5",
            "metadata.json",
            "README.md",
            "assets/tokenizer/vocabulary.spm",
        ):
            assert f"keras_transformer/presets/shipped/{name}/{file}" in names
    run = subprocess.run(
        [sys.executable, "-c", CHILD, str(installed), *SHIPPED],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={
            "PYTHONPATH": str(installed),
            "HF_HUB_OFFLINE": "1",
            "PATH": "/usr/bin:/bin",
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "KERAS_BACKEND": "tensorflow",
            "HOME": str(tmp_path),
        },
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == SHIPPED
    assert all(len(line.split()) > 2 for line in lines)  # a translation, not an empty line
