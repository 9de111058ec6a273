"""Watching a training run: tokens per second, learning rate, curves.

Example:
>>> import tempfile, numpy as np, keras
>>> from keras_transformer.training import TargetTokens
>>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(5)])
>>> model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
...               weighted_metrics=[TargetTokens()])
>>> monitor = TrainingMonitor(tempfile.mkdtemp())
>>> history = model.fit(np.ones((4, 3)), np.array([1, 2, 3, 0]), batch_size=2,
...                     epochs=2, shuffle=False, callbacks=[monitor], verbose=0)
>>> monitor.total_tokens  # non-padding labels of each epoch's 2nd batch (the 1st is not timed)
2
"""

import csv
import os
import time

import keras
import numpy as np
from keras import ops

from keras_transformer.utils import library_internals
from keras_transformer.utils.files import file_replaced_atomically

CURVES_CSV = "curves.csv"
CURVES_PNG = "training_curves.png"


def current_learning_rate(optimizer) -> float:
    """The learning rate the optimizer uses at its current step."""
    # A LossScaleOptimizer (mixed_float16) holds the schedule in its inner one.
    return library_internals.current_learning_rate(getattr(optimizer, "inner_optimizer", optimizer))


class TrainingMonitor(keras.callbacks.Callback):
    """Adds `learning_rate` and `tokens_per_second` to the logs; draws curves.

    Put it before Keras' progress bar and `TensorBoard` (any place in the
    `callbacks` list does: Keras appends its progress bar last), so that both
    show the two numbers. Tokens are target tokens, counted by the
    `TargetTokens` metric, per second of training time, the first step
    (compilation) left out.

    At each epoch end it appends the step, losses, learning rate and
    throughput to `curves.csv` in `directory` (so curves survive restarts)
    and redraws `training_curves.png`: training and validation loss, and any
    validation BLEU logged as `val_bleu`, against the step.

    Args:
        directory: where `curves.csv` and `training_curves.png` go; `None`
            writes nothing (e.g. on all but one process of a multi-host run).
        plot: `False` to skip the PNG (needs matplotlib).
    """

    def __init__(self, directory: str | None, plot: bool = True):
        super().__init__()
        self.directory = directory
        self.plot = plot
        self.total_tokens = 0
        self.total_seconds = 0.0
        self._epoch_tokens = 0.0
        self._last_time = None

    @property
    def tokens_per_second(self) -> float:
        return self.total_tokens / self.total_seconds if self.total_seconds else 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_tokens = 0.0
        self._last_time = None

    def on_train_batch_end(self, batch, logs=None):
        if logs is None:
            return
        now = time.perf_counter()
        tokens = float(logs.get("target_tokens", 0.0))
        if self._last_time is not None:
            # Time from the previous batch end; the first step of an epoch
            # (compilation, pipeline warm-up) is left out.
            self.total_seconds += now - self._last_time
            self.total_tokens += int(tokens - self._epoch_tokens)
        self._epoch_tokens = tokens
        self._last_time = now
        logs["learning_rate"] = current_learning_rate(self.model.optimizer)
        logs["tokens_per_second"] = round(self.tokens_per_second, 1)

    def on_epoch_end(self, epoch, logs=None):
        logs = logs if logs is not None else {}
        # Per epoch, the token counts say nothing the throughput doesn't
        # (and Keras' validation resets the shared metric).
        logs.pop("target_tokens", None)
        logs.pop("val_target_tokens", None)
        logs["learning_rate"] = current_learning_rate(self.model.optimizer)
        logs["tokens_per_second"] = round(self.tokens_per_second, 1)
        row = {
            "step": int(ops.convert_to_numpy(self.model.optimizer.iterations)),
            **{k: float(v) for k, v in logs.items() if np.ndim(v) == 0},
        }
        if self.directory is None:
            return
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, CURVES_CSV)
        rows = read_curves(path) + [row]
        fields = list(dict.fromkeys(k for r in rows for k in r))
        with file_replaced_atomically(path) as f:
            writer = csv.DictWriter(f, fields)
            writer.writeheader()
            writer.writerows(rows)
        if self.plot:
            plot_curves(rows, os.path.join(self.directory, CURVES_PNG))


def read_curves(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(f)]


def plot_curves(rows: list[dict], path: str) -> None:
    """Training and validation loss (and validation BLEU) against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, loss_axis = plt.subplots(figsize=(7, 4))
    for key, label in (("loss", "training loss"), ("val_loss", "validation loss")):
        points = [(r["step"], r[key]) for r in rows if key in r]
        if points:
            loss_axis.plot(*zip(*points), marker=".", label=label)
    loss_axis.set_xlabel("step")
    loss_axis.set_ylabel("label-smoothed cross entropy")
    bleu = [(r["step"], r["val_bleu"]) for r in rows if "val_bleu" in r]
    if bleu:
        bleu_axis = loss_axis.twinx()
        bleu_axis.plot(*zip(*bleu), color="tab:green", marker=".", label="validation BLEU")
        bleu_axis.set_ylabel("BLEU")
        bleu_axis.legend(loc="upper center")
    loss_axis.legend(loc="upper right")
    figure.tight_layout()
    figure.savefig(path + ".tmp.png", dpi=100)
    plt.close(figure)
    os.replace(path + ".tmp.png", path)


class ValidationBleu(keras.callbacks.Callback):
    """Logs `val_bleu` at every epoch end: sacreBLEU of validation translations.

    For watching training, so it is cheap by default: the first
    `max_sentences` validation pairs, greedy search. `keras-transformer
    evaluate` gives the real score (beam search, the whole test set). Put it
    before `TrainingMonitor`, which writes `val_bleu` into the curves.

    Args:
        sources: validation source sentences.
        references: their reference translations.
        max_sentences: how many of them to translate.
        beam_size: `None` for greedy search, or a beam size.
    """

    def __init__(
        self, sources: list[str], references: list[str], max_sentences: int = 200, beam_size: int | None = None
    ):
        super().__init__()
        self.sources = list(sources[:max_sentences])
        self.references = list(references[:max_sentences])
        self.beam_size = beam_size

    def on_epoch_end(self, epoch, logs=None):
        from keras_transformer.evaluation.bleu import evaluate_translations

        if logs is None or not self.sources:
            return
        translations = self.model.translate(self.sources, beam_size=self.beam_size, verbose=0)
        logs["val_bleu"] = evaluate_translations(translations, self.references).bleu


class StopAtStep(keras.callbacks.Callback):
    """Stops training once the optimizer has made `max_steps` updates."""

    def __init__(self, max_steps: int):
        super().__init__()
        self.max_steps = max_steps

    def on_train_batch_end(self, batch, logs=None):
        if int(ops.convert_to_numpy(self.model.optimizer.iterations)) >= self.max_steps:
            self.model.stop_training = True
