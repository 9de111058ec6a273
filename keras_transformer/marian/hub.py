"""The files of a `transformers` checkpoint: a local folder or a Hub repo.

Hub files come from huggingface_hub's cache when it has them (so loading
works offline, with `HF_HUB_OFFLINE=1`), else they are downloaded one by one,
`config.json` first: a checkpoint that cannot be converted is refused
before anything large is downloaded.
"""

import json
from pathlib import Path

from keras_transformer.presets.resolution import HubUnreachableError, NotOnHubError, hub_unreachable, preset_handle
from keras_transformer.utils.library_internals import HF_PREFIX

CONFIG_FILE = "config.json"


class CheckpointFiles:
    """Fetches the files of one checkpoint by name.

    Args:
        handle: `hf://org/name`, a registered name that stands for one
            (`"base_en_de"`), or a local folder.
        revision: a branch, tag or commit of a Hub repo (`None`: main).
    """

    def __init__(self, handle: str, revision: str | None = None):
        self.preset = str(handle)
        self.handle = preset_handle(self.preset)
        self.revision = revision
        self.repo_id = self.handle.removeprefix(HF_PREFIX) if self.is_hub else None
        self._hub_answered = False
        if not self.is_hub and not Path(self.handle).is_dir():
            raise FileNotFoundError(f"There is no checkpoint folder at '{self.handle}'.")

    @property
    def is_hub(self) -> bool:
        return self.handle.startswith(HF_PREFIX)

    @property
    def name(self) -> str:
        """How errors name the checkpoint."""
        name = self.handle if self.preset == self.handle else f"'{self.preset}' ({self.handle})"
        return f"{name} (revision {self.revision})" if self.is_hub and self.revision else name

    def config(self) -> dict:
        path = self(CONFIG_FILE)
        if path is None:
            raise FileNotFoundError(f"{self.name} has no {CONFIG_FILE}.")
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"{CONFIG_FILE} of {self.name} is not valid JSON ({error}).") from error

    def __call__(self, name: str, download: bool = True) -> Path | None:
        """The local path of file `name`, or `None` if the checkpoint lacks it.

        With `download=False`, only whether it exists: nothing is downloaded.

        Raises:
            HubUnreachableError: not cached, and the Hub cannot be asked.
            NotOnHubError: no such repository or revision.
        """
        if not self.is_hub:
            path = Path(self.handle) / name
            return path if path.is_file() else None
        from huggingface_hub import file_exists, hf_hub_download
        from huggingface_hub.errors import (
            EntryNotFoundError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        try:
            return Path(hf_hub_download(self.repo_id, name, revision=self.revision, local_files_only=True))
        except LocalEntryNotFoundError:
            pass  # not cached
        except EntryNotFoundError:
            return None  # cached as absent
        try:
            if not self._hub_reachable(name):
                raise LocalEntryNotFoundError("offline or unreachable")
            if not download:
                return Path(name) if file_exists(self.repo_id, name, revision=self.revision) else None
            return Path(hf_hub_download(self.repo_id, name, revision=self.revision))
        except LocalEntryNotFoundError as error:
            raise HubUnreachableError(
                f"Could not load {self.name}: its {name} is not in the local cache and the Hugging "
                "Face Hub could not be reached. Run the same call once while online: the files are "
                "then cached and load offline. Or load a local folder written by transformers' "
                "save_pretrained (model and tokenizer)."
            ) from error
        except (RepositoryNotFoundError, RevisionNotFoundError) as error:
            raise NotOnHubError(
                f"The Hugging Face Hub has no repository {self.name} (or it is private: log in with `hf auth login`)."
            ) from error
        except EntryNotFoundError:
            return None

    def _hub_reachable(self, name: str) -> bool:
        """Whether the Hub may be asked: not in offline mode, and it answered
        one request for `name` made without huggingface_hub's retries (which
        spend long waits on a network that is down)."""
        from huggingface_hub import constants

        if constants.is_offline_mode():
            return False
        self._hub_answered = self._hub_answered or not hub_unreachable(self.repo_id, name, self.revision)
        return self._hub_answered
