"""Offline with nothing cached, the errors suggest only what works.

Each test runs with `HF_HUB_OFFLINE=1` and an empty huggingface_hub cache:
every hub preset must say that the Hub could not be reached, that one call
made while online caches it, and that a local folder loads; it may suggest
`load_weights=False` only where that call then works offline.
"""

import pytest
from huggingface_hub import constants as hf_constants

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
