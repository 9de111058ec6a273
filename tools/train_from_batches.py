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
import os
import time

import keras
import numpy as np

from keras_transformer.models.transformer import Transformer
from keras_transformer.models.transformer_backbone import TransformerBackbone
from keras_transformer.training import checkpoints
from keras_transformer.training_run import TrainingRun, read_run_file
from keras_transformer.utils.special_tokens import END_ID, PAD_ID, START_ID

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

    with np.load(os.path.join(args.run_dir, "batches.npz")) as arrays:
        train, valid = RecordedBatches(arrays, "train"), RecordedBatches(arrays, "valid")
    max_steps = args.max_steps or len(train)
    if len(train) < max_steps:
        raise SystemExit(f"batches.npz holds {len(train)} training batches; --max-steps is {max_steps}.")

    run = TrainingRun.from_folder(args.run_dir, max_steps=max_steps, verbose=2)
    keras.utils.set_random_seed(run.options["seed"])
    trainer = run.trainer()
    model = Transformer(backbone=TransformerBackbone(**read_run_file(args.run_dir)["backbone"]), preprocessor=None)
    trainer.compile(model)
    step = trainer.resume(model)

    def training_batches():
        for index in range(step, max_steps):
            yield train.batch(index)

    if step < max_steps:
        deadline = [StopAtDeadline(args.minutes)] if args.minutes else []
        # In the train command's order, as recorded.
        result = trainer.fit(model, training_batches(), ValidationBatches(valid), step=step, callbacks=deadline)
        print(f"trained to step {result.step} at {result.tokens_per_second:.0f} target tokens/s.")
    checkpoint_dir = trainer.checkpoint_directory
    paths = checkpoints.list_checkpoints(checkpoint_dir)[-args.average :]
    weights = checkpoints.average_checkpoints(paths)
    arrays = {f"model/{i:05d}": w for i, w in enumerate(weights)}
    with np.load(paths[-1]) as newest:
        arrays["step"] = newest["step"]
    path = os.path.join(args.run_dir, AVERAGED_FILE)
    np.savez(path + ".tmp.npz", **arrays)
    os.replace(path + ".tmp.npz", path)
    first, last = os.path.basename(paths[0]), os.path.basename(paths[-1])
    print(f"averaged {len(paths)} checkpoints ({first} .. {last}) into {path}.")


if __name__ == "__main__":
    main()
