"""The built-in presets, registered with KerasHub's preset machinery.

Two kinds, both usable by name in `Transformer.from_preset(name)` and in
KerasHub's own `keras_hub.models.Seq2SeqLM.from_preset(name)`:

- **The paper's models** (`PAPER_PRESETS`): Table 3's base and big
  configurations for WMT 2014 English-German and English-French. Their
  weights and vocabularies live on the Hugging Face Hub under
  `hf://keras-transformer/<name>`; this folder ships each one's model card
  (`<name>/README.md`) and architecture (`<name>/config.json`), so that
  `Transformer.from_preset("base_en_de", load_weights=False)` builds the
  architecture offline.
- **Shipped presets** (`shipped_presets()`): every folder here that holds a
  complete saved preset (a `config.json`, weights and a `metadata.json`
  written by `Transformer.save_to_preset`) is registered under the folder's
  name, e.g. `multi30k_en_de`, and loads from disk with no download.

Example:
>>> import keras_transformer  # registers the presets
>>> sorted(keras_transformer.Transformer.presets)[:4]
['base_en_de', 'base_en_fr', 'big_en_de', 'big_en_fr']
"""

import json
from pathlib import Path

from keras_hub.src.utils.preset_utils import (
    CONFIG_FILE,
    METADATA_FILE,
    MODEL_WEIGHTS_FILE,
    README_FILE,
    register_presets,
)

from keras_transformer.models.transformer_backbone import TransformerBackbone

PRESETS_DIR = Path(__file__).resolve().parent
HUB_ORG = "keras-transformer"


def _paper_preset(name: str, description: str, params: int) -> dict:
    return {
        "metadata": {"description": description, "params": params, "path": "transformer"},
        # KerasHub's name for the field; it resolves any handle, hf:// included.
        "kaggle_handle": f"hf://{HUB_ORG}/{name}",
    }


# Table 3 of Vaswani et al. (2017); parameter counts are this implementation's
# (biases and LayerNorms included, one tied embedding matrix).
PAPER_PRESETS = {
    "base_en_de": _paper_preset(
        "base_en_de",
        "Transformer base (6+6 layers, d_model 512, d_ff 2048, 8 heads, dropout 0.1), "
        "WMT 2014 English-German, 37,000 shared BPE tokens. Paper: 27.3 BLEU newstest2014.",
        63_082_496,
    ),
    "big_en_de": _paper_preset(
        "big_en_de",
        "Transformer big (6+6 layers, d_model 1024, d_ff 4096, 16 heads, dropout 0.3), "
        "WMT 2014 English-German, 37,000 shared BPE tokens. Paper: 28.4 BLEU newstest2014.",
        214_245_376,
    ),
    "base_en_fr": _paper_preset(
        "base_en_fr",
        "Transformer base (6+6 layers, d_model 512, d_ff 2048, 8 heads, dropout 0.1), "
        "WMT 2014 English-French, 32,000 word-pieces. Paper: 38.1 BLEU newstest2014.",
        60_522_496,
    ),
    "big_en_fr": _paper_preset(
        "big_en_fr",
        "Transformer big (6+6 layers, d_model 1024, d_ff 4096, 16 heads, dropout 0.1), "
        "WMT 2014 English-French, 32,000 word-pieces. Paper: 41.8 BLEU newstest2014.",
        209_125_376,
    ),
}


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
        if directory.name in PAPER_PRESETS or not is_saved_preset(directory):
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


def register(root: Path = PRESETS_DIR) -> dict:
    """Registers the paper's presets and the saved presets under `root`.

    Called on import for this package's folder; call it again with another
    folder to register presets kept elsewhere, by folder name.

    Returns:
        The registered presets, by name.
    """
    presets = {**PAPER_PRESETS, **shipped_presets(root)}
    register_presets(presets, TransformerBackbone)
    return presets


register()
