"""Presets: the paper's configurations, hub resolution, integrity, safety, atomic saves, upload."""

import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import huggingface_hub
import keras
import keras_hub
import numpy as np
import pytest
from huggingface_hub import constants as hf_constants
from keras_hub.src.utils import preset_utils as hub_preset_utils

import keras_transformer as kt
from helpers import REPO_ROOT, make_model
from keras_transformer.cli import main as cli
from keras_transformer.presets import catalog as kt_presets
from keras_transformer.presets import integrity as preset_integrity
from keras_transformer.presets import resolution as preset_resolution

PAPER = {
    # name: (vocabulary, d_model, d_ff, heads, dropout), Table 3 and section 6.1
    "transformer_base": (37000, 512, 2048, 8, 0.1),
    "transformer_big": (37000, 1024, 4096, 16, 0.3),
}
OPUS_MT = {
    "base_en_de": "hf://Helsinki-NLP/opus-mt-en-de",
    "base_en_fr": "hf://Helsinki-NLP/opus-mt-en-fr",
    "base_hi_en": "hf://Helsinki-NLP/opus-mt-hi-en",
    "big_en_fr": "hf://Helsinki-NLP/opus-mt-tc-big-en-fr",
    "big_en_de": "hf://Helsinki-NLP/opus-mt-tc-big-gmw-gmw",
    "big_de_en": "hf://Helsinki-NLP/opus-mt-tc-big-gmw-gmw",
}
TOKEN_IDS = {
    "encoder_token_ids": np.array([[2, 5, 6, 7, 3, 0]], "int32"),
    "encoder_padding_mask": np.array([[1, 1, 1, 1, 1, 0]], "int32"),
    "decoder_token_ids": np.array([[2, 8, 9, 0]], "int32"),
    "decoder_padding_mask": np.array([[1, 1, 1, 0]], "int32"),
}


@pytest.fixture
def offline_hub(tmp_path, monkeypatch) -> Path:
    """An empty huggingface_hub cache in tmp_path, with HF_HUB_OFFLINE=1."""
    cache = tmp_path / "hf_cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads these variables once, on import.
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    return cache


@pytest.fixture
def isolated_registry(monkeypatch):
    """Lets a test register presets without leaving them registered."""
    monkeypatch.setattr(hub_preset_utils, "BUILTIN_PRESETS", dict(hub_preset_utils.BUILTIN_PRESETS))
    monkeypatch.setattr(
        hub_preset_utils, "BUILTIN_PRESETS_FOR_BACKBONE", copy.deepcopy(hub_preset_utils.BUILTIN_PRESETS_FOR_BACKBONE)
    )
    monkeypatch.setattr(
        preset_resolution, "BUILTIN_PRESETS_FOR_BACKBONE", hub_preset_utils.BUILTIN_PRESETS_FOR_BACKBONE
    )


@pytest.fixture
def saved(tmp_path, tokenizer) -> tuple[kt.Transformer, Path]:
    """A tiny model and the preset it was saved to."""
    keras.utils.set_random_seed(11)
    model = make_model(tokenizer)
    model.save_to_preset(tmp_path / "tiny")
    return model, tmp_path / "tiny"


def logits(model, ids=TOKEN_IDS):
    return keras.ops.convert_to_numpy(model(ids, training=False))


# --- The paper's presets ----------------------------------------------------


def test_named_presets_are_registered_with_kerashub():
    for name in [*PAPER, *OPUS_MT]:
        assert name in kt.Transformer.presets
        assert name in preset_resolution.available_presets()
    for name, handle in OPUS_MT.items():
        assert hub_preset_utils.BUILTIN_PRESETS[name]["kaggle_handle"] == handle


@pytest.mark.parametrize("name", sorted(OPUS_MT))
def test_opus_mt_cards_say_whose_weights_and_how_they_differ(name):
    folder = REPO_ROOT / "presets" / name
    card = (folder / "README.md").read_text()
    assert not (folder / "config.json").exists()
    for needed in (
        OPUS_MT[name].removeprefix("hf://"),
        "Tiedemann",
        "BLEU",
        "License",
        "swish" if "base" in name else "ReLU",
        "vocab.json",
        "all sines, then all cosines",
        "logits bias",
    ):
        assert needed in card, needed


def test_architecture_presets_refuse_to_load_weights():
    with pytest.raises(ValueError, match="untrained architecture.*load_weights=False.*train --preset transformer_base"):
        kt.Transformer.from_preset("transformer_base")


@pytest.mark.parametrize("name", sorted(PAPER))
def test_paper_preset_config_and_card(name):
    vocabulary, hidden, intermediate, heads, dropout = PAPER[name]
    folder = REPO_ROOT / "presets" / name
    config = json.loads((folder / "config.json").read_text())
    assert config["registered_name"] == "keras_transformer>TransformerBackbone"
    assert {
        k: config["config"][k] for k in ("vocabulary_size", "hidden_dim", "intermediate_dim", "num_heads", "dropout")
    } == {
        "vocabulary_size": vocabulary,
        "hidden_dim": hidden,
        "intermediate_dim": intermediate,
        "num_heads": heads,
        "dropout": dropout,
    }
    assert config["config"]["num_encoder_layers"] == config["config"]["num_decoder_layers"] == 6
    assert config["config"]["normalize_first"] is False
    card = (folder / "README.md").read_text()
    for text in ("license: apache-2.0", "Apache-2.0", "keras-transformer train"):
        assert text in card, text


def test_base_builds_offline_without_weights(offline_hub):
    model = kt.Transformer.from_preset("transformer_base", load_weights=False)
    assert isinstance(model, kt.Transformer) and model.preprocessor is None
    params = model.backbone.count_params()
    assert params == _catalog_parameter_count("transformer_base") == _readme_parameter_count("transformer_base")
    assert abs(params - 65e6) / 65e6 < 0.04  # Table 3: 65M


@pytest.mark.slow
def test_big_parameter_count(offline_hub):
    model = kt.Transformer.from_preset("transformer_big", load_weights=False)
    assert abs(model.backbone.count_params() - 213e6) / 213e6 < 0.02  # Table 3: 213M
    assert model.backbone.count_params() == _catalog_parameter_count("transformer_big")
    assert model.backbone.count_params() == _readme_parameter_count("transformer_big")


def test_unreachable_hub_says_what_to_do(offline_hub):
    with pytest.raises(preset_resolution.HubUnreachableError) as error:
        kt.Transformer.from_preset("big_en_de")
    message = str(error.value)
    assert "hf://Helsinki-NLP/opus-mt-tc-big-gmw-gmw" in message
    assert "could not be reached" in message and "folder" in message


def test_unknown_name_lists_presets_and_closest_match():
    with pytest.raises(ValueError, match="Did you mean 'base_en_de'") as error:
        kt.Transformer.from_preset("base_en_dee")
    assert all(name in str(error.value) for name in PAPER)


def test_missing_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no preset folder"):
        kt.Transformer.from_preset(str(tmp_path / "nothing"))


# --- The trained presets shipped in the package --------------------------------

# A word each translation of "Two dogs play in the snow." must contain.
SHIPPED_DOGS = {"multi30k_en_de": "Hunde", "multi30k_en_fr": "chiens"}


def test_trained_presets_are_shipped():
    assert set(SHIPPED_DOGS) <= set(kt_presets.shipped_presets())


@pytest.mark.parametrize("name", sorted(SHIPPED_DOGS))
def test_shipped_preset_loads_offline_and_translates(name, offline_hub):
    """Checksums verified on load, no download, a real translation."""
    model = kt.Transformer.from_preset(name)
    assert model.backbone.dtype_policy.name == "float32"
    [translation] = model.translate(["Two dogs play in the snow."])
    assert SHIPPED_DOGS[name] in translation.split()


# --- Round trips --------------------------------------------------------------


def test_save_and_load_round_trip(saved):
    model, folder = saved
    assert {"config.json", "task.json", "model.weights.h5", "metadata.json", "README.md"} <= set(os.listdir(folder))
    loaded = kt.Transformer.from_preset(str(folder))
    np.testing.assert_allclose(logits(loaded), logits(model), atol=1e-6)
    assert loaded.translate(["a dog runs ."]) == model.translate(["a dog runs ."])
    card = (folder / "README.md").read_text()
    assert "keras-transformer" in card and "KerasHub library" not in card


def test_kerashub_seq2seqlm_from_preset_returns_transformer(saved):
    model, folder = saved
    loaded = keras_hub.models.Seq2SeqLM.from_preset(str(folder))
    assert type(loaded) is kt.Transformer
    np.testing.assert_allclose(logits(loaded), logits(model), atol=1e-6)


def test_float16_weights_round_trip(tmp_path, saved):
    model, _ = saved
    folder = tmp_path / "half"
    model.save_to_preset(folder, weights_dtype="float16")
    with h5py.File(folder / "model.weights.h5") as weights:
        dtypes = set()
        weights.visititems(lambda _, item: dtypes.add(item.dtype.name) if isinstance(item, h5py.Dataset) else None)
    assert dtypes == {"float16"}
    loaded = kt.Transformer.from_preset(str(folder))
    assert loaded.backbone.dtype_policy.name == "float32"
    assert all(v.dtype == "float32" for v in loaded.backbone.weights)
    np.testing.assert_allclose(logits(loaded), logits(model), atol=5e-2)
    half = kt.Transformer.from_preset(str(folder), dtype="float16")
    assert half.backbone.weights[0].dtype == "float16"


def test_hub_handle_loads_from_cache_offline(saved, offline_hub):
    """The real huggingface_hub code path, on a cache laid out by hand."""
    model, folder = saved
    repo = offline_hub / "models--someone--tiny"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(folder, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    loaded = kt.Transformer.from_preset("hf://someone/tiny")
    np.testing.assert_allclose(logits(loaded), logits(model), atol=1e-6)
    # A hub preset without checksums cannot be verified, so it is refused.
    metadata = repo / "snapshots" / commit / "metadata.json"
    metadata.write_text(
        json.dumps({k: v for k, v in json.loads(metadata.read_text()).items() if k != preset_integrity.CHECKSUMS_KEY})
    )
    with pytest.raises(ValueError, match="no checksums"):
        kt.Transformer.from_preset("hf://someone/tiny")


def test_saved_presets_in_a_folder_register_by_name(tmp_path, tokenizer, offline_hub, isolated_registry):
    keras.utils.set_random_seed(5)
    model = make_model(tokenizer)
    model.save_to_preset(
        tmp_path / "shelf" / "multi30k_xx_yy", model_card="---\nlicense: apache-2.0\n---\n# t\n\nA tiny test model.\n"
    )
    (tmp_path / "shelf" / "not_a_preset").mkdir()
    registered = preset_resolution.register_builtin_presets(tmp_path / "shelf")
    assert "multi30k_xx_yy" in registered and "not_a_preset" not in registered
    assert registered["multi30k_xx_yy"]["metadata"]["description"] == "A tiny test model."
    loaded = kt.Transformer.from_preset("multi30k_xx_yy")
    np.testing.assert_allclose(logits(loaded), logits(model), atol=1e-6)
    assert type(keras_hub.models.Seq2SeqLM.from_preset("multi30k_xx_yy")) is kt.Transformer


# --- Damaged presets ----------------------------------------------------------


@pytest.mark.parametrize("name", ["model.weights.h5", "tokenizer.json", "assets/tokenizer/vocabulary.spm"])
def test_missing_file_is_named(saved, name):
    _, folder = saved
    (folder / name).unlink()
    with pytest.raises(FileNotFoundError, match=name.replace(".", r"\.")):
        kt.Transformer.from_preset(str(folder))


def test_truncated_weights_are_detected(saved):
    _, folder = saved
    weights = folder / "model.weights.h5"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(ValueError, match=r"model\.weights\.h5.*truncated"):
        kt.Transformer.from_preset(str(folder))


def test_altered_weights_are_detected(saved):
    _, folder = saved
    weights = folder / "model.weights.h5"
    data = bytearray(weights.read_bytes())
    data[-50] ^= 0xFF  # same size, one byte changed
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"model\.weights\.h5.*altered"):
        kt.Transformer.from_preset(str(folder))


def test_added_file_is_refused(saved):
    _, folder = saved
    (folder / "extra.json").write_text("{}")
    with pytest.raises(ValueError, match=r"extra\.json"):
        kt.Transformer.from_preset(str(folder))


def test_config_that_does_not_match_weights(saved):
    _, folder = saved
    config = json.loads((folder / "task.json").read_text())
    config["config"]["backbone"]["config"]["num_decoder_layers"] = 1
    (folder / "task.json").write_text(json.dumps(config))
    preset_integrity.write_checksums(folder)  # a consistent-looking but wrong preset
    with pytest.raises(ValueError, match="config does not match the weights"):
        kt.Transformer.from_preset(str(folder))


@pytest.mark.parametrize(
    "layer",
    [
        {"module": "keras.layers", "class_name": "Lambda", "config": {"function": "print"}, "registered_name": None},
        {"module": "os", "class_name": "system", "config": {}, "registered_name": None},
        {"module": "evil", "class_name": "Payload", "config": {}, "registered_name": "evil>Payload"},
    ],
)
def test_configs_naming_code_are_refused(saved, layer):
    _, folder = saved
    config = json.loads((folder / "task.json").read_text())
    config["config"]["backbone"]["config"]["dtype"] = layer  # anywhere in the config
    (folder / "task.json").write_text(json.dumps(config))
    preset_integrity.write_checksums(folder)
    with pytest.raises(ValueError, match="Refusing to load"):
        kt.Transformer.from_preset(str(folder))


# --- Atomic saves ---------------------------------------------------------------

CHILD = """
import os, sys, time
import keras
keras.utils.set_random_seed(99)
import keras_transformer as kt
from keras_transformer.presets import saving as preset_saving
sys.path.insert(0, {tests!r})
from helpers import PAIRS, make_model

def block(*args, **kwargs):
    open({marker!r}, "w").close()
    time.sleep(600)

if {point!r} == "writing":
    # KerasHub has written the weights into the temporary folder.
    preset_saving.write_checksums = block
else:
    # The old preset has been moved aside, the new one not yet renamed.
    rename = os.rename
    def slow_rename(source, target):
        rename(source, target)
        if ".previous-" in str(target):
            block()
    preset_saving.os.rename = slow_rename
tokenizer = kt.train_tokenizer([s for p in PAIRS for s in p] * 10, vocabulary_size=64)
make_model(tokenizer).save_to_preset({target!r})
"""


def kill_during_save(tmp_path, target, point):
    marker = tmp_path / f"{point}.marker"
    script = CHILD.format(tests=str(REPO_ROOT / "tests"), marker=str(marker), point=point, target=str(target))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    child = subprocess.Popen([sys.executable, "-c", script], env=env, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not marker.exists():
        assert child.poll() is None, child.stderr.read().decode()[-2000:]
        assert time.time() < deadline, "the child never reached the save"
        time.sleep(0.1)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()


@pytest.mark.slow
def test_killed_save_leaves_previous_preset_intact(tmp_path, saved):
    model, folder = saved
    kill_during_save(tmp_path, folder, "writing")
    assert any(p.name.startswith(".tiny.partial-") for p in tmp_path.iterdir())
    loaded = kt.Transformer.from_preset(str(folder))
    np.testing.assert_allclose(logits(loaded), logits(model), atol=1e-6)

    kill_during_save(tmp_path, folder, "renaming")
    with pytest.raises(FileNotFoundError, match="previous version is intact"):
        kt.Transformer.from_preset(str(folder))
    (previous,) = tmp_path.glob(".tiny.previous-*")
    np.testing.assert_allclose(logits(kt.Transformer.from_preset(str(previous))), logits(model), atol=1e-6)

    # The next save completes and clears what the killed ones left behind.
    model.save_to_preset(tmp_path / "tiny")
    assert [p.name for p in tmp_path.iterdir() if "tiny" in p.name] == ["tiny"]


def test_save_replaces_an_existing_preset(tmp_path, saved, tokenizer):
    _, folder = saved
    keras.utils.set_random_seed(12)
    other = make_model(tokenizer)
    other.save_to_preset(folder)
    np.testing.assert_allclose(logits(kt.Transformer.from_preset(str(folder))), logits(other), atol=1e-6)
    assert [p.name for p in tmp_path.iterdir()] == ["tiny"]


def test_save_refuses_to_replace_a_folder_that_is_not_a_preset(tmp_path, saved):
    model, _ = saved
    precious = tmp_path / "home"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    with pytest.raises(FileExistsError, match="not a preset folder"):
        model.save_to_preset(precious)
    assert (precious / "thesis.tex").read_text() == "years of work"


# --- Upload -------------------------------------------------------------------


@pytest.fixture
def fake_hub(monkeypatch) -> list:
    """Records what `upload` would send instead of sending it."""
    calls = []

    def create_repo(repo_id, private=False, exist_ok=False, **kwargs):
        calls.append(("create_repo", repo_id, private))
        return huggingface_hub.RepoUrl(f"https://hub.invalid/{repo_id}", endpoint="https://hub.invalid")

    def upload_folder(repo_id, folder_path, commit_message=None, **kwargs):
        files = sorted(str(p.relative_to(folder_path)) for p in Path(folder_path).rglob("*") if p.is_file())
        card = (Path(folder_path) / "README.md").read_text()
        calls.append(("upload_folder", repo_id, files, card))

    monkeypatch.setattr(huggingface_hub, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub, "upload_folder", upload_folder)
    return calls


def test_upload_sends_the_preset_with_its_own_card(saved, fake_hub):
    _, folder = saved
    assert cli.main(["upload", str(folder), "hf://someone/tiny_en_de", "--private"]) == 0
    (create, upload) = fake_hub
    assert create == ("create_repo", "someone/tiny_en_de", True)
    _, repo_id, files, card = upload
    assert repo_id == "someone/tiny_en_de"
    assert {
        "README.md",
        "config.json",
        "task.json",
        "metadata.json",
        "model.weights.h5",
        "assets/tokenizer/vocabulary.spm",
    } <= set(files)
    assert card == (folder / "README.md").read_text() and "keras-transformer" in card


def test_upload_refuses_a_damaged_preset(saved, fake_hub, capsys):
    _, folder = saved
    weights = folder / "model.weights.h5"
    weights.write_bytes(weights.read_bytes()[:-10])
    assert cli.main(["upload", str(folder), "hf://someone/tiny"]) == 1
    assert fake_hub == []
    assert "model.weights.h5" in capsys.readouterr().err


def test_upload_refuses_a_bad_handle(saved, fake_hub, capsys):
    _, folder = saved
    assert cli.main(["upload", str(folder), "someone/tiny"]) == 1
    assert fake_hub == [] and "hf://user/name" in capsys.readouterr().err


def test_table_3_is_written_once():
    # The catalog reads each untrained architecture from its config.json, in
    # the backbone's argument names, and the backbone's docstring table says the same.
    for name in kt_presets.ARCHITECTURE_PRESETS:
        config = json.loads((REPO_ROOT / "presets" / name / "config.json").read_text())["config"]
        architecture = kt_presets.ARCHITECTURES[name]
        assert set(architecture) == set(kt_presets.ARCHITECTURE_ARGUMENTS), name
        assert architecture == {key: config[key] for key in architecture}, name
        kt.TransformerBackbone(vocabulary_size=100, **kt_presets.ARCHITECTURES[name])  # valid arguments
    assert set(kt_presets.ARCHITECTURES["transformer_tiny"]) == set(kt_presets.ARCHITECTURE_ARGUMENTS)
    rows = re.findall(
        r"^\s*\| (\S+)\s*\| ([\w, ]+?)\s*\| ([\d.]+)\s*\| ([\d.]+)\s*\|$", kt.TransformerBackbone.__doc__, re.M
    )
    assert len(rows) == 5, rows
    for _, arguments, base, big in rows:
        for argument in arguments.split(", "):
            for name, value in (("transformer_base", base), ("transformer_big", big)):
                assert kt_presets.ARCHITECTURES[name][argument] == float(value), (name, argument)


def _readme_parameter_count(name: str) -> int:
    """The parameter count the README's preset table gives `name`."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    (count,) = re.findall(rf"^\| `{name}` \|[^|\n]*\(([\d,]+) parameters\)", readme, re.M)
    return int(count.replace(",", ""))


def _catalog_parameter_count(name: str) -> int:
    return kt_presets.NAMED_PRESETS[name]["metadata"]["params"]


def test_opus_mt_parameter_counts_are_their_architectures():
    # Opus-MT base: Table 3's base dimensions, swish, a logits bias, one
    # shared vocabulary of the size the description gives.
    for name in ("base_en_de", "base_en_fr"):
        description = kt_presets.OPUS_MT_PRESETS[name]["metadata"]["description"]
        (vocabulary,) = re.findall(r"([\d,]+) SentencePiece pieces", description)
        backbone = kt.TransformerBackbone(
            vocabulary_size=int(vocabulary.replace(",", "")),
            activation="swish",
            use_logits_bias=True,
            **kt_presets.ARCHITECTURES["transformer_base"],
        )
        assert backbone.count_params() == _catalog_parameter_count(name), name


@pytest.mark.slow
def test_opus_mt_big_parameter_count_is_its_architecture():
    description = kt_presets.OPUS_MT_PRESETS["big_en_fr"]["metadata"]["description"]
    (vocabulary,) = re.findall(r"([\d,]+) SentencePiece pieces", description)
    backbone = kt.TransformerBackbone(
        vocabulary_size=int(vocabulary.replace(",", "")),
        use_logits_bias=True,
        **kt_presets.ARCHITECTURES["transformer_big"],
    )
    assert backbone.count_params() == _catalog_parameter_count("big_en_fr")
