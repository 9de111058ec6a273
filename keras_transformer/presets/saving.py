"""Saving a preset atomically, optionally in float16, with checksums and a card."""

import os
from pathlib import Path

import keras

from keras_transformer.presets.integrity import write_checksums
from keras_transformer.presets.model_card import default_model_card
from keras_transformer.utils.files import folder_replaced_atomically
from keras_transformer.utils.library_internals import CONFIG_FILE, README_FILE, get_preset_saver


def save_preset(
    task: keras.Model,
    preset_dir: str | os.PathLike,
    max_shard_size: float | None = 10,
    *,
    weights_dtype: str | None = None,
    model_card: str | None = None,
) -> Path:
    """Saves a task as a preset, atomically, with checksums and a model card.

    The preset is written by KerasHub into a hidden folder next to
    `preset_dir`, completed (model card, checksums) and renamed into place
    (`utils.files.folder_replaced_atomically`): a process killed at any
    point leaves either the previous version or the new one.

    Args:
        task: the model to save (its backbone, preprocessor and vocabulary).
        preset_dir: the preset folder to create or replace.
        max_shard_size: KerasHub's weight shard size in GB.
        weights_dtype: e.g. `"float16"` to store the weights at half size;
            `from_preset` loads them back in the default float32 unless
            given a `dtype`.
        model_card: the README.md text; by default one describing this model.

    Returns:
        The preset folder.
    """
    target = Path(preset_dir).resolve()
    if target.exists() and not (target.is_dir() and (not any(target.iterdir()) or (target / CONFIG_FILE).exists())):
        raise FileExistsError(
            f"{target} exists and is not a preset folder; refusing to replace it. Save to a new folder."
        )
    with folder_replaced_atomically(target) as temporary:
        if weights_dtype is not None:
            task = _with_dtype(task, weights_dtype)
        get_preset_saver(str(temporary)).save_task(task, max_shard_size=max_shard_size)
        card = model_card if model_card is not None else default_model_card(task, target.name)
        (temporary / README_FILE).write_text(card, encoding="utf-8")
        write_checksums(temporary)
    return target


def _with_dtype(task: keras.Model, dtype: str) -> keras.Model:
    """A copy of `task` whose backbone holds its weights in `dtype`."""
    config = task.backbone.get_config()
    config["dtype"] = dtype
    backbone = type(task.backbone).from_config(config)
    backbone.set_weights(task.backbone.get_weights())  # cast on assignment
    return type(task)(backbone=backbone, preprocessor=task.preprocessor)
