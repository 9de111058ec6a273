"""Finding, checking and saving presets on top of KerasHub's preset machinery.

KerasHub (`keras_hub.src.utils.preset_utils`) reads and writes the files of a
preset. This module adds what a model zoo needs and KerasHub lacks:

- `resolve_preset`: a registered name, an `hf://` handle or a folder to a
  local folder, reading huggingface_hub's cache first, with errors that say
  what to do (unknown names get the closest match; an unreachable hub gets
  the ways to work offline);
- SHA-256 checksums of every file, written into `metadata.json` by
  `save_preset` and verified by `verify_preset` before anything in the preset
  is deserialized, so a truncated download or an altered file is named;
- `check_safe_configs`: configs may only name classes of Keras, KerasHub and
  this package, and never a `Lambda` layer: loading a preset runs no code of
  its own (weights are HDF5 arrays, the vocabulary a SentencePiece proto; no
  pickle anywhere, and Keras deserializes with `safe_mode=True`);
- `save_preset`: written into a temporary folder next to the target, flushed
  to disk, then renamed over it, so a killed save leaves the previous version
  intact; optionally with float16 weights; always with this project's own
  model card (KerasHub would upload a generic one).

Example:
>>> import keras_transformer
>>> from keras_transformer.preset_utils import available_presets
>>> "base_en_de" in available_presets()
True
"""

import difflib
import hashlib
import json
import os
import shutil
import tempfile
import uuid
import warnings
from pathlib import Path

import keras
from keras_hub.src.utils.preset_utils import (
    ASSET_DIR,
    BUILTIN_PRESETS_FOR_BACKBONE,
    CONFIG_FILE,
    HF_PREFIX,
    METADATA_FILE,
    MODEL_WEIGHTS_FILE,
    README_FILE,
    get_preset_saver,
)

from keras_transformer.files import fsync_directory
from keras_transformer.models.transformer_backbone import TransformerBackbone
from keras_transformer.presets import PAPER_PRESETS, PRESETS_DIR

# `metadata.json` is KerasHub's file, written and uploaded with every preset;
# the checksums live in it under this key rather than in a second file, so a
# preset stays the set of files KerasHub expects and nothing can be uploaded
# or copied without them.
CHECKSUMS_KEY = "keras_transformer_files"
# The model card is documentation, edited after saving (e.g. to add BLEU
# scores) and never loaded; metadata.json holds the checksums themselves.
UNCHECKED_FILES = {README_FILE, METADATA_FILE}
# Files a model needs to build without weights; the rest is weights.
ARCHITECTURE_PATTERNS = ["*.json", f"{ASSET_DIR}/*", README_FILE]
# The only code a preset config may name: the libraries themselves.
ALLOWED_MODULES = ("keras", "keras_hub", "keras_transformer")
FORBIDDEN_CLASSES = {"Lambda", "__lambda__", "TFOpLambda"}
READ_CHUNK = 1 << 20


class HubUnreachableError(ConnectionError):
    """The Hugging Face Hub could not be reached and the preset is not cached."""


class NotOnHubError(FileNotFoundError):
    """The Hugging Face Hub has no such repository (or it is private)."""


def available_presets() -> list[str]:
    """The names `Transformer.from_preset` accepts, besides folders and handles."""
    return sorted(BUILTIN_PRESETS_FOR_BACKBONE[TransformerBackbone])


def resolve_preset(preset: str | os.PathLike, load_weights: bool = True) -> tuple[Path, bool]:
    """Finds a preset on disk (downloading it if needed) and verifies it.

    Args:
        preset: a registered name (`available_presets()`), an
            `hf://org/name` handle, or a preset folder.
        load_weights: whether the weights are needed; without them only the
            configs and the vocabulary are fetched from the hub.

    Returns:
        `(folder, architecture_only)`. `architecture_only` is `True` when a
        paper preset's vocabulary could not be fetched and `folder` is this
        package's copy of its `config.json` (only with `load_weights=False`).

    Raises:
        ValueError: an unknown name, or a damaged or unsafe preset.
        FileNotFoundError: a missing folder or file, named.
        HubUnreachableError: the hub could not be reached and nothing is cached.
    """
    if not isinstance(preset, (str, os.PathLike)):
        raise TypeError(f"preset must be a name, an hf:// handle or a folder; got {type(preset).__name__}.")
    preset = os.fspath(preset)
    registered = BUILTIN_PRESETS_FOR_BACKBONE[TransformerBackbone]
    handle = registered[preset]["kaggle_handle"] if preset in registered else preset
    if handle.startswith(HF_PREFIX):
        try:
            directory = hub_snapshot(handle, preset, load_weights)
        except (HubUnreachableError, NotOnHubError) as error:
            if load_weights or preset not in PAPER_PRESETS:
                raise
            directory = PRESETS_DIR / preset
            reason = (
                "could not be reached, and it is not in the local cache"
                if isinstance(error, HubUnreachableError)
                else "has no such repository"
            )
            warnings.warn(
                f"The vocabulary of '{preset}' belongs on the Hugging Face Hub ({handle}), which "
                f"{reason}. Built the architecture from {directory / CONFIG_FILE} "
                "without a preprocessor (model.preprocessor is None). To translate text, attach "
                "the vocabulary it was trained with: model.preprocessor = "
                "keras_transformer.TransformerPreprocessor("
                "keras_transformer.TransformerTokenizer('vocabulary.spm')).",
                stacklevel=3,
            )
            check_safe_configs(directory)
            return directory, True
        verify_preset(directory, load_weights, require_checksums=True)
        return directory, False
    if "://" in handle:
        raise ValueError(
            f"Transformer.from_preset reads registered names, hf:// handles and folders; "
            f"got '{preset}'. Download other hubs' presets to a folder first."
        )
    if os.path.isdir(handle):
        verify_preset(Path(handle), load_weights)
        return Path(handle), False
    if os.sep in preset or preset.startswith(".") or (os.altsep and os.altsep in preset):
        raise FileNotFoundError(f"There is no preset folder at '{preset}'.{_interrupted_save_hint(Path(preset))}")
    names = available_presets()
    close = difflib.get_close_matches(preset, names, n=1)
    suggestion = f" Did you mean '{close[0]}'?" if close else ""
    raise ValueError(
        f"Unknown preset '{preset}'.{suggestion} Available presets: {', '.join(names)}; "
        "or give a preset folder or an hf://org/name handle."
    )


def hub_snapshot(handle: str, name: str, load_weights: bool = True) -> Path:
    """The local folder of a hub preset: the cache if it has it, else a download."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError

    repo_id = handle.removeprefix(HF_PREFIX)
    patterns = None if load_weights else ARCHITECTURE_PATTERNS
    needed = [CONFIG_FILE] + ([MODEL_WEIGHTS_FILE] if load_weights else [])
    try:
        cached = Path(snapshot_download(repo_id, local_files_only=True, allow_patterns=patterns))
        if all((cached / f).is_file() for f in needed):
            return cached
    except LocalEntryNotFoundError:
        pass  # not cached (or only partly): download
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except RepositoryNotFoundError as error:
        unpublished = (
            f" The weights of '{name}' have not been published yet; build the architecture "
            f"with Transformer.from_preset('{name}', load_weights=False)."
            if name in PAPER_PRESETS
            else ""
        )
        raise NotOnHubError(
            f"The Hugging Face Hub has no repository {handle} (or it is private: log in "
            f"with `hf auth login`).{unpublished}"
        ) from error
    except (LocalEntryNotFoundError, ConnectionError) as error:
        shown = handle if name == handle else f"'{name}' ({handle})"
        raise HubUnreachableError(
            f"Could not load preset {shown}: the Hugging Face Hub could not be reached and it "
            "is not in the local cache. Load a local preset folder instead "
            "(Transformer.from_preset('path/to/preset')), or build the architecture without "
            f"weights (Transformer.from_preset('{name}', load_weights=False))."
        ) from error


def _interrupted_save_hint(target: Path) -> str:
    previous = sorted(target.parent.glob(f".{target.name}.previous-*")) if target.parent.is_dir() else []
    if not previous:
        return ""
    return (
        f" A save into it was interrupted; the previous version is intact at {previous[-1]}: "
        "rename it back."
    )


# --- Checksums ------------------------------------------------------------


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
        f: {"bytes": (directory / f).stat().st_size, "sha256": sha256(directory / f)}
        for f in _preset_files(directory)
    }
    metadata_path.write_text(json.dumps(metadata, indent=4), encoding="utf-8")
    return metadata[CHECKSUMS_KEY]


def verify_preset(
    directory: str | os.PathLike, load_weights: bool = True, require_checksums: bool = False
) -> None:
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
                f"`{name}` is missing from the preset folder {directory}.{_interrupted_save_hint(directory)}"
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


# --- Loading weights ------------------------------------------------------


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


# --- Saving ---------------------------------------------------------------


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
    `preset_dir`, completed (model card, checksums), flushed to disk, and only
    then renamed into place; an existing preset is moved aside first and
    deleted last. A process killed at any point leaves either the previous
    version or the new one. One writer per target at a time.

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
    target.parent.mkdir(parents=True, exist_ok=True)
    for stale in target.parent.glob(f".{target.name}.partial-*"):
        shutil.rmtree(stale, ignore_errors=True)  # left by a killed save
    temporary = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        if weights_dtype is not None:
            task = _with_dtype(task, weights_dtype)
        get_preset_saver(str(temporary)).save_task(task, max_shard_size=max_shard_size)
        card = model_card if model_card is not None else default_model_card(task, target.name)
        (temporary / README_FILE).write_text(card, encoding="utf-8")
        write_checksums(temporary)
        _fsync_tree(temporary)
        _replace(temporary, target)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return target


def _with_dtype(task: keras.Model, dtype: str) -> keras.Model:
    """A copy of `task` whose backbone holds its weights in `dtype`."""
    config = task.backbone.get_config()
    config["dtype"] = dtype
    backbone = type(task.backbone).from_config(config)
    backbone.set_weights(task.backbone.get_weights())  # cast on assignment
    return type(task)(backbone=backbone, preprocessor=task.preprocessor)


def _fsync_tree(directory: Path) -> None:
    for root, _, names in os.walk(directory):
        for name in names:
            with open(Path(root) / name, "rb") as file:
                os.fsync(file.fileno())
        fsync_directory(Path(root))


def _replace(new: Path, target: Path) -> None:
    """Renames `new` to `target`, moving an existing `target` aside until then."""
    if target.exists():
        os.rename(target, target.parent / f".{target.name}.previous-{uuid.uuid4().hex[:8]}")
    os.rename(new, target)
    fsync_directory(target.parent)
    # The new version is in place: older ones (this one's, or one left by a
    # save killed between the two renames) are obsolete.
    for previous in target.parent.glob(f".{target.name}.previous-*"):
        shutil.rmtree(previous)


def default_model_card(task: keras.Model, name: str) -> str:
    """A model card describing a keras-transformer model (not a KerasHub one)."""
    backbone = task.backbone
    rows = [
        ("layers (encoder + decoder)", f"{backbone.num_encoder_layers} + {backbone.num_decoder_layers}"),
        ("d_model", backbone.hidden_dim),
        ("d_ff", backbone.intermediate_dim),
        ("attention heads", backbone.num_heads),
        ("dropout", backbone.dropout),
        ("attention dropout", backbone.attention_dropout),
        ("shared vocabulary", f"{backbone.vocabulary_size:,}"),
        ("layer norm", "pre-LN" if backbone.normalize_first else "post-LN (the paper's)"),
        ("parameters", f"{backbone.count_params():,}"),
        ("weights dtype", backbone.dtype_policy.name),
    ]
    table = "\n".join(f"| {key} | {value} |" for key, value in rows)
    return f"""---
library_name: keras-hub
license: apache-2.0
pipeline_tag: translation
tags:
- keras
- keras-transformer
- translation
---
# {name}

A Transformer translation model ("Attention Is All You Need", Vaswani et al.,
2017) saved with keras-transformer, a Keras 3 model family (TensorFlow, JAX and PyTorch backends) built on KerasHub.

## Architecture

| | |
| --- | --- |
{table}

One embedding matrix is shared by source, target and output projection
(section 3.4); positions are sinusoidal (3.5).

## Use

```python
import keras_transformer

model = keras_transformer.Transformer.from_preset("path/to/{name}")  # or hf://org/{name}
print(model.translate(["Two dogs play in the snow."]))
```

Loading verifies the SHA-256 of every file recorded in `metadata.json`.

## Training data, recipe and scores

This card was generated by `save_to_preset`, which does not know how the
model was trained: record the data, the exact `keras-transformer train` /
`average` / `evaluate` commands and the BLEU scores here.

## License

Apache-2.0.
"""
