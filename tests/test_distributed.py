"""Multi-device and multi-host training (keras_transformer.training.distribution).

The slow tests run tests/distributed_worker.py in subprocesses, because
devices must be split before TensorFlow or JAX start: two logical CPUs for
MirroredStrategy, two host devices for JAX, and two JAX processes on
localhost for multi-host training. Each trains a tiny Transformer for five
steps on the same global batches and compares losses and weights with one
device. Measured on this machine (float32, dropout 0): MirroredStrategy with
`GlobalTokenMean` and JAX DataParallel (one process or two) agree with one
device to within 1e-6 in every step's loss; MirroredStrategy without it
differs by 0.006 to 0.20 (up to 5 %), most after the first steps, because
replicas that received short sentences weigh their tokens more.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

from helpers import REPO_ROOT
from keras_transformer import LabelSmoothedCrossEntropy
from keras_transformer.training import data, distribution, shards_reading
from test_shards import ids, prepare, write_corpus

WORKER = REPO_ROOT / "tests" / "distributed_worker.py"
TIMEOUT = 300  # a bound on a hang: two processes each start TensorFlow and JAX on the same two cores
# float32 sums in another order (per replica, then all-reduced): measured
# 2.4e-7 (TF) and 7.2e-7 (JAX) at most in the losses. Weights differ more,
# 7.5e-5 (TF) and 1.0e-4 (JAX) at most after 5 Adam steps of 0.01, because
# Adam divides by the gradient's own scale: weights whose gradients are
# almost 0 move by rounding noise. 5e-4 is 1 % of what Adam can move a
# weight in 5 steps.
LOSS_TOLERANCE = dict(rtol=1e-5, atol=1e-5)
WEIGHT_TOLERANCE = dict(rtol=0, atol=5e-4)

BACKEND = keras.config.backend()


def _env(backend, **extra):
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "XLA_FLAGS")}
    env.update(PYTHONPATH=str(REPO_ROOT), KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2", **extra)
    return env


def _load(prefix):
    with open(f"{prefix}.json") as f:
        report = json.load(f)
    with np.load(f"{prefix}.npz") as weights:
        report["weights"] = [weights[k] for k in sorted(weights.files, key=lambda k: int(k.split("_")[1]))]
    return report


def run_worker(out_dir, backend, *flags):
    """Runs one worker process and returns its report (with its final weights)."""
    prefix = str(Path(out_dir) / "_".join(f.strip("-") for f in flags or ("single",)))
    result = subprocess.run(
        [sys.executable, str(WORKER), *flags, "--out", prefix],
        env=_env(backend),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return _load(prefix) if "--dropout-masks" not in flags else json.load(open(prefix + ".json"))


def run_workers(out_dir, backend, flags_per_worker, env_per_worker):
    """Runs workers side by side; kills them all if one hangs past TIMEOUT."""
    processes = []
    try:
        for index, (flags, env) in enumerate(zip(flags_per_worker, env_per_worker)):
            log = open(Path(out_dir) / f"worker{index}.log", "w")
            processes.append(
                subprocess.Popen(
                    [sys.executable, str(WORKER), *flags, "--out", str(Path(out_dir) / f"worker{index}")],
                    env=_env(backend, **env),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        codes = [p.wait(timeout=TIMEOUT) for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()
    logs = [(Path(out_dir) / f"worker{i}.log").read_text() for i in range(len(processes))]
    return codes, logs


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


# The workers run in subprocesses with their own backend, so every test runs
# whichever backend pytest itself was started with.


@pytest.fixture(scope="module")
def single_device_tensorflow(tmp_path_factory):
    """One-device training, the reference the TensorFlow runs are compared with."""
    return run_worker(tmp_path_factory.mktemp("single-tf"), "tensorflow")


@pytest.fixture(scope="module")
def single_device_jax(tmp_path_factory):
    """One-device training, the reference the JAX runs are compared with."""
    return run_worker(tmp_path_factory.mktemp("single-jax"), "jax")


def assert_same_training(run, reference):
    np.testing.assert_allclose(run["losses"], reference["losses"], **LOSS_TOLERANCE)
    for got, expected in zip(run["weights"], reference["weights"], strict=True):
        np.testing.assert_allclose(got, expected, **WEIGHT_TOLERANCE)


# Fast checks, on every backend.


def test_unknown_and_foreign_strategies_are_refused():
    with pytest.raises(ValueError, match="Unknown strategy"):
        distribution.training_scope("horovod")
    other = {"tensorflow": "jax-data-parallel", "jax": "mirrored", "torch": "mirrored"}[BACKEND]
    with pytest.raises(ValueError, match="backend"):
        distribution.training_scope(other)


def test_multi_worker_mirrored_points_to_the_jax_path():
    with pytest.raises(ValueError, match="KERAS_BACKEND=jax.*--coordinator"):
        distribution.training_scope("multi-worker-mirrored")


def test_initialize_checks_its_arguments():
    if BACKEND != "jax":
        with pytest.raises(ValueError, match="JAX backend"):
            distribution.initialize("127.0.0.1:1234", 2, 0)
        return
    with pytest.raises(ValueError, match="process-id"):
        distribution.initialize("127.0.0.1:1234", 2, 2)
    with pytest.raises(ValueError, match="host:port"):
        distribution.initialize("localhost", 2, 0)


def test_a_single_process_is_the_chief():
    assert distribution.is_chief()
    assert distribution.num_replicas(None) == 1


def test_global_token_mean_is_the_wrapped_loss_on_one_device():
    rng = np.random.default_rng(0)
    labels = np.array([[5, 3, 0, 0], [7, 0, 0, 0]])
    logits = rng.normal(size=(2, 4, 9)).astype("float32")
    inner = LabelSmoothedCrossEntropy(0.1)
    wrapped = distribution.GlobalTokenMean(inner)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(wrapped(labels, logits)),
        keras.ops.convert_to_numpy(inner(labels, logits)),
        rtol=1e-6,
    )
    restored = distribution.GlobalTokenMean.from_config(wrapped.get_config())
    assert restored.loss.label_smoothing == 0.1


def test_prepare_dataset_is_a_no_op_without_strategy():
    import tensorflow as tf

    data = tf.data.Dataset.from_tensors(({"ids": [[4, 0]], "mask": [[True, False]]}, [[1, 0]]))
    assert distribution.prepare_dataset(data, "none") is data


def _uneven_batches():
    """Three `(x, labels, weights)` batches of 3, 2 and 1 rows, of lengths 4, 8 and 4."""
    import tensorflow as tf

    rng = np.random.default_rng(0)
    batches = []
    for rows, length in ((3, 4), (2, 8), (1, 4)):
        labels = rng.integers(4, 30, (rows, length)) * (np.arange(length) < rng.integers(1, length, (rows, 1)))
        x = {"encoder_token_ids": labels, "encoder_padding_mask": labels != 0}
        batches.append(tf.data.Dataset.from_tensors((x, labels, (labels != 0).astype("float32"))))
    return batches[0].concatenate(batches[1]).concatenate(batches[2])


@pytest.mark.skipif(BACKEND != "jax", reason="the processes agree through JAX")
def test_agreed_batches_pad_rows_for_the_devices_and_weigh_tokens_by_update():
    # One process here: the shapes it agrees on are its own, rows made a multiple of 2 devices.
    batches = _uneven_batches()
    agreed = list(distribution._agreed_batches(batches, local_devices=2))
    assert [x["encoder_token_ids"].shape for x, _, _ in agreed] == [(4, 4), (2, 8), (2, 4)]
    for (x, labels, weights), (x0, labels0, weights0) in zip(agreed, batches.as_numpy_iterator()):
        rows = len(labels0)
        np.testing.assert_array_equal(x["encoder_token_ids"][:rows], x0["encoder_token_ids"])
        np.testing.assert_array_equal(weights[:rows], weights0)
        assert not weights[rows:].any() and not labels[rows:].any() and not x["encoder_padding_mask"][rows:].any()
    # Accumulating two batches an update: weight_by_update's weights; the last, incomplete update dropped.
    accumulated = list(distribution._agreed_batches(batches, local_devices=1, micro_batches=2))
    expected = list(data.weight_by_update(batches, 2).as_numpy_iterator())
    assert len(accumulated) == len(expected) == 2
    for (_, _, weights), (_, _, weights0) in zip(accumulated, expected):
        np.testing.assert_allclose(weights, weights0, rtol=1e-6)


# MirroredStrategy on two logical CPUs.


@pytest.mark.slow
def test_mirrored_matches_one_device_with_global_token_mean(single_device_tensorflow, tmp_path):
    run = run_worker(tmp_path, "tensorflow", "--strategy", "mirrored", "--devices", "2", "--global-token-mean")
    assert run["replicas"] == 2
    assert_same_training(run, single_device_tensorflow)


@pytest.mark.slow
def test_mirrored_without_global_token_mean_averages_replica_means(single_device_tensorflow, tmp_path):
    # Keras' own scaling: mean over replicas of each replica's token mean.
    # The worker's batches give replica 0 short sentences, so this differs.
    # The first step barely differs: at initialisation every token's loss is
    # close to log(vocabulary), so both token means are alike.
    run = run_worker(tmp_path, "tensorflow", "--strategy", "mirrored", "--devices", "2")
    difference = max(abs(a - b) for a, b in zip(run["losses"], single_device_tensorflow["losses"]))
    assert difference > 0.05, (
        f"Keras now averages tokens globally (difference {difference}); GlobalTokenMean may be unnecessary"
    )


@pytest.mark.slow
def test_mirrored_dropout_same_masks_on_every_replica_but_trains(tmp_path):
    masks = run_worker(tmp_path, "tensorflow", "--strategy", "mirrored", "--devices", "2", "--dropout-masks")
    assert masks["replicas"] == 2
    # Keras 3 seeds dropout from one mirrored SeedGenerator: the replicas
    # draw the same mask (on different examples). Documented, not fixed.
    assert masks["identical_masks"], "replicas now draw different dropout masks: update distribute's docs"
    run = run_worker(
        tmp_path, "tensorflow", "--strategy", "mirrored", "--devices", "2", "--global-token-mean", "--dropout", "0.3"
    )
    assert run["finite"] and run["losses"][-1] < run["losses"][0] + 0.5


@pytest.mark.slow
@pytest.mark.parametrize("dtype, optimizer", [("mixed_float16", "LossScaleOptimizer"), ("mixed_bfloat16", "Adam")])
def test_mirrored_mixed_precision(single_device_tensorflow, tmp_path, dtype, optimizer):
    run = run_worker(
        tmp_path, "tensorflow", "--strategy", "mirrored", "--devices", "2", "--global-token-mean", "--dtype", dtype
    )
    assert run["optimizer"] == optimizer
    assert run["finite"]
    # Half-precision activations: measured within 0.006 of float32.
    np.testing.assert_allclose(run["losses"], single_device_tensorflow["losses"], atol=0.02)


# JAX: two host devices in one process, and two processes.


def _two_processes(*flags):
    (port,) = free_ports(1)
    common = ["--strategy", "jax-data-parallel", "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2"]
    return [[*common, "--process-id", str(i), *flags] for i in range(2)]


@pytest.mark.slow
def test_jax_data_parallel_matches_one_device(single_device_jax, tmp_path):
    run = run_worker(tmp_path, "jax", "--strategy", "jax-data-parallel", "--devices", "2")
    assert run["replicas"] == 2
    assert_same_training(run, single_device_jax)


@pytest.mark.slow
def test_jax_data_parallel_trains_with_dropout(tmp_path):
    # The `threefry_dropout` speed path draws its masks with jax.lax.rng_bit_generator over the
    # global batch; sharded across two devices it must still train.
    run = run_worker(tmp_path, "jax", "--strategy", "jax-data-parallel", "--devices", "2", "--dropout", "0.3")
    assert run["replicas"] == 2
    assert run["finite"] and run["losses"][-1] < run["losses"][0] + 0.5


@pytest.mark.slow
def test_jax_two_processes_agree_on_weights(single_device_jax, tmp_path):
    codes, logs = run_workers(tmp_path, "jax", _two_processes(), [{}, {}])
    assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    first, second = _load(tmp_path / "worker0"), _load(tmp_path / "worker1")
    assert first["replicas"] == second["replicas"] == 2
    for a, b in zip(first["weights"], second["weights"], strict=True):
        np.testing.assert_array_equal(a, b)
    assert first["chief"] and not second["chief"]
    assert_same_training(first, single_device_jax)


@pytest.mark.slow
def test_jax_processes_train_on_their_own_shares_of_a_prepared_corpus(tmp_path, tokenizer):
    # Three shards, which the two processes share pair by pair.
    corpus = prepare(*write_corpus(tmp_path, 150), tmp_path / "data", tokenizer, pairs_per_shard=48)
    assert len(corpus.shards) == 3
    codes, logs = run_workers(tmp_path, "jax", _two_processes("--prepared", str(corpus.folder)), [{}, {}])
    assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    reports = [_load(tmp_path / f"worker{i}") for i in range(2)]
    for index, report in enumerate(reports):
        own = ids(shards_reading.prepared_pairs(corpus, shuffle=False, num_processes=2, process_index=index))
        assert sorted(tuple(map(tuple, pair)) for pair in report["pairs"]) == sorted(own)
        assert report["finite"] and report["replicas"] == 2
    every = ids(shards_reading.prepared_pairs(corpus, shuffle=False))
    assert sorted(tuple(map(tuple, pair)) for r in reports for pair in r["pairs"]) == sorted(every)
    first, second = (r["tokens_per_step"] for r in reports)
    assert len(first) == len(second) > 1
    for a, b in zip(reports[0]["weights"], reports[1]["weights"], strict=True):
        np.testing.assert_array_equal(a, b)


# TensorFlow's MultiWorkerMirroredStrategy, verified rather than assumed.


@pytest.mark.slow
def test_multi_worker_mirrored_fit_fails_under_keras3(tmp_path):
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    envs = [{"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})} for i in range(2)]
    flags = [["--strategy", "multi-worker-mirrored", "--global-token-mean"]] * 2
    codes, logs = run_workers(tmp_path, "tensorflow", flags, envs)
    # The workers connect and shard the data, then Keras' first-batch build
    # reduces the dict of inputs, which the collective reduce cannot take.
    assert codes != [0, 0], "MultiWorkerMirroredStrategy now trains under Keras 3: distribute may allow it"
    assert "_maybe_symbolic_build" in logs[0] and "unsupported type" in logs[0], logs[0][-3000:]
