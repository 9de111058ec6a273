"""The CTranslate2 engine: the same answers as the Keras engine behind the same
app, its conversion cache (reused, and never left half-written), the
`serve --engine ctranslate2` command, and the error when its extra is missing."""

import os
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest

pytest.importorskip("starlette", reason="the server's tests need the serve extra: pip install '.[serve]'")
pytest.importorskip("ctranslate2", reason="the ctranslate2 engine's tests need its extra: pip install '.[ctranslate2]'")

from starlette.testclient import TestClient  # noqa: E402

import keras_transformer as kt  # noqa: E402
from helpers import REPO_ROOT  # noqa: E402
from keras_transformer.cli.main import main as cli_main  # noqa: E402
from keras_transformer.generation.settings import SearchSettings  # noqa: E402
from keras_transformer.server import (  # noqa: E402
    CTranslate2Engine,
    ModelEngine,
    ServiceSettings,
    TranslationService,
    app_of,
    served_model,
)
from keras_transformer.server.ctranslate2_cache import cache_key, converted_model  # noqa: E402

WITHOUT_MODULES = REPO_ROOT / "tests" / "without_modules"
SENTENCES = [
    "Two dogs play in the snow.",
    "A man in a blue shirt is standing on a ladder cleaning windows.",
    "A little girl climbs into a wooden playhouse.",
    "Several men in hard hats are operating a giant pulley system.",
    "A woman with a large purse is walking by a gate.",
    "a",
]
SEARCHES = {
    "beam": SearchSettings(),
    "greedy": SearchSettings(beam_size=None),
    # Short limits: each translation is cut at its own source length + 2.
    "greedy, cut short": SearchSettings(beam_size=None, max_extra_length=2),
}


@pytest.fixture(scope="module")
def model():
    return kt.Transformer.from_preset("multi30k_en_de")


@pytest.fixture(scope="module")
def cache_home(tmp_path_factory):
    """An `XDG_CACHE_HOME` whose cache holds the preset converted once for the whole module."""
    return tmp_path_factory.mktemp("cache_home")


@pytest.fixture(scope="module")
def cache(cache_home, model):
    folder = cache_home / "keras_transformer" / "ctranslate2"
    converted_model(model, root=folder)
    return folder


def translated(engine, texts: list[str]) -> list[str]:
    """`texts` through `/translate` of an app serving `engine`."""
    # A deadline that a first compilation on a busy machine cannot miss.
    settings = ServiceSettings(timeout_s=600)
    service = TranslationService([served_model("en-de", engine, (["en"], ["de"]))], settings)
    with TestClient(app_of(service, warm_up=False)) as client:
        response = client.post("/translate", json={"q": texts, "source": "en", "target": "de"})
    assert response.status_code == 200, response.text
    return response.json()["translatedText"]


@pytest.mark.parametrize("search", list(SEARCHES), ids=list(SEARCHES))
def test_translations_through_the_api_equal_the_keras_engines(model, cache, search):
    options = dict(search=SEARCHES[search], max_batch_size=8)
    expected = translated(ModelEngine(model, **options), SENTENCES)
    assert translated(CTranslate2Engine(model, cache=cache, inter_threads=2, **options), SENTENCES) == expected


def test_a_second_load_converts_nothing(model, cache, monkeypatch):
    before = {path: path.stat().st_mtime_ns for path in cache.rglob("*")}

    def no_conversion(*args, **kwargs):
        raise AssertionError("the model was converted again")

    monkeypatch.setattr("ctranslate2.converters.TransformersConverter", no_conversion)
    engine = CTranslate2Engine(model, cache=cache)
    assert engine.folder.parent == cache
    assert {path: path.stat().st_mtime_ns for path in cache.rglob("*")} == before


def test_int8_and_other_weights_get_their_own_conversions(model):
    other = kt.Transformer.from_preset("multi30k_en_de")
    weight = other.backbone.weights[0]
    weight.assign(weight.numpy() * 2)
    keys = {cache_key(model, None), cache_key(model, "int8"), cache_key(other, None)}
    assert len(keys) == 3


def test_a_failed_conversion_leaves_no_folder(model, tmp_path, monkeypatch):
    class FailingConverter:
        """Writes part of a model, then fails, as a crash or a full disk would."""

        def __init__(self, checkpoint):
            pass

        def convert(self, output_dir, **kwargs):
            with open(os.path.join(output_dir, "model.bin"), "wb") as file:
                file.write(b"half")
            raise OSError("No space left on device")

    monkeypatch.setattr("ctranslate2.converters.TransformersConverter", FailingConverter)
    with pytest.raises(OSError, match="No space left"):
        converted_model(model, root=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_serve_engine_ctranslate2_builds_the_engine(cache_home, cache, monkeypatch):
    import keras_transformer.server as server
    from keras_transformer.cli.commands import serve as serve_command

    built = {}
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    monkeypatch.setattr(server, "build_app", lambda models, settings, warm_up: built.setdefault("models", models))
    # The command builds its server and runs it on a socket it bound: neither serves here.
    monkeypatch.setattr(serve_command, "_server", lambda config: SimpleNamespace(run=lambda sockets: None))
    monkeypatch.setattr(serve_command, "_bound_socket", lambda host, port: socket.socket())
    monkeypatch.setattr("signal.signal", lambda *args: None)
    assert cli_main(["serve", "multi30k_en_de", "--engine", "ctranslate2", "--greedy", "--max-batch-size", "4"]) == 0
    (served,) = built["models"]
    assert isinstance(served.engine, CTranslate2Engine)
    assert served.engine.folder.parent == cache
    assert served.engine.search.beam_size is None and served.engine.rows_per_batch(16) == 4


def test_serve_refuses_bfloat16_with_ctranslate2(capsys):
    assert cli_main(["serve", "multi30k_en_de", "--engine", "ctranslate2", "--precision", "bfloat16"]) == 1
    assert "float32 or int8" in capsys.readouterr().err


@pytest.mark.parametrize("missing", ["ctranslate2", "torch,transformers"])
def test_without_the_extra_serve_says_what_to_install(missing, tmp_path):
    env = {
        **os.environ,
        "BLOCKED_MODULES": missing,
        "PYTHONPATH": os.pathsep.join([str(WITHOUT_MODULES), str(REPO_ROOT)]),
        "XDG_CACHE_HOME": str(tmp_path),  # nothing converted yet: torch and transformers would convert
        "KERAS_BACKEND": "tensorflow",  # a backend that runs without torch
    }
    command = [sys.executable, "-m", "keras_transformer.cli", "serve", "multi30k_en_de", "--engine", "ctranslate2"]
    result = subprocess.run(command, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr
    assert 'pip install "keras-transformer[ctranslate2]"' in result.stderr
    assert "Traceback" not in result.stderr
    assert not any(tmp_path.rglob("*.bin"))


def test_the_ray_builder_takes_the_engine():
    from keras_transformer.server.ray_deployment import BuilderArgs

    assert BuilderArgs.parse({"presets": "multi30k_en_de", "engine": "ctranslate2"}).engine == "ctranslate2"
    assert BuilderArgs.parse({"presets": "multi30k_en_de"}).engine == "keras"
