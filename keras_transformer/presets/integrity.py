"""Checking a preset before anything in it is built: checksums and safety.

KerasHub reads and writes a preset's files; what a model zoo adds here:

- SHA-256 checksums of every file, written into KerasHub's `metadata.json`
  by `write_checksums` (at save time) and verified by `verify_preset`
  before anything in the preset is deserialized, so a truncated download or
  an altered file is named;
- `check_safe_configs`: configs may only name classes of Keras, KerasHub and
  this package, and never a `Lambda` layer: loading a preset runs no code of
  its own (weights are HDF5 arrays, the vocabulary a SentencePiece proto; no
  pickle anywhere, and Keras deserializes with `safe_mode=True`);
- `load_preset_weights`: weights whose parameter count or shapes do not fit
  the config are refused with both numbers.
"""

import hashlib
import json
import os
import warnings
from pathlib import Path

import keras

from keras_transformer.utils.library_internals import CONFIG_FILE, METADATA_FILE, MODEL_WEIGHTS_FILE, README_FILE

# `metadata.json` is KerasHub's file, written and uploaded with every preset;
# the checksums live in it under this key rather than in a second file, so a
# preset stays the set of files KerasHub expects and nothing can be uploaded
# or copied without them.
CHECKSUMS_KEY = "keras_transformer_files"
# The model card is documentation, edited after saving (e.g. to add BLEU
# scores) and never loaded; metadata.json holds the checksums themselves.
UNCHECKED_FILES = {README_FILE, METADATA_FILE}
# The only code a preset config may name: the libraries themselves.
ALLOWED_MODULES = ("keras", "keras_hub", "keras_transformer")
FORBIDDEN_CLASSES = {"Lambda", "__lambda__", "TFOpLambda"}
READ_CHUNK = 1 << 20


def interrupted_save_hint(target: Path) -> str:
    previous = sorted(target.parent.glob(f".{target.name}.previous-*")) if target.parent.is_dir() else []
    if not previous:
        return ""
    return f" A save into it was interrupted; the previous version is intact at {previous[-1]}: rename it back."


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _preset_files(directory: Path) -> list[str]:
    """Relative paths of the files a checksum covers (hidden files are the hub's)."""
    files = []
    for root, dirs, names in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            relative = (Path(root) / name).relative_to(directory).as_posix()
            if not name.startswith(".") and relative not in UNCHECKED_FILES:
                files.append(relative)
    return files


def write_checksums(directory: str | os.PathLike) -> dict:
    """Records size and SHA-256 of every file in the preset's `metadata.json`."""
    directory = Path(directory)
    metadata_path = directory / METADATA_FILE
    metadata = json.loads(metadata_path.read_text(encoding="utf-8")) if metadata_path.exists() else {}
    metadata[CHECKSUMS_KEY] = {
        f: {"bytes": (directory / f).stat().st_size, "sha256": sha256(directory / f)} for f in _preset_files(directory)
    }
    metadata_path.write_text(json.dumps(metadata, indent=4), encoding="utf-8")
    return metadata[CHECKSUMS_KEY]


def verify_preset(directory: str | os.PathLike, load_weights: bool = True, require_checksums: bool = False) -> None:
    """Checks that a preset is complete, undamaged and safe to load.

    Every file recorded in `metadata.json` must be present with its size and
    SHA-256 (weights only when `load_weights`), and no file may have been
    added. A preset without checksums (saved by plain KerasHub) loads with a
    warning, unless `require_checksums` (presets from the hub).

    Raises:
        FileNotFoundError: naming the missing file.
        ValueError: naming the damaged, unexpected or unsafe file.
    """
    directory = Path(directory)
    needed = [CONFIG_FILE] + ([MODEL_WEIGHTS_FILE] if load_weights else [])
    for name in needed:
        if not (directory / name).is_file():
            raise FileNotFoundError(
                f"`{name}` is missing from the preset folder {directory}.{interrupted_save_hint(directory)}"
            )
    metadata_path = directory / METADATA_FILE
    metadata = json.loads(metadata_path.read_text(encoding="utf-8")) if metadata_path.is_file() else {}
    recorded = metadata.get(CHECKSUMS_KEY)
    if recorded is None:
        message = (
            f"The preset {directory} has no checksums in {METADATA_FILE}, so its files cannot be "
            "verified (it was not saved by keras-transformer's save_to_preset)."
        )
        if require_checksums:
            raise ValueError(message + " Refusing to load it from the hub.")
        warnings.warn(message, stacklevel=3)
    else:
        for name, expected in recorded.items():
            path = directory / name
            if not load_weights and name.endswith(".weights.h5"):
                continue
            if not path.is_file():
                raise FileNotFoundError(f"`{name}` is missing from the preset folder {directory}.")
            size = path.stat().st_size
            if size != expected["bytes"]:
                cut = "truncated" if size < expected["bytes"] else "altered"
                raise ValueError(
                    f"`{name}` in {directory} is damaged ({cut}): {size:,} bytes, but "
                    f"{expected['bytes']:,} were saved. Download or save the preset again."
                )
            if sha256(path) != expected["sha256"]:
                raise ValueError(
                    f"`{name}` in {directory} is damaged (altered): its SHA-256 differs from "
                    f"the one recorded in {METADATA_FILE}. Download or save the preset again."
                )
        unexpected = sorted(set(_preset_files(directory)) - set(recorded))
        if unexpected:
            raise ValueError(
                f"`{unexpected[0]}` in {directory} was not part of the preset when it was saved "
                f"(no checksum in {METADATA_FILE}); remove it or save the preset again."
            )
    check_safe_configs(directory)


def check_safe_configs(directory: str | os.PathLike) -> None:
    """Refuses configs that name code outside Keras, KerasHub and this package."""
    directory = Path(directory)
    for path in sorted(directory.glob("*.json")):
        if path.name == METADATA_FILE:
            continue
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"`{path.name}` in {directory} is not valid JSON ({error}).") from error
        for entry in _serialized_objects(config):
            problem = _unsafe_reason(entry)
            if problem:
                raise ValueError(
                    f"Refusing to load the preset {directory}: `{path.name}` {problem}. Presets "
                    "may only use layers of Keras, KerasHub and keras-transformer, because "
                    "loading a preset must never run code it carries."
                )


def _serialized_objects(config):
    """Every dict in a config that Keras would deserialize into an object."""
    if isinstance(config, dict):
        if "class_name" in config:
            yield config
        for value in config.values():
            yield from _serialized_objects(value)
    elif isinstance(config, list):
        for value in config:
            yield from _serialized_objects(value)


def _unsafe_reason(entry: dict) -> str | None:
    class_name = entry.get("class_name")
    if class_name in FORBIDDEN_CLASSES:
        return f"contains a {class_name} layer, which runs Python code stored in the preset"
    registered = entry.get("registered_name") or ""
    module = entry.get("module") or ""
    if ">" in registered:
        package = registered.split(">")[0]
        if package not in ALLOWED_MODULES or keras.saving.get_registered_object(registered) is None:
            return f"names the unregistered class '{registered}'"
    elif module and module.split(".")[0] not in ALLOWED_MODULES:
        return f"names '{class_name}' from the module '{module}'"
    return None


def _stored_parameter_count(path: Path) -> int:
    import h5py

    count = 0

    def add(_, item):
        nonlocal count
        if isinstance(item, h5py.Dataset):
            count += item.size

    try:
        with h5py.File(path, "r") as file:
            file.visititems(add)
    except OSError as error:
        raise ValueError(f"`{path.name}` in {path.parent} is not a readable weights file ({error}).") from error
    return count


def load_preset_weights(backbone: keras.Model, directory: str | os.PathLike) -> None:
    """Loads `model.weights.h5` into `backbone`, saying so when they do not fit."""
    path = Path(directory) / MODEL_WEIGHTS_FILE
    stored, expected = _stored_parameter_count(path), backbone.count_params()
    mismatch = (
        f"The config does not match the weights: {CONFIG_FILE} in {path.parent} describes a "
        f"model with {expected:,} parameters"
    )
    if stored != expected:
        raise ValueError(f"{mismatch}, but {MODEL_WEIGHTS_FILE} holds {stored:,}.")
    try:
        backbone.load_weights(path)
    except ValueError as error:
        raise ValueError(f"{mismatch} whose shapes differ from {MODEL_WEIGHTS_FILE}'s: {error}") from error
