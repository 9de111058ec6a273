"""From a preset's name, `hf://` handle or folder to a verified local folder.

Registered names (`available_presets()`) map to a folder of this package or
a Hugging Face Hub repository; hub presets are read from huggingface_hub's
cache first and downloaded otherwise, with errors that say what to do
(unknown names get the closest match; an unreachable hub gets the ways to
work offline). Every folder is verified (`preset_integrity`) before use.

Example:
>>> "base_en_de" in available_presets()
True
"""

import difflib
import os
from pathlib import Path

from keras_transformer.models.transformer_backbone import TransformerBackbone
from keras_transformer.presets.catalog import (
    ARCHITECTURE_PRESETS,
    NAMED_PRESETS,
    PRESET_TARGET_LANGUAGES,
    PRESETS_DIR,
    shipped_presets,
)
from keras_transformer.presets.integrity import check_safe_configs, interrupted_save_hint, verify_preset
from keras_transformer.utils.library_internals import (
    ASSET_DIR,
    BUILTIN_PRESETS_FOR_BACKBONE,
    CONFIG_FILE,
    HF_PREFIX,
    MODEL_WEIGHTS_FILE,
    README_FILE,
    register_presets,
)

# Files a model needs to build without weights; the rest is weights.
ARCHITECTURE_PATTERNS = ["*.json", f"{ASSET_DIR}/*", README_FILE]


class HubUnreachableError(ConnectionError):
    """The Hugging Face Hub could not be reached and the preset is not cached."""


class NotOnHubError(FileNotFoundError):
    """The Hugging Face Hub has no such repository (or it is private)."""


def register_builtin_presets(root: str | os.PathLike = PRESETS_DIR) -> dict:
    """Registers the named presets and the saved presets in `root`'s folders.

    This module calls it on import for the presets the package ships (as
    KerasHub's own models register theirs); call it with another folder to
    register presets kept elsewhere, by folder name.

    Returns:
        The registered presets, by name.
    """
    presets = {**NAMED_PRESETS, **shipped_presets(Path(root))}
    register_presets(presets, TransformerBackbone)
    return presets


def available_presets() -> list[str]:
    """The names `Transformer.from_preset` accepts, besides folders and handles."""
    return sorted(BUILTIN_PRESETS_FOR_BACKBONE[TransformerBackbone])


def preset_handle(preset: str | os.PathLike) -> str:
    """The handle (`hf://...` or a folder) a registered name stands for; any
    other preset as it is."""
    preset = os.fspath(preset) if isinstance(preset, os.PathLike) else preset
    registered = BUILTIN_PRESETS_FOR_BACKBONE[TransformerBackbone]
    return registered[preset]["kaggle_handle"] if isinstance(preset, str) and preset in registered else preset


def preset_target_language(preset) -> str | None:
    """The target language a registered preset of a multilingual checkpoint
    fixes (`"big_en_de"` -> `"deu"`), else `None`."""
    return PRESET_TARGET_LANGUAGES.get(preset) if isinstance(preset, str) else None


def resolve_preset(preset: str | os.PathLike, load_weights: bool = True) -> tuple[Path, bool]:
    """Finds a preset on disk (downloading it if needed) and verifies it.

    Args:
        preset: a registered name (`available_presets()`), an
            `hf://org/name` handle, or a preset folder.
        load_weights: whether the weights are needed; without them only the
            configs and the vocabulary are fetched from the hub.

    Returns:
        `(folder, architecture_only)`. `architecture_only` is `True` for the
        paper's untrained architectures (`ARCHITECTURE_PRESETS`, only with
        `load_weights=False`): `folder` is this package's copy of the
        `config.json`, without a vocabulary.

    Raises:
        ValueError: an unknown name, or a damaged or unsafe preset.
        FileNotFoundError: a missing folder or file, named.
        HubUnreachableError: the hub could not be reached and nothing is cached.
    """
    if not isinstance(preset, (str, os.PathLike)):
        raise TypeError(f"preset must be a name, an hf:// handle or a folder; got {type(preset).__name__}.")
    preset = os.fspath(preset)
    if preset in ARCHITECTURE_PRESETS:
        if load_weights:
            raise ValueError(
                f"'{preset}' is the paper's untrained architecture: build it with "
                f"load_weights=False, or train it (keras-transformer train --preset {preset})."
            )
        check_safe_configs(PRESETS_DIR / preset)
        return PRESETS_DIR / preset, True
    handle = preset_handle(preset)
    if handle.startswith(HF_PREFIX):
        directory = hub_snapshot(handle, preset, load_weights)
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
        raise FileNotFoundError(f"There is no preset folder at '{preset}'.{interrupted_save_hint(Path(preset))}")
    names = available_presets()
    close = difflib.get_close_matches(preset, names, n=1)
    suggestion = f" Did you mean '{close[0]}'?" if close else ""
    raise ValueError(
        f"Unknown preset '{preset}'.{suggestion} Available presets: {', '.join(names)}; "
        "or give a preset folder or an hf://org/name handle."
    )


def check_hub_reachable(preset: str | os.PathLike, revision: str | None = None) -> None:
    """Fails at once when a hub preset is not cached and the Hub cannot be reached.

    huggingface_hub retries a request whose connection fails, five times with
    growing waits, before it gives up; one request without retries tells an
    unreachable Hub apart first. Cached presets, folders and offline mode
    (`HF_HUB_OFFLINE=1`) send nothing.

    Raises:
        HubUnreachableError: the preset's `config.json` is not cached and the
            Hub did not answer.
    """
    from huggingface_hub import constants, try_to_load_from_cache

    handle = preset_handle(preset)
    if not isinstance(handle, str) or not handle.startswith(HF_PREFIX) or constants.is_offline_mode():
        return
    repo_id = handle.removeprefix(HF_PREFIX)
    if try_to_load_from_cache(repo_id, CONFIG_FILE, revision=revision) is None and hub_unreachable(
        repo_id, CONFIG_FILE, revision
    ):
        raise _unreachable_hub_error(handle, os.fspath(preset))


def hub_unreachable(repo_id: str, filename: str, revision: str | None = None) -> bool:
    """Whether one request for `filename` of Hub repo `repo_id`, made without
    retries, fails to reach the Hub (any answer from it counts as reached)."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import HfHubHTTPError, HTTPError

    try:
        get_hf_file_metadata(hf_hub_url(repo_id, filename, revision=revision))
    except HfHubHTTPError:
        return False  # the Hub answered (e.g. no such file): the download reports it
    except HTTPError:
        return True  # no connection, or no answer in time
    return False


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
        raise NotOnHubError(
            f"The Hugging Face Hub has no repository {handle} (or it is private: log in with `hf auth login`)."
        ) from error
    except (LocalEntryNotFoundError, ConnectionError) as error:
        raise _unreachable_hub_error(handle, name) from error


def _unreachable_hub_error(handle: str, name: str) -> HubUnreachableError:
    """The error for a hub preset that is not cached while the hub cannot be
    reached, naming only what works offline: a download made once while
    online, or a local folder. Not `load_weights=False`: a Hub checkpoint's
    own config and tokenizer files are not shipped, so without the Hub it
    cannot be built even without weights."""
    shown = handle if name == handle else f"'{name}' ({handle})"
    return HubUnreachableError(
        f"Could not load preset {shown}: it is not in the local cache and the Hugging Face Hub "
        "could not be reached. Run the same call once while online: the files are then cached "
        "and load offline. Or load a local folder, written by transformers' save_pretrained (model "
        "and tokenizer) or by Transformer.save_to_preset: Transformer.from_preset('path/to/folder')."
    )


register_builtin_presets()
