"""A Marian checkpoint's weights in a `TransformerBackbone` (benchmark-only).

`backbone_from_marian` is where the benchmark turns a saved `MarianMTModel`
into this project's model, through the project's own Marian converter
(`keras_transformer.marian`): the config checks and the weight mapping
users get. Only the backbone is built (the benchmark feeds token ids), and
its class can be a subclass (`benchmarks/project.py:FixedLengthBackbone`).
"""

from __future__ import annotations

import json
from pathlib import Path


def backbone_from_marian(checkpoint_dir: str | Path, *, unk_token_id: int = 1, dtype=None, backbone_cls=None):
    """Builds a `TransformerBackbone` (or `backbone_cls`, a subclass) with the
    weights of a saved `MarianMTModel` (`config.json` + `model.safetensors`).

    Marian's config does not record `<unk>`; Opus-MT's is 1.
    """
    from safetensors.numpy import load_file

    from keras_transformer import TransformerBackbone
    from keras_transformer.marian.config import backbone_arguments, special_ids
    from keras_transformer.marian.convert import load_marian_weights

    checkpoint_dir = Path(checkpoint_dir)
    repo = str(checkpoint_dir)
    config = json.loads((checkpoint_dir / "config.json").read_text())
    ids = special_ids(config, repo)
    backbone = (backbone_cls or TransformerBackbone)(
        **backbone_arguments(config, repo),
        pad_token_id=ids.pad,
        start_token_id=ids.start,
        end_token_id=ids.end,
        unk_token_id=unk_token_id,
        dtype=dtype,
    )
    load_marian_weights(backbone, load_file(checkpoint_dir / "model.safetensors"), repo)
    return backbone
