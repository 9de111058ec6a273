"""Checkpoints by steps and by wall-clock minutes, resuming, and averaging.

A checkpoint is one `.npz` file holding the model weights, the optimizer's
variables (its step counter, Adam moments, gradient accumulators) and the
step, so a killed run resumes where it stopped, with the same learning rate
(the schedule is a function of the optimizer's step). Keras'
`ModelCheckpoint` saves by epochs or batches but not by minutes, and
`model.save_weights` leaves the optimizer out; hence this module.

Files are written atomically: to a temporary file in the same folder,
flushed to disk, then renamed over the final name, so a crash mid-write never
leaves a truncated checkpoint behind.

Example:
>>> import tempfile, numpy as np, keras
>>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
>>> model.compile("adam", "mse")
>>> _ = model.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0)
>>> folder = tempfile.mkdtemp()
>>> path = save_checkpoint(model, folder)
>>> restore_checkpoint(model, path)
1
"""

import glob
import os
import re
import time

import keras
import numpy as np

from keras_transformer.utils import library_internals
from keras_transformer.utils.files import file_replaced_atomically

CHECKPOINT_PATTERN = re.compile(r"ckpt-(\d+)\.npz$")


def checkpoint_path(directory: str, step: int) -> str:
    return os.path.join(directory, f"ckpt-{step:08d}.npz")


def list_checkpoints(directory: str) -> list[str]:
    """Checkpoint files of `directory`, oldest (lowest step) first."""
    paths = [p for p in glob.glob(os.path.join(directory, "ckpt-*.npz")) if CHECKPOINT_PATTERN.search(p)]
    return sorted(paths, key=lambda p: int(CHECKPOINT_PATTERN.search(p).group(1)))


def latest_checkpoint(directory: str) -> str | None:
    paths = list_checkpoints(directory)
    return paths[-1] if paths else None


def save_checkpoint(model: keras.Model, directory: str, keep: int | None = None) -> str:
    """Writes model weights, optimizer state and step atomically.

    Args:
        model: a compiled model.
        directory: where checkpoints go (created if needed).
        keep: delete all but the newest `keep` checkpoints (`None` keeps all);
            at least 1, the checkpoint just written.

    Returns:
        The checkpoint's path.
    """
    _check_keep(keep)
    os.makedirs(directory, exist_ok=True)
    optimizer = model.optimizer
    step = int(keras.ops.convert_to_numpy(optimizer.iterations))
    arrays = {f"model/{i:05d}": w for i, w in enumerate(model.get_weights())}
    optimizer_store = {}
    optimizer.save_own_variables(optimizer_store)
    arrays.update({f"optimizer/{int(i):05d}": np.asarray(v) for i, v in optimizer_store.items()})
    arrays["step"] = np.asarray(step, "int64")
    path = checkpoint_path(directory, step)
    _atomic_savez(path, arrays)
    if keep is not None:
        for old in list_checkpoints(directory)[:-keep]:
            os.remove(old)
    return path


def _check_keep(keep: int | None) -> None:
    if keep is not None and (not isinstance(keep, int) or keep < 1):
        raise ValueError(f"keep must be None (keep every checkpoint) or at least 1; got {keep!r}.")


def _atomic_savez(path: str, arrays: dict) -> None:
    with file_replaced_atomically(path, "wb") as f:
        np.savez(f, **arrays)


def _sorted_arrays(data, prefix: str) -> list[np.ndarray]:
    keys = sorted(k for k in data.files if k.startswith(prefix))
    return [data[k] for k in keys]


def load_weights(path: str) -> list[np.ndarray]:
    """The model weights of a checkpoint, in `model.get_weights()` order."""
    with np.load(path) as data:
        return _sorted_arrays(data, "model/")


def restore_checkpoint(model: keras.Model, path: str) -> int:
    """Loads weights, optimizer state and step into a compiled model.

    Returns:
        The step the checkpoint was saved at.
    """
    with np.load(path) as data:
        model.set_weights(_sorted_arrays(data, "model/"))
        optimizer = model.optimizer
        if not optimizer.built:
            optimizer.build(model.trainable_variables)
        values = _sorted_arrays(data, "optimizer/")
        if len(values) != len(optimizer.variables):
            raise ValueError(
                f"{path} holds {len(values)} optimizer variables but the optimizer has "
                f"{len(optimizer.variables)}: was it saved with another optimizer or "
                "--accumulate setting?"
            )
        optimizer.load_own_variables({str(i): v for i, v in enumerate(values)})
        return int(data["step"])


def average_checkpoints(paths: list[str]) -> list[np.ndarray]:
    """The element-wise mean of the model weights of several checkpoints.

    Section 6.1: the base model averages the last 5 checkpoints, the big one
    the last 20. Integer weights (if any) keep the last checkpoint's value.

    Example:
    >>> import tempfile, numpy as np, os
    >>> folder = tempfile.mkdtemp()
    >>> for step, value in [(1, 1.0), (2, 3.0)]:
    ...     _atomic_savez(checkpoint_path(folder, step), {"model/00000": np.full(2, value)})
    >>> average_checkpoints(list_checkpoints(folder))[0]
    array([2., 2.])
    """
    if not paths:
        raise ValueError("No checkpoints to average.")
    total = None
    for path in paths:
        weights = load_weights(path)
        if total is None:
            total = [w.astype("float64") if np.issubdtype(w.dtype, np.floating) else w for w in weights]
            continue
        if len(weights) != len(total):
            raise ValueError(f"{path} holds {len(weights)} weights, {paths[0]} holds {len(total)}.")
        for i, w in enumerate(weights):
            total[i] = total[i] + w if np.issubdtype(w.dtype, np.floating) else w
    return [
        (t / len(paths)).astype(w.dtype) if np.issubdtype(w.dtype, np.floating) else t
        for t, w in zip(total, load_weights(paths[-1]))
    ]


class PeriodicCheckpoint(keras.callbacks.Callback):
    """Saves a checkpoint every `every_steps` steps and/or `every_minutes`.

    The paper wrote a checkpoint every 10 minutes and averaged the last few.
    Steps are optimizer updates (`optimizer.iterations`), so they stay right
    across restarts and with gradient accumulation. A checkpoint is also
    written when training ends, unless the last loss was NaN or infinite: a
    checkpoint is never written from a diverged model.

    Under gradient accumulation a checkpoint is written only between updates:
    one falling due within a group of micro-batches waits for the group's
    end. A run resuming from it then starts a new group where its batches
    start their next update (`weight_by_update` weighs each group by its own
    tokens), instead of finishing a group begun before the stop.

    Args:
        directory: where checkpoints go.
        every_steps: save when the step is a multiple of this.
        every_minutes: save when this many minutes passed since the last save.
        keep: keep only the newest `keep` checkpoints (`None`: all).
    """

    def __init__(
        self,
        directory: str,
        every_steps: int | None = None,
        every_minutes: float | None = None,
        keep: int | None = None,
    ):
        super().__init__()
        if not every_steps and not every_minutes:
            raise ValueError("Give every_steps, every_minutes or both.")
        _check_keep(keep)
        self.directory = directory
        self.every_steps = every_steps
        self.every_minutes = every_minutes
        self.keep = keep
        self.last_saved_step = None
        self.last_path = latest_checkpoint(directory) if os.path.isdir(directory) else None
        self._last_time = time.monotonic()
        self._healthy = True

    def _step(self) -> int:
        return int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

    def _save(self):
        step = self._step()
        if step == self.last_saved_step or library_internals.micro_batches_since_update(self.model.optimizer):
            return
        self.last_path = save_checkpoint(self.model, self.directory, self.keep)
        self.last_saved_step = step
        self._last_time = time.monotonic()

    def on_train_begin(self, logs=None):
        # A run killed mid-save leaves its temporary file behind (a whole
        # checkpoint's size); the run resuming in this folder owns it.
        for stale in glob.glob(os.path.join(self.directory, ".ckpt-*.partial-*")):
            os.remove(stale)
        self._last_time = time.monotonic()
        self.last_saved_step = self._step()

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not np.isfinite(float(loss)):
            self._healthy = False
            return
        step = self._step()
        by_steps = self.every_steps and step % self.every_steps == 0
        by_time = self.every_minutes and time.monotonic() - self._last_time >= 60 * self.every_minutes
        if by_steps or by_time:
            self._save()

    def on_train_end(self, logs=None):
        if self._healthy:
            self._save()


class StopOnNaN(keras.callbacks.TerminateOnNaN):
    """Stops training at the first NaN or infinite loss, and says why.

    Keras' `TerminateOnNaN` stops with a one-line note; this one also records
    the step (`stopped_step`) and names the last good checkpoint, so a command
    can report it and exit with an error. Put it after `PeriodicCheckpoint`,
    which never saves a diverged model.

    Args:
        checkpoints: the run's `PeriodicCheckpoint`, to name its last file.
    """

    def __init__(self, checkpoints: PeriodicCheckpoint | None = None):
        super().__init__()
        self.checkpoints = checkpoints
        self.stopped_step = None
        self.message = None

    def on_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is None or np.isfinite(float(loss)):
            return
        self.stopped_step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        last = self.checkpoints.last_path if self.checkpoints else None
        self.message = (
            f"training stopped at step {self.stopped_step}: the loss is {float(loss)}. "
            + (f"The last good checkpoint is {last}; " if last else "No checkpoint was written; ")
            + "lower the learning rate or use more warmup steps, and resume."
        )
        print(self.message)
        self.model.stop_training = True
