"""The built-in presets, as data (KerasHub's `<model>_presets.py`).

`keras_transformer/__init__.py` registers them with KerasHub, so that both
`Transformer.from_preset(name)` and KerasHub's own
`keras_hub.models.Seq2SeqLM.from_preset(name)` take the names. Three kinds:

- **Trained Opus-MT models** (`OPUS_MT_PRESETS`): `base_en_de`,
  `base_en_fr`, `base_hi_en`, `big_en_fr`, `big_en_de` and `big_de_en` stand for
  Helsinki-NLP's Marian checkpoints on the Hugging Face Hub, converted on
  load by `Transformer.from_preset` (`keras_transformer.marian`); the
  package data ships each one's card. `big_en_de` and `big_de_en` are one
  multilingual model (West Germanic to West Germanic) with its target
  language fixed (`PRESET_TARGET_LANGUAGES`).
- **The paper's untrained architectures** (`ARCHITECTURE_PRESETS`):
  `transformer_base` and `transformer_big`, Table 3 exactly, built offline
  from `<name>/config.json` with `load_weights=False` (no vocabulary).
- **Shipped presets** (`shipped_presets()`): every folder of the package
  data folder `presets/` that holds a complete saved preset (a `config.json`, weights and a `metadata.json`
  written by `Transformer.save_to_preset`) is registered under the folder's
  name, e.g. `multi30k_en_de`, and loads from disk with no download.

Example:
>>> sorted(OPUS_MT_PRESETS)
['base_en_de', 'base_en_fr', 'base_hi_en', 'big_de_en', 'big_en_de', 'big_en_fr']
>>> PRESET_TARGET_LANGUAGES["big_en_de"]
'deu'
>>> sorted(shipped_presets())
['multi30k_en_de', 'multi30k_en_fr']
"""

import importlib.resources
import json
from pathlib import Path

from keras_transformer.utils.library_internals import (
    CONFIG_FILE,
    METADATA_FILE,
    MODEL_WEIGHTS_FILE,
    README_FILE,
)

# The shipped presets' folders: the source tree's top-level `presets/`,
# installed as the package data `keras_transformer.presets.shipped`.
PRESETS_DIR = Path(importlib.resources.files("keras_transformer.presets.shipped"))

# The arguments of `TransformerBackbone` that make an architecture.
ARCHITECTURE_ARGUMENTS = (
    "num_encoder_layers",
    "num_decoder_layers",
    "hidden_dim",
    "intermediate_dim",
    "num_heads",
    "dropout",
)


def _architecture_of(preset: str) -> dict:
    """The architecture in `presets/<preset>/config.json`, Table 3's one copy."""
    config = json.loads((PRESETS_DIR / preset / CONFIG_FILE).read_text(encoding="utf-8"))["config"]
    return {argument: config[argument] for argument in ARCHITECTURE_ARGUMENTS}


# The architectures `keras-transformer train --preset` builds, by name, as backbone arguments.
ARCHITECTURES = {
    # Table 3 of the paper, as its untrained presets hold it.
    "transformer_base": _architecture_of("transformer_base"),
    "transformer_big": _architecture_of("transformer_big"),
    # The text-only Multi30k model of Wu et al., "Good for Misconceived Reasons" (ACL 2021).
    "transformer_tiny": dict(
        num_encoder_layers=4, num_decoder_layers=4, hidden_dim=128, intermediate_dim=256, num_heads=4, dropout=0.3
    ),
}


def _hub_preset(repo: str, description: str, params: int | None) -> dict:
    """A preset entry whose files live in the Hugging Face Hub repository `repo`
    (`params` `None` where the count is not known without its config)."""
    return {
        "metadata": {"description": description, "params": params, "path": "transformer"},
        # KerasHub's name for the field; it resolves any handle, hf:// included.
        "kaggle_handle": f"hf://{repo}",
    }


# Helsinki-NLP's Opus-MT checkpoints (Tiedemann & Thottingal 2020); parameter
# counts are the converted backbone's (embeddings and logits bias included).
# There is no tc-big English-German model: the West Germanic one covers both ways.
OPUS_MT_WEST_GERMANIC = "Helsinki-NLP/opus-mt-tc-big-gmw-gmw"
OPUS_MT_PRESETS = {
    "base_en_de": _hub_preset(
        "Helsinki-NLP/opus-mt-en-de",
        "Opus-MT English-German (Helsinki-NLP, CC-BY-4.0): base dimensions, swish, 58,101 "
        "SentencePiece pieces. Authors: 40.9 BLEU newstest2019.",
        73_944_309,
    ),
    "base_en_fr": _hub_preset(
        "Helsinki-NLP/opus-mt-en-fr",
        "Opus-MT English-French (Helsinki-NLP): base dimensions, swish, 59,514 SentencePiece "
        "pieces. Authors: 33.2 BLEU newstest2013.",
        74_669_178,
    ),
    "base_hi_en": _hub_preset(
        "Helsinki-NLP/opus-mt-hi-en",
        "Opus-MT Hindi-English (Helsinki-NLP): base dimensions, swish. Authors: 13.6 BLEU newstest2014-hien, "
        "40.4 Tatoeba.",
        None,
    ),
    "big_en_fr": _hub_preset(
        "Helsinki-NLP/opus-mt-tc-big-en-fr",
        "Opus-MT tc-big English-French (Helsinki-NLP, CC-BY-4.0): the paper's big dimensions, "
        "ReLU, 53,017 SentencePiece pieces. Authors: 52.2 BLEU flores101.",
        230_699_801,
    ),
    "big_en_de": _hub_preset(
        OPUS_MT_WEST_GERMANIC,
        "Opus-MT tc-big West Germanic (Helsinki-NLP, CC-BY-4.0) translating into German: the paper's "
        "big dimensions, ReLU. Authors, English-German: 29.0 BLEU newstest2014, 42.9 newstest2019.",
        None,
    ),
    "big_de_en": _hub_preset(
        OPUS_MT_WEST_GERMANIC,
        "Opus-MT tc-big West Germanic (Helsinki-NLP, CC-BY-4.0) translating into English: the paper's "
        "big dimensions, ReLU. Authors, German-English: 33.2 BLEU newstest2014, 41.8 flores101.",
        None,
    ),
}
# Presets of a multilingual checkpoint, by the target language each fixes:
# its token (`>>deu<<`) starts every source. Every loader of the name sets it
# as the tokenizer's `target_language`, so saved copies keep it in its config.
PRESET_TARGET_LANGUAGES = {"big_en_de": "deu", "big_de_en": "eng"}

# The paper's architectures without weights (Table 3), by the names
# `train --preset` uses, for `from_preset(name, load_weights=False)`; parameter
# counts are this implementation's (biases and LayerNorms included, one tied
# embedding matrix).
ARCHITECTURE_PRESETS = {
    name: {
        "metadata": {"description": description, "params": params, "path": "transformer"},
        "kaggle_handle": str(PRESETS_DIR / name),
    }
    for name, description, params in (
        ("transformer_base", "The paper's base Transformer, untrained (37,000-token vocabulary).", 63_082_496),
        ("transformer_big", "The paper's big Transformer, untrained (37,000-token vocabulary).", 214_245_376),
    )
}
NAMED_PRESETS = {**OPUS_MT_PRESETS, **ARCHITECTURE_PRESETS}


def is_saved_preset(directory: Path) -> bool:
    """Whether `directory` holds a complete preset (not just a card and a config)."""
    return all((directory / f).is_file() for f in (CONFIG_FILE, METADATA_FILE, MODEL_WEIGHTS_FILE))


def _first_paragraph(readme: Path) -> str:
    """The first line of prose in a model card, as the preset's description."""
    if not readme.is_file():
        return ""
    lines = readme.read_text(encoding="utf-8").splitlines()
    if lines and lines[0].strip() == "---":  # skip the YAML front matter
        lines = lines[lines.index("---", 1) + 1 :] if "---" in lines[1:] else []
    prose = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    return prose[0] if prose else ""


def shipped_presets(root: Path = PRESETS_DIR) -> dict:
    """Every complete preset saved in a folder of `root`, by folder name."""
    presets = {}
    for directory in sorted(Path(root).resolve().iterdir()):
        if directory.name.startswith((".", "_")) or not directory.is_dir():
            continue
        if directory.name in NAMED_PRESETS or not is_saved_preset(directory):
            continue
        metadata = json.loads((directory / METADATA_FILE).read_text(encoding="utf-8"))
        presets[directory.name] = {
            "metadata": {
                "description": _first_paragraph(directory / README_FILE),
                "params": metadata.get("parameter_count"),
                "path": "transformer",
            },
            # A local path: KerasHub's resolver reads it from disk, offline.
            "kaggle_handle": str(directory),
        }
    return presets
