"""Trains a run folder from its recorded batches, on any Keras backend.

The second half of `tools/prepare_batches.py`: on a machine with JAX or
PyTorch and no TensorFlow (a GPU box), it trains the run with the train
command's model, optimizer, schedule, loss, checkpoints and curves (run.json's
options), feeding the recorded batches in their recorded order. It resumes
from the run's last checkpoint, and at the end writes the element-wise mean of
the last --average checkpoints (section 6.1) to RUN_DIR/averaged.npz, which
`keras-transformer average`'s model reads like a checkpoint.

    KERAS_BACKEND=jax python tools/train_from_batches.py RUN_DIR --average 10
"""

import argparse
import json
import math
import os
import time

import keras
import numpy as np

from keras_transformer.cli.commands.train import compile_model
from keras_transformer.models.transformer import Transformer
from keras_transformer.models.transformer_backbone import TransformerBackbone
from keras_transformer.training.run_folder import CHECKPOINT_DIR, RUN_FILE
from keras_transformer.utils.special_tokens import END_ID, PAD_ID, START_ID
from keras_transformer.training import checkpoints
from keras_transformer.training.callbacks import StopAtStep, TrainingMonitor

AVERAGED_FILE = "averaged.npz"


class RecordedBatches:
    """The batches of one split of batches.npz, as the train command feeds them."""

    def __init__(self, arrays, split: str):
        get = lambda key: arrays[f"{split}/{key}"]  # noqa: E731
        self.sources = np.split(get("source_ids"), get("source_splits")[1:-1])
        self.targets = np.split(get("target_ids"), get("target_splits")[1:-1])
        self.pairs = np.split(get("pairs"), np.cumsum(get("sizes"))[:-1])
        self.encoder_lengths = get("encoder_lengths")
        self.decoder_lengths = get("decoder_lengths")

    def __len__(self) -> int:
        return len(self.pairs)

    def batch(self, index: int):
        """`(x, labels, sample_weight)` as `data.token_batches` makes them."""
        members = self.pairs[index]
        encoder = np.full((len(members), self.encoder_lengths[index]), PAD_ID, "int32")
        decoder = np.full((len(members), self.decoder_lengths[index]), PAD_ID, "int32")
        labels = np.full_like(decoder, PAD_ID)
        for row, pair in enumerate(members):
            source, target = self.sources[pair], self.targets[pair]
            encoder[row, : len(source) + 2] = [START_ID, *source, END_ID]
            decoder[row, : len(target) + 1] = [START_ID, *target]
            labels[row, : len(target) + 1] = [*target, END_ID]
        x = {
            "encoder_token_ids": encoder,
            "encoder_padding_mask": encoder != PAD_ID,
            "decoder_token_ids": decoder,
            "decoder_padding_mask": decoder != PAD_ID,
        }
        return x, labels, (labels != PAD_ID).astype("float32")


class ValidationBatches(keras.utils.PyDataset):
    def __init__(self, batches: RecordedBatches):
        super().__init__()
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int):
        return self.batches.batch(index)


class StopAtDeadline(keras.callbacks.Callback):
    """Stops after `minutes` of training; the last checkpoint is still written."""

    def __init__(self, minutes: float):
        super().__init__()
        self.deadline = time.monotonic() + 60 * minutes

    def on_train_batch_end(self, batch, logs=None):
        if time.monotonic() > self.deadline:
            self.model.stop_training = True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--average", type=int, default=10, help="average this many last checkpoints")
    parser.add_argument("--max-steps", type=int, help="train to this step (default: as many as batches were recorded)")
    parser.add_argument("--minutes", type=float, help="stop after this many minutes of training")
    args = parser.parse_args()
    if keras.backend.backend() == "jax":
        import jax

        # JAX multiplies float32 matrices in TF32 on recent GPUs by default;
        # the run's dtype is float32.
        jax.config.update("jax_default_matmul_precision", "highest")

    with open(os.path.join(args.run_dir, RUN_FILE)) as f:
        run = json.load(f)
    options = argparse.Namespace(**run["arguments"])
    with np.load(os.path.join(args.run_dir, "batches.npz")) as arrays:
        train, valid = RecordedBatches(arrays, "train"), RecordedBatches(arrays, "valid")
    options.max_steps = args.max_steps or len(train)
    if len(train) < options.max_steps:
        raise SystemExit(f"batches.npz holds {len(train)} training batches; --max-steps is {options.max_steps}.")

    keras.utils.set_random_seed(options.seed)
    model = Transformer(backbone=TransformerBackbone(**run["backbone"]), preprocessor=None)
    compile_model(model, options)
    checkpoint_dir = os.path.join(args.run_dir, CHECKPOINT_DIR)
    step = 0
    last = checkpoints.latest_checkpoint(checkpoint_dir)
    if last:
        step = checkpoints.restore_checkpoint(model, last)
        print(f"resuming from {last} at step {step}.")

    def training_batches():
        for index in range(step, options.max_steps):
            yield train.batch(index)

    saver = checkpoints.PeriodicCheckpoint(
        checkpoint_dir,
        every_steps=options.checkpoint_every_steps,
        every_minutes=options.checkpoint_every_minutes or None,
        keep=options.keep_checkpoints,
    )
    monitor = TrainingMonitor(args.run_dir)
    nan_guard = checkpoints.StopOnNaN(saver)
    callbacks = [saver, nan_guard, StopAtStep(options.max_steps), monitor]
    if args.minutes:
        callbacks.append(StopAtDeadline(args.minutes))
    initial_epoch = step // options.valid_every
    if step < options.max_steps:
        # KerasHub's Task.fit sends every input through tf.data or grain to
        # preprocess it; these batches need no preprocessing (the model has
        # none) and a GPU machine may have neither library: Keras' own fit.
        keras.Model.fit(
            model,
            training_batches(),
            validation_data=ValidationBatches(valid),
            steps_per_epoch=options.valid_every,
            initial_epoch=initial_epoch,
            epochs=initial_epoch + math.ceil((options.max_steps - step) / options.valid_every),
            callbacks=callbacks,
            verbose=2,
            shuffle=False,  # recorded in the train command's order
        )
        if nan_guard.message:
            raise SystemExit(nan_guard.message)
        print(f"trained to step {int(keras.ops.convert_to_numpy(model.optimizer.iterations))} at {monitor.tokens_per_second:.0f} target tokens/s.")
    paths = checkpoints.list_checkpoints(checkpoint_dir)[-args.average :]
    weights = checkpoints.average_checkpoints(paths)
    arrays = {f"model/{i:05d}": w for i, w in enumerate(weights)}
    with np.load(paths[-1]) as newest:
        arrays["step"] = newest["step"]
    path = os.path.join(args.run_dir, AVERAGED_FILE)
    np.savez(path + ".tmp.npz", **arrays)
    os.replace(path + ".tmp.npz", path)
    print(f"averaged {len(paths)} checkpoints ({os.path.basename(paths[0])} .. {os.path.basename(paths[-1])}) into {path}.")


if __name__ == "__main__":
    main()
