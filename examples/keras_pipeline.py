"""Use the model inside your own Keras pipeline: tf.data input, callbacks, your own loss.

What it shows, on a preset fine-tuned with your sentence pairs (a `source<TAB>target`
TSV file, as for fine_tune.py):

- input as a `tf.data.Dataset` of strings, shuffled every epoch, with the model's own
  preprocessor mapped over it: it tokenizes, adds `<s>`/`</s>`, pads, and returns
  `(x, y, sample_weight)` of token ids, which `fit` takes as they are. (For the
  paper's batches of about N tokens instead of N sentences, see
  `keras_transformer.training.data.tokenize_pairs` and `token_batches`.)
- a loss you write yourself (a plain masked cross-entropy, in place of the paper's
  label-smoothed one) given to `compile(loss=...)`;
- standard callbacks: `EarlyStopping`, `ModelCheckpoint` writing the best model as a
  `.keras` file, and `BackupAndRestore`, which resumes a run that was killed;
- loading the `.keras` file back with `keras.saving.load_model` and translating.

Run:
    python examples/keras_pipeline.py pairs.tsv --out runs/pipeline --epochs 10
    python examples/keras_pipeline.py pairs.tsv --out /tmp/check --epochs 2 --run-eagerly   # quick
"""

import argparse
import os

import keras
import tensorflow as tf
from keras import ops

import keras_transformer as kt


@keras.saving.register_keras_serializable(package="my_pipeline")
def masked_cross_entropy(y_true, y_pred):
    """Mean cross-entropy over real target tokens; label 0 (`<pad>`) is padding.

    `y_true`: target token ids `(batch, length)`; `y_pred`: the model's logits
    `(batch, length, vocabulary)`. Registered so that the `.keras` file can name it.
    """
    losses = keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)
    mask = ops.cast(ops.not_equal(y_true, 0), losses.dtype)
    return ops.sum(losses * mask) / ops.maximum(ops.sum(mask), 1.0)


def read_tsv(path: str) -> tuple[list[str], list[str]]:
    with open(path, encoding="utf-8") as file:
        pairs = [line.rstrip("\r\n").split("\t") for line in file if line.strip()]
    return [source for source, _ in pairs], [target for _, target in pairs]


def make_dataset(model, sources, targets, batch_size, shuffle):
    """Strings in, token ids out, batched; the preprocessor runs inside tf.data."""
    dataset = tf.data.Dataset.from_tensor_slices({"encoder_text": sources, "decoder_text": targets})
    if shuffle:
        dataset = dataset.shuffle(len(sources), reshuffle_each_iteration=True)

    def preprocess(x):
        # Pads every batch to 64 tokens (the preset's default is 256); longer sentences
        # are cut, with a warning.
        x, y, sample_weight = model.preprocessor(x, encoder_sequence_length=64, decoder_sequence_length=64)
        return x, y  # the loss above masks padding itself, so no sample weights

    return dataset.batch(batch_size).map(preprocess, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tsv", help="training pairs, source<TAB>target per line")
    parser.add_argument("--out", required=True, help="a folder for the checkpoint and the backup")
    parser.add_argument("--preset", default="multi30k_en_de")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--run-eagerly", action="store_true", help="no graph compilation: starts at once, each step slower"
    )
    args = parser.parse_args(argv)

    keras.utils.set_random_seed(0)  # before any tokenizer exists (it resets TF's kernel cache)
    model = kt.Transformer.from_preset(args.preset)
    if model.backbone.pad_token_id != 0:  # e.g. an Opus-MT checkpoint, whose <pad> is the last id
        raise SystemExit("masked_cross_entropy takes id 0 as padding; this model pads with another id.")

    sources, targets = read_tsv(args.tsv)
    held_out = max(1, len(sources) // 10)  # the last 10 % validates
    train = make_dataset(model, sources[:-held_out], targets[:-held_out], args.batch_size, shuffle=True)
    valid = make_dataset(model, sources[-held_out:], targets[-held_out:], args.batch_size, shuffle=False)

    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=5e-5),
        loss=masked_cross_entropy,
        weighted_metrics=[],  # the model's default masked accuracy needs sample weights
        run_eagerly=args.run_eagerly,
    )
    os.makedirs(args.out, exist_ok=True)
    best = os.path.join(args.out, "best.keras")
    callbacks = [
        keras.callbacks.EarlyStopping(monitor="val_loss", patience=2, restore_best_weights=True),
        keras.callbacks.ModelCheckpoint(best, monitor="val_loss", save_best_only=True),
        # Saves the training state every epoch and deletes it at the end; a run killed
        # on the way restarts from its last epoch when the script runs again.
        keras.callbacks.BackupAndRestore(os.path.join(args.out, "backup")),
    ]
    history = model.fit(train, validation_data=valid, epochs=args.epochs, callbacks=callbacks)
    print("val_loss per epoch:", [round(v, 4) for v in history.history["val_loss"]])

    # The .keras file holds the whole model: weights, tokenizer and preprocessor;
    # `import keras_transformer` (above) registers the classes it names. Keras does not
    # restore this model's compile() arguments: to train on, call compile() again.
    restored = keras.saving.load_model(best, compile=False)
    for source, translation in zip(sources[-2:], restored.translate(sources[-2:], beam_size=None)):
        print(f"{source}\t{translation}")


if __name__ == "__main__":
    main()
