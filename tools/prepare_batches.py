"""Writes a training run's batches to one file, for training without TensorFlow.

`keras-transformer train` reads, tokenizes and batches with TensorFlow
(tf.data, tensorflow-text's SentencePiece). A machine that has only JAX or
PyTorch (a GPU box, say) can still train the same run: this script, run where
TensorFlow is installed, records what the train command would feed, and
`tools/train_from_batches.py` trains from it with any Keras backend.

It records the batches, not a copy of the pipeline: the run's pairs go through
`data.token_batches` itself (same bucketing, shuffle seed and order), with each
source sentence replaced by one of equal length whose tokens are its pair's
index, so every batch says which pairs it holds and how far they are padded.
Batching reads only lengths, so the batches are the train command's.

Usage: a run folder made by `keras-transformer train ... --max-steps 0` (it
trains the vocabulary and writes run.json), then

    python tools/prepare_batches.py RUN_DIR --max-steps 8000

writes RUN_DIR/batches.npz: the token ids of the training and validation pairs
and, for each batch, its pairs and padded length.
"""

import argparse
import json
import os

import keras
import numpy as np
import tensorflow as tf

from keras_transformer import TransformerTokenizer
from keras_transformer.training import data, parallel_text
from keras_transformer.training_run import RUN_FILE, VOCABULARY_FILE

BATCHES_FILE = "batches.npz"


def _batch_contents(pairs: data.TokenizedPairs, steps: int | None, **batching) -> dict:
    """For each batch of `token_batches`: its pair indices and padded lengths."""
    indices = tf.range(len(pairs), dtype="int32")
    labelled = data.TokenizedPairs(
        # Each source token is the pair's index; lengths are unchanged.
        tf.RaggedTensor.from_row_splits(tf.repeat(indices, pairs.sources.row_lengths()), pairs.sources.row_splits),
        pairs.targets,
        pairs.max_length,
        pairs.dropped,
    )
    batches = data.token_batches(labelled, **batching)
    if steps is not None:
        batches = batches.take(steps)
    members, sizes, encoder_lengths, decoder_lengths = [], [], [], []
    for x, _, _ in batches.as_numpy_iterator():
        encoder = x["encoder_token_ids"]
        members.append(encoder[:, 1])  # the first token after <s>
        sizes.append(len(encoder))
        encoder_lengths.append(encoder.shape[1])
        decoder_lengths.append(x["decoder_token_ids"].shape[1])
    return {
        "pairs": np.concatenate(members).astype("int32"),
        "sizes": np.asarray(sizes, "int32"),
        "encoder_lengths": np.asarray(encoder_lengths, "int32"),
        "decoder_lengths": np.asarray(decoder_lengths, "int32"),
    }


def _token_ids(pairs: data.TokenizedPairs) -> dict:
    return {
        "source_ids": pairs.sources.flat_values.numpy(),
        "source_splits": pairs.sources.row_splits.numpy(),
        "target_ids": pairs.targets.flat_values.numpy(),
        "target_splits": pairs.targets.row_splits.numpy(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--max-steps", type=int, required=True, help="training batches to record")
    args = parser.parse_args()

    with open(os.path.join(args.run_dir, RUN_FILE)) as f:
        options = json.load(f)["arguments"]
    if options["accumulate"] != 1 or options["strategy"] != "none":
        raise SystemExit("only runs without --accumulate and --strategy are supported.")
    # As the train command: seeds first (tf.random.set_seed after a tokenizer
    # exists breaks the SentencePiece op), then the shuffle seed below.
    keras.utils.set_random_seed(options["seed"])
    tokenizer = TransformerTokenizer(proto=os.path.join(args.run_dir, VOCABULARY_FILE))
    arrays = {}
    for split, (source, target) in {
        "train": (options["src"], options["tgt"]),
        "valid": (options["valid_src"], options["valid_tgt"]),
    }.items():
        sources, targets, _ = parallel_text.read_parallel(source, target, skip_bad=options["skip_bad"])
        pairs = data.tokenize_pairs(sources, targets, tokenizer, options["max_length"])
        if split == "train":
            # As the train command batches a run that starts at step 0.
            contents = _batch_contents(
                pairs,
                args.max_steps,
                tokens_per_batch=options["tokens_per_batch"],
                repeat=True,
                seed=options["seed"],
            )
        else:
            contents = _batch_contents(pairs, None, tokens_per_batch=options["tokens_per_batch"], shuffle=False)
        arrays.update({f"{split}/{k}": v for k, v in {**_token_ids(pairs), **contents}.items()})
        print(f"{split}: {len(pairs)} pairs, {len(contents['sizes'])} batches.")
    path = os.path.join(args.run_dir, BATCHES_FILE)
    np.savez_compressed(path + ".tmp.npz", **arrays)
    os.replace(path + ".tmp.npz", path)
    print(f"wrote {path} ({os.path.getsize(path) / 2**20:.1f} MiB).")


if __name__ == "__main__":
    main()
