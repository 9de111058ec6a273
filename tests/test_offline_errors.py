"""Offline with nothing cached, the errors suggest only what works.

Each test runs with `HF_HUB_OFFLINE=1` and an empty huggingface_hub cache:
every hub preset must say that the Hub could not be reached, that one call
made while online caches it, and that a local folder loads; it may suggest
`load_weights=False` only where that call then works offline.
"""

import logging
import socket
import time

import pytest
from huggingface_hub import constants as hf_constants
from huggingface_hub import hf_api

import keras_transformer as kt
from keras_transformer.cli import main as cli
from keras_transformer.presets import catalog
from keras_transformer.presets.resolution import HubUnreachableError

HUB_PRESETS = sorted(
    name for name, entry in catalog.NAMED_PRESETS.items() if entry["kaggle_handle"].startswith("hf://")
)


@pytest.fixture(autouse=True)
def empty_offline_cache(tmp_path, monkeypatch):
    """HF_HUB_OFFLINE=1 and an empty cache in tmp_path. huggingface_hub reads
    its environment once, on import, so its constants are patched too."""
    home = tmp_path / "hf_home"
    cache = home / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hf_constants, "HF_HOME", str(home))
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)


def test_every_named_preset_that_lives_on_the_hub_is_checked():
    assert {"base_en_de", "base_en_fr", "big_en_fr", "big_en_de"} <= set(HUB_PRESETS)


@pytest.mark.parametrize("name", HUB_PRESETS)
def test_uncached_hub_preset_says_what_works_offline(name):
    with pytest.raises(HubUnreachableError) as error:
        kt.Transformer.from_preset(name)
    message = str(error.value)
    handle = catalog.NAMED_PRESETS[name]["kaggle_handle"]
    assert f"'{name}' ({handle})" in message
    assert "could not be reached" in message and "once while online" in message
    assert "save_pretrained" in message and "save_to_preset" in message
    # No Hub preset's architecture ships with the package, so
    # `load_weights=False` would fail offline the same way: not suggested.
    assert "load_weights=False" not in message
    with pytest.raises(HubUnreachableError) as without_weights:
        kt.Transformer.from_preset(name, load_weights=False)
    assert "load_weights=False" not in str(without_weights.value)


def test_convert_offline_says_the_hub_could_not_be_reached(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["convert", "base_en_de", str(out)]) == 1
    error = capsys.readouterr().err
    assert "could not be reached" in error and "hf://Helsinki-NLP/opus-mt-en-de" in error
    assert "not a checkpoint in transformers format" not in error
    assert not out.exists()


@pytest.fixture
def unreachable_hub(monkeypatch):
    """Offline mode off and the Hub's address a closed port on loopback:
    every request fails to connect, as on a network that is down, and none
    leaves the machine. huggingface_hub reads the address once, on import
    (its constants and its module-level `HfApi`), so those are patched."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{probe.getsockname()[1]}"
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setattr(hf_constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(
        hf_constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    )
    monkeypatch.setattr(hf_api.api, "endpoint", endpoint)
    return endpoint


# huggingface_hub's five retries wait 1, 2, 4, 8 and 8 seconds; failing at
# once takes a fraction of a second.
QUICK_S = 5


@pytest.mark.parametrize(
    "load",
    [
        pytest.param(lambda out: kt.Transformer.from_preset("base_en_de"), id="name"),
        pytest.param(lambda out: kt.Transformer.from_preset("hf://Helsinki-NLP/opus-mt-en-de"), id="handle"),
        pytest.param(lambda out: cli.main(["convert", "base_en_de", str(out)]), id="convert"),
    ],
)
def test_unreachable_hub_fails_at_the_first_answer(unreachable_hub, load, tmp_path, caplog, capsys):
    caplog.set_level(logging.WARNING)
    start = time.monotonic()
    try:
        result = load(tmp_path / "out")
    except HubUnreachableError as error:
        message = str(error)
    else:
        assert result == 1
        message = capsys.readouterr().err
    assert time.monotonic() - start < QUICK_S
    assert "could not be reached" in message and "once while online" in message
    assert not [record.getMessage() for record in caplog.records if record.name.startswith("huggingface_hub")]
