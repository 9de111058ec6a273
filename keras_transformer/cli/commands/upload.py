"""Upload a preset folder to the Hugging Face Hub, with its own model card.

The folder is verified first (every file against the checksums saved in its
metadata.json, and its configs for safety); a damaged preset is refused. Its
README.md is the model card that gets uploaded. This uses huggingface_hub
directly: KerasHub's `upload_preset` replaces a missing remote card with a
generic KerasHub one. Log in first with `hf auth login` (or set HF_TOKEN).

Example:
    keras-transformer upload presets/multi30k_en_de hf://my-name/multi30k_en_de
"""

import argparse
import sys
from pathlib import Path

from keras_transformer.utils.library_internals import HF_PREFIX, README_FILE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("preset_dir", help="a preset folder saved by Transformer.save_to_preset")
    parser.add_argument("handle", help="where to upload: hf://user/name (or hf://name for your account)")
    parser.add_argument("--private", action="store_true", help="create the repository as private")
    parser.add_argument("--message", default=None, help="commit message (default: 'Upload <name>')")


def parse_handle(handle: str) -> str:
    """`hf://user/name` to the repository id `user/name`."""
    from keras_transformer.utils.errors import UserError

    repo_id = handle.removeprefix(HF_PREFIX)
    parts = repo_id.split("/")
    if not handle.startswith(HF_PREFIX) or len(parts) > 2 or not all(parts):
        raise UserError(f"The destination must look like hf://user/name or hf://name; got '{handle}'.")
    return repo_id


def upload(preset_dir: str | Path, handle: str, private: bool = False, message: str | None = None) -> str:
    """Verifies a preset folder and uploads it; returns the repository id."""
    import huggingface_hub

    from keras_transformer.presets.integrity import verify_preset

    repo_id = parse_handle(handle)
    directory = Path(preset_dir)
    if not directory.is_dir():
        raise FileNotFoundError(f"There is no preset folder at '{preset_dir}'.")
    verify_preset(directory, load_weights=True, require_checksums=True)
    if not (directory / README_FILE).is_file():
        raise FileNotFoundError(
            f"{directory} has no {README_FILE} model card; save it with Transformer.save_to_preset "
            "(which writes one) or write one describing the model, its data and its scores."
        )
    repo = huggingface_hub.create_repo(repo_id, private=private, exist_ok=True)
    huggingface_hub.upload_folder(
        repo_id=repo.repo_id,
        folder_path=str(directory),
        commit_message=message or f"Upload {directory.name}",
    )
    return repo.repo_id


def run(args: argparse.Namespace) -> int:
    repo_id = upload(args.preset_dir, args.handle, private=args.private, message=args.message)
    print(f"Uploaded {args.preset_dir} to hf://{repo_id}", file=sys.stderr)
    return 0
