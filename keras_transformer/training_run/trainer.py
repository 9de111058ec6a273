"""Training a `Transformer` into a run folder, as `keras-transformer train` does.

`Trainer` holds what a training run needs beyond `model.fit`: the recipe's
optimizer and loss (per update under gradient accumulation, token means
across replicas), the dtype policy and distribution strategy, resuming from
the run's last checkpoint, checkpoints every few minutes and/or steps, a
stop on NaN, validation every `valid_every` updates, the curves, TensorBoard
logs, and the epoch arithmetic that makes all of them count updates.

Example (token-id batches as `keras_transformer.training.data.token_batches`
makes them):

    trainer = Trainer("runs/en_de", TrainingRecipe(warmup_steps=2000), max_steps=8000)
    with trainer.scope():
        model = build_model(...)
        trainer.compile(model)
        step = trainer.resume(model)
        train = data.token_batches(pairs, 4000, repeat=True, seed=1 + step, batch_multiple=trainer.replicas)
        result = trainer.fit(model, train, step=step)
"""

import contextlib
import dataclasses
import importlib.util
import math
import os
import sys

import keras

from keras_transformer.training import checkpoints, distribution
from keras_transformer.training.callbacks import StopAtStep, TrainingMonitor, ValidationBleu
from keras_transformer.training.losses import LabelSmoothedCrossEntropy
from keras_transformer.training.metrics import MaskedAccuracy, TargetTokens
from keras_transformer.training.optimizer import recipe_optimizer
from keras_transformer.training.recipe import TrainingRecipe
from keras_transformer.training_run.folder import CHECKPOINT_DIR

CHECKPOINT_MINUTES = 10.0  # section 6.1: "checkpoints, which were written at 10-minute intervals"


@dataclasses.dataclass(frozen=True)
class TrainingResult:
    """What a `Trainer.fit` call reached."""

    step: int
    tokens_per_second: float
    last_checkpoint: str | None


class Trainer:
    """Trains a `Transformer` by a `TrainingRecipe` into a run folder, resuming where it stopped.

    One "epoch" of `fit` is `valid_every` updates: a validation (when there
    is validation data), a point of the curves and a line of the progress
    log. Steps count optimizer updates, also under gradient accumulation.

    Args:
        directory: the run folder: `checkpoints/`, `logs/` (TensorBoard),
            `curves.csv` and `training_curves.png` go there.
        recipe: the optimizer, schedule, label smoothing and accumulation.
        max_steps: the update at which training stops.
        valid_every: updates between validations and curve points.
        strategy: `"none"`, `"mirrored"` (TensorFlow) or `"jax-data-parallel"`,
            see `keras_transformer.training.distribution`.
        dtype: Keras' dtype policy while the model is built and trained
            (`"float32"`, `"mixed_bfloat16"`, `"mixed_float16"`).
        checkpoint_every_steps: save every this many updates (`None`: not by steps).
        checkpoint_every_minutes: save every this many minutes (`None`: not by time).
        keep_checkpoints: keep only the newest this many (`None`: all).
        valid_bleu_sentences: validation pairs translated greedily for the
            `val_bleu` curve at each validation (0: none).
        log_every: updates between TensorBoard scalars.
        chief: whether this process writes the run folder (one process of a
            multi-host run; the others train without writing).
        verbose: Keras' verbosity, 0, 1 or 2.
    """

    def __init__(
        self,
        directory: str,
        recipe: TrainingRecipe = TrainingRecipe(),
        *,
        max_steps: int,
        valid_every: int = 1000,
        strategy: str = "none",
        dtype: str = "float32",
        checkpoint_every_steps: int | None = None,
        checkpoint_every_minutes: float | None = CHECKPOINT_MINUTES,
        keep_checkpoints: int | None = None,
        valid_bleu_sentences: int = 200,
        log_every: int = 100,
        chief: bool = True,
        verbose: int = 1,
    ):
        if recipe.accumulate > 1 and strategy == "mirrored":
            # GlobalTokenMean weighs tokens across replicas, weight_by_update
            # across micro-batches; the two are not combined.
            raise ValueError(
                "gradient accumulation with the mirrored strategy is not supported: raise "
                "the tokens per batch instead, or use the jax-data-parallel strategy."
            )
        self.directory = directory
        self.recipe = recipe
        self.max_steps = max_steps
        self.valid_every = valid_every
        self.strategy = strategy
        self.dtype = dtype
        self.checkpoint_every_steps = checkpoint_every_steps
        self.checkpoint_every_minutes = checkpoint_every_minutes
        self.keep_checkpoints = keep_checkpoints
        self.valid_bleu_sentences = valid_bleu_sentences
        self.log_every = log_every
        self.chief = chief
        self.verbose = verbose
        self.replicas = 1

    @property
    def checkpoint_directory(self) -> str:
        return os.path.join(self.directory, CHECKPOINT_DIR)

    @contextlib.contextmanager
    def scope(self):
        """The dtype policy and the strategy's scope: build, compile and fit the model inside.

        The global policy (not only the backbone's) makes `compile` wrap the
        optimizer in a `LossScaleOptimizer` for `mixed_float16`; it is
        restored on leaving. `replicas` is the number of devices batches must
        split over evenly.
        """
        previous = keras.config.dtype_policy()
        keras.config.set_dtype_policy(self.dtype)
        try:
            with distribution.training_scope(self.strategy) as strategy_scope:
                self.replicas = distribution.num_replicas(strategy_scope)
                yield self
        finally:
            keras.config.set_dtype_policy(previous)

    def compile(self, model) -> None:
        """Compiles `model` with the recipe's optimizer and label-smoothed loss.

        Under accumulation the loss is a token sum that `fit` weights by the
        tokens of the whole update; under the mirrored strategy a token mean
        over all replicas.
        """
        backbone = model.backbone
        loss = LabelSmoothedCrossEntropy(
            self.recipe.label_smoothing,
            pad_token_id=backbone.pad_token_id,
            unsmoothed_ids=(backbone.pad_token_id, backbone.start_token_id, backbone.unk_token_id),
            **({"reduction": "sum"} if self.recipe.accumulate > 1 else {}),
        )
        if self.strategy == "mirrored":
            loss = distribution.GlobalTokenMean(loss)
        model.compile(
            optimizer=recipe_optimizer(self.recipe, backbone.hidden_dim),
            loss=loss,
            weighted_metrics=[MaskedAccuracy(pad_token_id=backbone.pad_token_id), TargetTokens(backbone.pad_token_id)],
        )

    def resume(self, model) -> int:
        """Restores the run's last checkpoint into the compiled `model`; returns its step (0 if none)."""
        last = checkpoints.latest_checkpoint(self.checkpoint_directory)
        if last is None:
            return 0
        step = checkpoints.restore_checkpoint(model, last)
        print(f"resuming from {last} at step {step}.")
        return step

    def fit(
        self,
        model,
        train_data,
        valid_data=None,
        *,
        step: int = 0,
        valid_texts=None,
        callbacks=(),
        per_process: bool = False,
    ) -> TrainingResult:
        """Trains the compiled `model` from update `step` to `max_steps`.

        Args:
            model: a `Transformer` compiled by `compile` (and resumed by `resume`).
            train_data: endless `(x, labels, sample_weight)` batches of token
                ids, as `data.token_batches` makes them or the model's
                preprocessor mapped over batches of text gives them: a
                `tf.data.Dataset` (needed for accumulation and strategies), or
                any input of `keras.Model.fit`, e.g. a generator.
            valid_data: finite validation batches of the same form, or `None`.
            step: the update training starts from (`resume`'s).
            valid_texts: `(sources, references)` for the `val_bleu` curve.
            callbacks: more Keras callbacks.
            per_process: `train_data` holds only this process's share of the
                data (`prepared_batches` of its own shards), not the same
                batches as every other process: see
                `distribution.prepare_dataset`.

        Returns:
            The `TrainingResult`.

        Raises:
            ValueError: the loss became NaN or infinite (the last good
                checkpoint is kept).
        """
        train_data, valid_data = self._training_data(train_data, per_process), self._validation_data(valid_data)
        saver = checkpoints.PeriodicCheckpoint(
            self.checkpoint_directory,
            every_steps=self.checkpoint_every_steps,
            every_minutes=self.checkpoint_every_minutes,
            keep=self.keep_checkpoints,
        )
        nan_guard = checkpoints.StopOnNaN(saver)
        monitor = TrainingMonitor(self.directory if self.chief else None)
        trainer_callbacks = [nan_guard, StopAtStep(self.max_steps)]
        if self.chief:
            trainer_callbacks.insert(0, saver)
        if self.chief and valid_texts and self.valid_bleu_sentences:
            trainer_callbacks.append(ValidationBleu(*valid_texts, max_sentences=self.valid_bleu_sentences))
        trainer_callbacks.append(monitor)  # after ValidationBleu, whose val_bleu it writes into the curves
        if self.chief:
            trainer_callbacks += self._tensorboard()
        initial_epoch = step // self.valid_every
        if step < self.max_steps:
            # The batches are token ids, which need no preprocessing: Keras'
            # own fit, which KerasHub's (tf.data or grain preprocessing) would
            # only wrap.
            keras.Model.fit(
                model,
                train_data,
                validation_data=valid_data,
                steps_per_epoch=self.valid_every * self.recipe.accumulate,
                initial_epoch=initial_epoch,
                epochs=initial_epoch + math.ceil((self.max_steps - step) / self.valid_every),
                callbacks=trainer_callbacks + list(callbacks),
                verbose=self.verbose,
                shuffle=False,  # the batches come in their own order
            )
        if nan_guard.message:
            raise ValueError(nan_guard.message)
        return TrainingResult(
            step=int(keras.ops.convert_to_numpy(model.optimizer.iterations)),
            tokens_per_second=monitor.tokens_per_second,
            last_checkpoint=saver.last_path,
        )

    def evaluate(self, model, valid_data) -> dict[str, float]:
        """Validation loss and metrics as `fit` logs them: the loss is a token mean, with accumulation too."""
        return keras.Model.evaluate(model, self._validation_data(valid_data), verbose=0, return_dict=True)

    def _training_data(self, train_data, per_process: bool):
        """Weights for accumulation and the strategy's split over devices."""
        if not _is_tf_dataset(train_data):
            self._check_plain_data_is_enough(train_data)
            return train_data
        # With accumulation's summed loss: each token weighs 1 / (tokens of its update).
        return distribution.prepare_dataset(
            train_data, self.strategy, per_process=per_process, micro_batches=self.recipe.accumulate
        )

    def _validation_data(self, valid_data):
        """As `_training_data`, and with its number of batches known."""
        if valid_data is None:
            return None
        if not _is_tf_dataset(valid_data):
            self._check_plain_data_is_enough(valid_data)
            return valid_data
        from keras_transformer.training import data

        if self.recipe.accumulate > 1:
            # With the summed loss: each token weighs 1 / (tokens of its
            # batch), which makes val_loss the token mean a run without
            # accumulation logs (not a sum over each batch's tokens).
            valid_data = data.weight_by_update(valid_data, 1)
        return data.with_batch_count(distribution.prepare_dataset(valid_data, self.strategy))

    def _check_plain_data_is_enough(self, batches) -> None:
        if self.recipe.accumulate > 1 or self.strategy != "none":
            raise ValueError(
                "gradient accumulation and distribution strategies need the batches as a tf.data.Dataset "
                f"(keras_transformer.training.data.token_batches); got {type(batches).__name__}."
            )

    def _tensorboard(self) -> list[keras.callbacks.Callback]:
        if not importlib.util.find_spec("tensorboard"):
            print("TensorBoard is not installed (pip install tensorboard): no TensorBoard logs.")
            return []
        return [
            keras.callbacks.TensorBoard(
                os.path.join(self.directory, "logs"), update_freq=self.log_every * self.recipe.accumulate
            )
        ]


def _is_tf_dataset(value) -> bool:
    # Without TensorFlow imported there is no tf.data.Dataset (a machine may lack TensorFlow).
    tensorflow = sys.modules.get("tensorflow")
    return tensorflow is not None and isinstance(value, tensorflow.data.Dataset)
