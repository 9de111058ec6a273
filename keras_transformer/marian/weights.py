"""Reading a Marian checkpoint's tensors without running any of its code.

`transformers` stores Marian weights in one of four files:

- `model.safetensors`, or shards listed in `model.safetensors.index.json`:
  read with the `safetensors` NumPy API (a header and raw arrays);
- `tf_model.h5`, written by the TensorFlow classes (several Opus-MT base
  repos have no safetensors on their main branch): read with h5py, Dense
  kernels transposed from `[in, out]` to PyTorch's `[out, in]`;
- `pytorch_model.bin`: a pickle, which can run arbitrary code when loaded.
  It is never opened; a repo with only that file is refused, with the ways
  to get safetensors.

Every reader returns the same thing: a dict from PyTorch weight names
(`model.encoder.layers.0.fc1.weight`, ...) to NumPy arrays in PyTorch's
layout, so that one mapping serves all files.
"""

import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TF_WEIGHTS = "tf_model.h5"
PICKLE_WEIGHTS = "pytorch_model.bin"
# In the order they are preferred; the pickle is only named, never read.
WEIGHT_FILES = (SAFETENSORS, SAFETENSORS_INDEX, TF_WEIGHTS)

# A TensorFlow weight path, e.g.
# model/tf_marian_mt_model/model/encoder/layers.0/self_attn/q_proj/kernel:0
_TF_LAYER = re.compile(
    r"(?:^|/)(encoder|decoder)/layers\.(\d+)/"
    r"((?:self_attn|encoder_attn)/(?:q|k|v|out)_proj|fc1|fc2|"
    r"self_attn_layer_norm|encoder_attn_layer_norm|final_layer_norm)/"
    r"(kernel|bias|gamma|beta):0$"
)
_TF_LEAVES = {"kernel": "weight", "gamma": "weight", "bias": "bias", "beta": "bias"}
# The shared embedding was saved as ".../model.shared/weight:0" or ".../embeddings:0".
_TF_SHARED = re.compile(r"(?:^|/)(?:model\.)?shared/(?:weight|embeddings):0$")
_TF_LOGITS_BIAS = re.compile(r"(?:^|/)final_logits_bias:0$")


class PickleOnlyError(FileNotFoundError):
    """The checkpoint's weights exist only as a pickle, which is never loaded."""


def refuse_pickle(repo: str) -> PickleOnlyError:
    return PickleOnlyError(
        f"{repo} has its weights only in {PICKLE_WEIGHTS}, a pickle, which keras-transformer never "
        "loads because unpickling can run arbitrary code. Load a revision of the repo that has "
        f"{SAFETENSORS} (e.g. revision='refs/pr/N' of its safetensors conversion pull request), or "
        "convert it yourself with transformers: MarianMTModel.from_pretrained(...)"
        ".save_pretrained(folder, safe_serialization=True), then load that folder."
    )


def read_weights(fetch: Callable[..., Path | None], repo: str) -> dict[str, np.ndarray]:
    """All tensors of a checkpoint, by PyTorch name, in `[out, in]` layout.

    Args:
        fetch: `fetch(name, download=True)` gives the local path of a file
            of the checkpoint, downloading it if needed, or `None` if the
            checkpoint has no such file; it may raise `ConnectionError` when
            that cannot be known (offline, not cached). With
            `download=False` it only says whether the file exists (not
            `None`). Files are asked for in order of preference, so only
            the weights file used is downloaded.
        repo: how to name the checkpoint in errors.

    Raises:
        PickleOnlyError: only `pytorch_model.bin` is there (it is never opened).
        FileNotFoundError: no weights file at all.
    """
    unreachable = None
    for name in WEIGHT_FILES:
        try:
            path = fetch(name)
        except ConnectionError as error:  # not cached, and the hub cannot be asked
            unreachable = unreachable or error
            continue
        if path is None:
            continue
        if name == SAFETENSORS:
            return _read_safetensors([path])
        if name == SAFETENSORS_INDEX:
            index = json.loads(path.read_text(encoding="utf-8"))
            shards = sorted(set(index["weight_map"].values()))
            return _read_safetensors([_required(fetch, shard, repo) for shard in shards])
        return _read_tf_h5(path)
    try:
        has_pickle = fetch(PICKLE_WEIGHTS, download=False) is not None
    except ConnectionError:
        has_pickle = False
    if has_pickle:
        raise refuse_pickle(repo)
    if unreachable is not None:
        raise unreachable
    raise FileNotFoundError(f"{repo} has no weights file keras-transformer can read ({', '.join(WEIGHT_FILES)}).")


def _required(fetch, name: str, repo: str) -> Path:
    path = fetch(name)
    if path is None:
        raise FileNotFoundError(f"{repo} lists the shard {name} in {SAFETENSORS_INDEX}, but it is missing.")
    return path


def _read_safetensors(paths: list[Path]) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    tensors = {}
    for path in paths:
        tensors.update(load_file(path))
    return tensors


def _read_tf_h5(path: Path) -> dict[str, np.ndarray]:
    """`tf_model.h5` (Keras 2 `save_weights` HDF5) by PyTorch name."""
    import h5py

    tensors = {}

    def visit(name, item):
        if not isinstance(item, h5py.Dataset):
            return
        if match := _TF_LAYER.search(name):
            stack, index, module, leaf = match.groups()
            value = np.asarray(item)
            if leaf == "kernel":
                value = value.T  # Keras Dense: [in, out]; PyTorch Linear: [out, in]
            module = module.replace("/", ".")
            tensors[f"model.{stack}.layers.{index}.{module}.{_TF_LEAVES[leaf]}"] = value
        elif _TF_SHARED.search(name):
            tensors["model.shared.weight"] = np.asarray(item)
        elif _TF_LOGITS_BIAS.search(name):
            tensors["final_logits_bias"] = np.asarray(item)
        # Anything else (the position tables TensorFlow stored) is recomputed.

    with h5py.File(path, "r") as file:
        file.visititems(visit)
    return tensors
