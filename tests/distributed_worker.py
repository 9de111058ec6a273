"""One training run of a tiny Transformer, for tests/test_distributed.py.

Devices must be configured before TensorFlow or JAX initialise, so every
configuration runs in its own process: this script sets them up from its
flags, trains a few steps on fixed token batches, and writes a JSON report
(losses per step, whether everything stayed finite) and the final weights
(`.npz`) for the test to compare.

    KERAS_BACKEND=tensorflow python tests/distributed_worker.py \\
        --strategy mirrored --devices 2 --out /tmp/run
"""

import argparse
import json
import os
import sys

from helpers import REPO_ROOT  # tests/, this script's folder, is first on the path

VOCABULARY_SIZE = 32
SEQUENCE_LENGTH = 8
CONFIG = dict(
    num_encoder_layers=1,
    num_decoder_layers=1,
    num_heads=2,
    hidden_dim=16,
    intermediate_dim=32,
    max_sequence_length=SEQUENCE_LENGTH,
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="none")
    parser.add_argument(
        "--devices", type=int, default=1, help="logical CPUs (TF) or host devices (JAX) in this process"
    )
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=8, help="the global batch")
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument(
        "--global-token-mean", action="store_true", help="wrap the loss in distribution.GlobalTokenMean"
    )
    parser.add_argument(
        "--dropout-masks", action="store_true", help="only report whether replicas draw different dropout masks"
    )
    parser.add_argument("--prepared", help="train one epoch on this prepared corpus, each process on its own shards")
    parser.add_argument("--tokens-per-batch", type=int, default=96, help="with --prepared: the global batch")
    parser.add_argument("--coordinator")
    parser.add_argument("--num-processes", type=int)
    parser.add_argument("--process-id", type=int)
    parser.add_argument("--out", required=True, help="file prefix for .json and .npz")
    return parser.parse_args(argv)


def configure_devices(args):
    """Splits this machine into args.devices devices, before the backend starts."""
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    if backend == "jax":
        os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    # TensorFlow is imported by Keras on every backend (for tf.data); only
    # the TensorFlow backend needs its CPU split into logical devices.
    import tensorflow as tf

    if backend == "tensorflow" and args.devices > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.devices)


def token_batches(batch_size, steps):
    """Fixed batches whose sizes and real lengths vary, like token-bucketed ones.

    Every other batch has one row less (7 rows cannot be split evenly over
    2 devices), and the first half of each batch (replica 0) is much shorter
    than the second: per-replica token means then differ from the global one.
    """
    import numpy as np

    rng = np.random.default_rng(0)
    batches = []
    for step in range(steps):
        rows = batch_size - step % 2
        lengths = rng.integers(2, SEQUENCE_LENGTH, size=(rows,))
        lengths[: rows // 2] = rng.integers(1, 3, size=(rows // 2,))
        ids = rng.integers(4, VOCABULARY_SIZE, size=(rows, SEQUENCE_LENGTH))
        mask = np.arange(SEQUENCE_LENGTH)[None, :] < lengths[:, None]
        ids = np.where(mask, ids, 0).astype("int32")
        labels = np.concatenate([ids[:, 1:], np.zeros((rows, 1), "int32")], axis=1)
        x = {
            "encoder_token_ids": ids,
            "encoder_padding_mask": mask,
            "decoder_token_ids": ids,
            "decoder_padding_mask": mask,
        }
        batches.append((x, labels))
    return batches


def dataset(batches):
    import tensorflow as tf

    data = None
    for x, y in batches:
        one = tf.data.Dataset.from_tensors((x, y))
        data = one if data is None else data.concatenate(one)
    return data


def build_and_compile(args, vocabulary_size=VOCABULARY_SIZE, max_length=SEQUENCE_LENGTH):
    import keras

    import keras_transformer as kt
    from keras_transformer.training import distribution

    keras.utils.set_random_seed(1)
    config = {**CONFIG, "max_sequence_length": max_length}
    backbone = kt.TransformerBackbone(vocabulary_size=vocabulary_size, dropout=args.dropout, **config)
    model = kt.Transformer(backbone=backbone, preprocessor=None)
    loss = kt.LabelSmoothedCrossEntropy(0.1)
    if args.global_token_mean:
        loss = distribution.GlobalTokenMean(loss)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=loss, weighted_metrics=[])
    return model


def dropout_masks(args, report):
    """Runs one dropout layer on identical inputs on every replica."""
    import keras
    import numpy as np
    import tensorflow as tf

    from keras_transformer.training import distribution

    with distribution.training_scope(args.strategy):
        strategy = tf.distribute.get_strategy()
        layer = keras.layers.Dropout(0.5, seed=None)
        inputs = tf.ones((args.devices, 64))
        data = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(inputs))
        outputs = strategy.run(tf.function(lambda x: layer(x, training=True)), args=(next(iter(data)),))
        per_replica = [np.asarray(v) for v in strategy.experimental_local_results(outputs)]
    report["replicas"] = len(per_replica)
    report["identical_masks"] = bool(all(np.array_equal(per_replica[0] != 0, p != 0) for p in per_replica[1:]))


def train_on_prepared(args, report):
    """One epoch of this process's shards of a prepared corpus; reports the pairs it trained on."""
    import keras

    from keras_transformer.training import distribution
    from keras_transformer.training.shards_reading import PreparedCorpus, prepared_batches

    corpus = PreparedCorpus.open(args.prepared)
    processes, process = distribution.processes(args.strategy)
    with _scope(args.strategy) as scope:
        model = build_and_compile(args, corpus.tokenizer().vocabulary_size(), corpus.max_length)
        local = prepared_batches(
            corpus, args.tokens_per_batch // processes, seed=1, num_processes=processes, process_index=process
        )
        pairs, steps = [], []

        def recorded(batches):
            for x, labels, weights in batches:
                steps.append(int(weights.sum()))
                for encoder, target in zip(x["encoder_token_ids"], labels):
                    if target.any():  # a pair, not a padding row
                        pairs.append([encoder[encoder != 0][1:-1].tolist(), target[target != 0][:-1].tolist()])
                yield x, labels, weights

        agreed = distribution.prepare_dataset(local, args.strategy, per_process=True)
        # Keras' own fit, as Trainer calls it: KerasHub's would take the generator for unbatched data.
        history = keras.Model.fit(model, recorded(agreed), verbose=0)
        report["losses"] = [float(v) for v in history.history["loss"]]
        report["replicas"] = distribution.num_replicas(scope)
    report["pairs"], report["tokens_per_step"] = pairs, steps
    return model


def _scope(strategy):
    if strategy == "multi-worker-mirrored":
        # distribution.training_scope refuses it; this runs it anyway, to
        # record what Keras 3 does under it (TF_CONFIG names the workers).
        import keras
        import tensorflow as tf

        keras.config.disable_traceback_filtering()  # Show where Keras fails.
        return tf.distribute.MultiWorkerMirroredStrategy().scope()
    from keras_transformer.training import distribution

    return distribution.training_scope(strategy)


def _data_strategy(strategy):
    # MultiWorkerMirroredStrategy gets the same int32 masks as "mirrored",
    # so that it fails (or not) for reasons of its own.
    return "mirrored" if strategy == "multi-worker-mirrored" else strategy


def main(argv=None):
    args = parse_args(argv)
    configure_devices(args)
    sys.path.insert(0, str(REPO_ROOT))
    import keras
    import numpy as np

    from keras_transformer.training import distribution

    if args.coordinator:
        distribution.initialize(args.coordinator, args.num_processes, args.process_id)
    report = {"strategy": args.strategy, "devices": args.devices, "dtype": args.dtype}
    if args.dropout_masks:
        dropout_masks(args, report)
    elif args.prepared:
        model = train_on_prepared(args, report)
    else:
        if args.dtype != "float32":
            keras.config.set_dtype_policy(args.dtype)
        batches = token_batches(args.batch_size, args.steps)
        with _scope(args.strategy) as scope:
            model = build_and_compile(args)
            # One step an epoch: the history holds every step's loss.
            data = distribution.prepare_dataset(dataset(batches).repeat(), _data_strategy(args.strategy))
            history = model.fit(data, steps_per_epoch=1, epochs=args.steps, verbose=0, shuffle=False)
            report["losses"] = [float(v) for v in history.history["loss"]]
            report["replicas"] = distribution.num_replicas(scope)
    if not args.dropout_masks:
        report["chief"] = distribution.is_chief()
        weights = [np.asarray(keras.ops.convert_to_numpy(w), "float32") for w in model.weights]
        report["optimizer"] = type(model.optimizer).__name__
        report["finite"] = bool(all(np.isfinite(w).all() for w in weights)) and bool(
            np.isfinite(report["losses"]).all()
        )
        np.savez(args.out + ".npz", *weights)
    with open(args.out + ".json", "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
