import argparse
import functools
import gzip
import os
import types

import h5py
import keras
import numpy as np
import pytest

import keras_transformer as kt
from helpers import TINY_TRAIN_ARGUMENTS, make_model
from keras_transformer.cli import main as cli
from keras_transformer.cli.commands import train as train_command
from keras_transformer.training import checkpoints, data, distribution
from keras_transformer.training.callbacks import CURVES_CSV, CURVES_PNG, read_curves
from keras_transformer.training.recipe import TrainingRecipe
from keras_transformer.training_run import Trainer

TINY = dict(num_encoder_layers=1, num_decoder_layers=1, num_heads=2, hidden_dim=16, intermediate_dim=32, dropout=0.0)


def tiny_transformer(tokenizer, seed=0):
    keras.utils.set_random_seed(seed)
    backbone = kt.TransformerBackbone(vocabulary_size=tokenizer.vocabulary_size(), **TINY)
    model = kt.Transformer(backbone=backbone)
    model.compile(optimizer=kt.paper_optimizer(16, warmup_steps=4))
    return model


@pytest.fixture
def batches(tokenizer, pairs):
    tokenized = data.tokenize_pairs([p[0] for p in pairs], [p[1] for p in pairs], tokenizer, 16)
    return data.token_batches(tokenized, 48, repeat=True, shuffle=False)


def optimizer_state(model):
    store = {}
    model.optimizer.save_own_variables(store)
    return [np.asarray(store[k]) for k in sorted(store, key=int)]


def test_checkpoint_resume_restores_step_optimizer_and_learning_rate(tmp_path, tokenizer, batches):
    model = tiny_transformer(tokenizer)
    model.fit(batches, steps_per_epoch=3, epochs=1, verbose=0, shuffle=False)
    path = checkpoints.save_checkpoint(model, str(tmp_path))
    assert os.path.basename(path) == "ckpt-00000003.npz"
    assert os.listdir(tmp_path) == ["ckpt-00000003.npz"]  # no temporary file left

    resumed = tiny_transformer(tokenizer, seed=1)
    assert checkpoints.restore_checkpoint(resumed, path) == 3
    assert int(keras.ops.convert_to_numpy(resumed.optimizer.iterations)) == 3
    for a, b in zip(optimizer_state(model), optimizer_state(resumed)):
        np.testing.assert_array_equal(a, b)
    lr = float(keras.ops.convert_to_numpy(model.optimizer._get_current_learning_rate()))
    assert lr == float(keras.ops.convert_to_numpy(resumed.optimizer._get_current_learning_rate()))

    # One more step from either model lands on the same weights.
    model.fit(batches, steps_per_epoch=1, epochs=1, verbose=0, shuffle=False)
    resumed.fit(batches, steps_per_epoch=1, epochs=1, verbose=0, shuffle=False)
    for a, b in zip(model.get_weights(), resumed.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(
    keras.config.backend() == "jax", reason="JAX on CPU has no float16 matmul (dot_general F16_F16_F32)"
)
def test_checkpoint_resume_with_mixed_float16_loss_scaling(tmp_path, tokenizer, batches):
    trainer = Trainer(str(tmp_path), TrainingRecipe(warmup_steps=4, accumulate=2), max_steps=2, dtype="mixed_float16")

    def build(seed):
        keras.utils.set_random_seed(seed)
        with trainer.scope():
            backbone = kt.TransformerBackbone(vocabulary_size=tokenizer.vocabulary_size(), **TINY)
            model = kt.Transformer(backbone=backbone)
            trainer.compile(model)
        return model

    model = build(0)
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    # Weighted as Trainer.fit weighs them for its summed loss.
    model.fit(data.weight_by_update(batches, 2), steps_per_epoch=4, epochs=1, verbose=0, shuffle=False)
    path = checkpoints.save_checkpoint(model, str(tmp_path))
    resumed = build(1)
    assert checkpoints.restore_checkpoint(resumed, path) == 2  # 4 micro-batches, 2 updates
    for a, b in zip(optimizer_state(model), optimizer_state(resumed)):
        np.testing.assert_array_equal(a, b)
    assert keras.config.dtype_policy().name == "float32"  # the policy was restored


def test_periodic_checkpoints_by_steps_keep_the_newest(tmp_path, tokenizer, batches):
    model = tiny_transformer(tokenizer)
    saver = checkpoints.PeriodicCheckpoint(str(tmp_path), every_steps=2, keep=2)
    model.fit(batches, steps_per_epoch=5, epochs=1, verbose=0, shuffle=False, callbacks=[saver])
    names = [os.path.basename(p) for p in checkpoints.list_checkpoints(str(tmp_path))]
    assert names == ["ckpt-00000004.npz", "ckpt-00000005.npz"]  # 2 pruned; 5 at the end


@pytest.mark.parametrize("keep", [0, -1, 1.5])
def test_keeping_no_checkpoint_is_refused(tmp_path, keep):
    with pytest.raises(ValueError, match="keep must be"):
        checkpoints.PeriodicCheckpoint(str(tmp_path), every_steps=1, keep=keep)


def test_periodic_checkpoints_by_minutes(tmp_path, tokenizer, batches):
    model = tiny_transformer(tokenizer)
    saver = checkpoints.PeriodicCheckpoint(str(tmp_path), every_minutes=1e-9)
    model.fit(batches, steps_per_epoch=3, epochs=1, verbose=0, shuffle=False, callbacks=[saver])
    assert len(checkpoints.list_checkpoints(str(tmp_path))) == 3


def test_average_checkpoints_is_the_mean(tmp_path, tokenizer, batches):
    model = tiny_transformer(tokenizer)
    saved = []
    for _ in range(3):
        model.fit(batches, steps_per_epoch=1, epochs=1, verbose=0, shuffle=False)
        checkpoints.save_checkpoint(model, str(tmp_path))
        saved.append(model.get_weights())
    averaged = checkpoints.average_checkpoints(checkpoints.list_checkpoints(str(tmp_path))[-2:])
    assert len(averaged) == len(saved[0])
    for mean, a, b in zip(averaged, saved[1], saved[2]):
        np.testing.assert_allclose(mean, (a + b) / 2, rtol=1e-6, atol=1e-7)
    assert not np.allclose(averaged[0], saved[2][0])


def test_nan_loss_stops_training_and_keeps_the_last_good_checkpoint(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse")
    x = np.ones((10, 2), "float32")
    x[6] = np.nan  # the 4th batch of 2
    saver = checkpoints.PeriodicCheckpoint(str(tmp_path), every_steps=1)
    guard = checkpoints.StopOnNaN(saver)
    history = model.fit(x, np.ones((10, 1)), batch_size=2, epochs=3, shuffle=False, verbose=0, callbacks=[saver, guard])
    assert guard.stopped_step == 4
    assert len(history.history["loss"]) == 1  # stopped within the first epoch
    assert "step 4" in guard.message and "ckpt-00000003.npz" in guard.message
    paths = checkpoints.list_checkpoints(str(tmp_path))
    assert [os.path.basename(p) for p in paths] == [f"ckpt-0000000{i}.npz" for i in (1, 2, 3)]
    assert all(np.isfinite(w).all() for w in checkpoints.load_weights(paths[-1]))


def test_accumulation_keeps_the_schedule_per_update(tokenizer):
    model = kt.Transformer(kt.TransformerBackbone(vocabulary_size=tokenizer.vocabulary_size(), **TINY))
    Trainer("run", TrainingRecipe(warmup_steps=10, peak_learning_rate=0.005, accumulate=4), max_steps=1).compile(model)
    plain = kt.TransformerSchedule.with_peak(0.005, 10, 16)
    accumulated = model.optimizer._learning_rate  # the schedule itself
    assert model.optimizer.gradient_accumulation_steps == 4
    for update in (1, 5, 10, 30):
        # Keras evaluates the schedule at the micro-batch count.
        np.testing.assert_allclose(float(accumulated(update * 4 - 1)), float(plain(update - 1)), rtol=1e-5)


def test_accumulated_micro_batches_update_like_one_batch_of_all_their_tokens(tokenizer):
    # Two micro-batches with 7 and 3 real target tokens: the accumulated
    # update must be the gradient of the mean over all 10 tokens (a mean of
    # the two means would weigh each of the 3 tokens 7/3 times more).
    rng = np.random.RandomState(0)
    vocab = tokenizer.vocabulary_size()

    def batch(rows, length, target_lengths):
        source = rng.randint(4, vocab, (rows, length)).astype("int32")
        source[:, 0], source[:, -1] = 2, 3
        decoder = np.zeros((rows, length), "int32")
        labels = np.zeros((rows, length), "int32")
        for row, n in enumerate(target_lengths):
            tokens = rng.randint(4, vocab, n)
            decoder[row, : n + 1] = [2, *tokens]
            labels[row, : n + 1] = [*tokens, 3]
        x = {
            "encoder_token_ids": source,
            "encoder_padding_mask": np.ones_like(source, bool),
            "decoder_token_ids": decoder,
            "decoder_padding_mask": decoder != 0,
        }
        return x, labels, (labels != 0).astype("float32")

    first, second = batch(2, 6, [4, 1]), batch(1, 6, [1])
    micro = tf_dataset([first, second])
    whole = tf_dataset(
        [
            tuple(
                np.concatenate([a, b]) if not isinstance(a, dict) else {k: np.concatenate([a[k], b[k]]) for k in a}
                for a, b in zip(first, second)
            )
        ]
    )

    def trained(dataset, accumulate=None, weighted=True):
        keras.utils.set_random_seed(0)
        model = kt.Transformer(kt.TransformerBackbone(vocabulary_size=vocab, **TINY))
        loss = kt.LabelSmoothedCrossEntropy(0.1)
        if accumulate and weighted:
            loss = kt.LabelSmoothedCrossEntropy(0.1, reduction="sum")
            dataset = data.weight_by_update(dataset, accumulate)
        model.compile(optimizer=keras.optimizers.SGD(1.0, gradient_accumulation_steps=accumulate), loss=loss)
        model.fit(dataset, epochs=1, verbose=0, shuffle=False)
        return model.get_weights()

    one_batch = trained(whole)
    for accumulated, single in zip(trained(micro, 2), one_batch):
        np.testing.assert_allclose(accumulated, single, rtol=1e-4, atol=1e-6)
    # Keras' own averaging of the two micro-batch means lands elsewhere.
    skewed = trained(micro, 2, weighted=False)
    assert max(np.abs(a - b).max() for a, b in zip(skewed, one_batch)) > 1e-3


def tf_dataset(batches):
    import tensorflow as tf

    return tf.data.Dataset.from_generator(
        lambda: iter(batches),
        output_signature=(
            {k: tf.TensorSpec((None, None), "bool" if k.endswith("mask") else "int32") for k in batches[0][0]},
            tf.TensorSpec((None, None), "int32"),
            tf.TensorSpec((None, None), "float32"),
        ),
    )


def test_accumulation_takes_the_preprocessors_boolean_sample_weights(tmp_path, tokenizer, pairs):
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = make_model(tokenizer)
    texts = {"encoder_text": [p[0] for p in pairs], "decoder_text": [p[1] for p in pairs]}
    train = tf.data.Dataset.from_tensor_slices(texts).batch(2).map(model.preprocessor).repeat()
    assert train.element_spec[2].dtype == tf.bool  # the preprocessor's padding mask
    counted = train.map(lambda x, y, w: (x, y, tf.cast(w, "int32")))
    for dataset in (train, counted):
        weights = [w for _, _, w in data.weight_by_update(dataset, 2).take(2)]
        # A group's weights are K / (its target tokens) on each token: they sum to K.
        assert weights[0].dtype == tf.float32
        np.testing.assert_allclose(sum(float(tf.reduce_sum(w)) for w in weights), 2.0, rtol=1e-6)

    trainer = Trainer(str(tmp_path), TrainingRecipe(warmup_steps=4, accumulate=2), max_steps=2, valid_every=2)
    trainer.compile(model)
    assert trainer.fit(model, train).step == 2
    assert np.isfinite(read_curves(str(tmp_path / CURVES_CSV))[-1]["loss"])


class Interrupted(Exception):
    """Stands for a run killed mid-training (Keras writes no final checkpoint then)."""


def test_a_checkpoint_due_mid_accumulation_resumes_like_an_uninterrupted_run(tmp_path, tokenizer, pairs, monkeypatch):
    # One pair per micro-batch, each with its own number of target tokens, so
    # a micro-batch counted twice or weighed with another update's tokens
    # changes the weights.
    tokenized = data.tokenize_pairs([p[0] for p in pairs], [p[1] for p in pairs], tokenizer, 16)

    def batches(skip=0):
        return data.token_batches(tokenized, 16, shuffle=False, repeat=True).skip(skip)

    clock = [0.0]
    monkeypatch.setattr(checkpoints, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))

    class TimePassesThenKill(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == 2:  # the 3rd micro-batch, within the 2nd update, takes an hour
                clock[0] = 3600.0

        def on_train_batch_end(self, batch, logs=None):
            if batch == 4:
                raise Interrupted

    def trainer_and_model(folder, seed):
        trainer = Trainer(
            str(tmp_path / folder), TrainingRecipe(warmup_steps=4, accumulate=2), max_steps=4, valid_every=4, verbose=0
        )
        keras.utils.set_random_seed(seed)
        model = kt.Transformer(kt.TransformerBackbone(vocabulary_size=tokenizer.vocabulary_size(), **TINY))
        trainer.compile(model)
        return trainer, model

    trainer, uninterrupted = trainer_and_model("uninterrupted", 0)
    assert trainer.fit(uninterrupted, batches()).step == 4

    trainer, killed = trainer_and_model("resumed", 0)
    with pytest.raises(Interrupted):
        trainer.fit(killed, batches(), callbacks=[TimePassesThenKill()])
    # The checkpoint due at micro-batch 3 waited for its update to end.
    assert [os.path.basename(p) for p in checkpoints.list_checkpoints(trainer.checkpoint_directory)] == [
        "ckpt-00000002.npz"
    ]
    trainer, resumed = trainer_and_model("resumed", 1)
    step = trainer.resume(resumed)
    assert trainer.fit(resumed, batches(skip=step * 2), step=step).step == 4
    for a, b in zip(resumed.get_weights(), uninterrupted.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("strategy", ["mirrored", "jax-data-parallel", "bogus"])
def test_strategy_on_the_wrong_backend_is_a_clear_error(strategy):
    backend = keras.config.backend()
    if (strategy, backend) in (("mirrored", "tensorflow"), ("jax-data-parallel", "jax")):
        pytest.skip(f"{strategy} works on {backend}; multi-device tests cover it")
    with pytest.raises(ValueError, match="backend|Unknown strategy"):
        distribution.training_scope(strategy)


def test_architecture_from_flags_when_the_preset_is_unknown():
    parser = argparse.ArgumentParser()
    train_command.add_arguments(parser)
    base = ["--src", "s", "--out", "o", "--preset", "no_such_preset"]
    with pytest.raises(cli.UserError, match="--layers --hidden-dim --ff-dim --heads"):
        train_command.resolve_architecture(parser.parse_args(base))
    flags = ["--layers", "2", "--hidden-dim", "8", "--ff-dim", "16", "--heads", "2"]
    config = train_command.resolve_architecture(parser.parse_args(base + flags))
    assert config == dict(num_encoder_layers=2, num_decoder_layers=2, hidden_dim=8, intermediate_dim=16, num_heads=2)
    tiny = train_command.resolve_architecture(parser.parse_args(base[:-1] + ["transformer_tiny", "--dropout", "0.1"]))
    assert (tiny["hidden_dim"], tiny["num_heads"], tiny["dropout"]) == (128, 4, 0.1)


def write_corpus(folder, pairs, copies):
    paths = {}
    for name, side in (("train.en.gz", 0), ("train.de.gz", 1)):
        with gzip.open(folder / name, "wt", encoding="utf-8") as f:
            f.write("".join(p[side] + "\n" for p in pairs * copies))
        paths[name] = str(folder / name)
    return paths["train.en.gz"], paths["train.de.gz"]


def test_train_resume_and_average_commands(tmp_path, pairs, capsys):
    source, target = write_corpus(tmp_path, pairs, copies=5)
    run = tmp_path / "run"
    command = [
        "train",
        "--src",
        source,
        "--tgt",
        target,
        "--valid-src",
        source,
        "--valid-tgt",
        target,
        "--preset",
        "no_such_preset",
        *TINY_TRAIN_ARGUMENTS,
        "--checkpoint-every-steps",
        "2",
        "--valid-every",
        "3",
        "--out",
        str(run),
    ]
    assert cli.main(command + ["--max-steps", "6"]) == 0
    assert (run / "vocabulary.spm").exists() and (run / CURVES_PNG).exists()
    assert (run / "data" / "manifest.json").exists()  # the training text, prepared once
    curves = read_curves(str(run / CURVES_CSV))
    assert [r["step"] for r in curves] == [3, 6]
    assert all(0.0 <= r["val_bleu"] <= 100.0 for r in curves)  # the validation BLEU curve
    assert os.listdir(run / "logs")  # TensorBoard
    names = [os.path.basename(p) for p in checkpoints.list_checkpoints(str(run / "checkpoints"))]
    assert names == ["ckpt-00000002.npz", "ckpt-00000004.npz", "ckpt-00000006.npz"]

    capsys.readouterr()
    assert cli.main(command + ["--max-steps", "8"]) == 0
    output = capsys.readouterr().out
    assert "resuming from" in output and "at step 6" in output
    assert "using the training data this run prepared" in output and "preparing" not in output
    assert "reshuffled from here, with seed 7" in output  # the default --seed 1, plus the step
    assert os.path.exists(run / "checkpoints" / "ckpt-00000008.npz")

    preset = tmp_path / "preset"
    assert cli.main(["average", str(run), "--last", "2", "--out", str(preset)]) == 0
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".preset")]  # no temporary left
    model = kt.Transformer.from_preset(str(preset))
    expected = checkpoints.average_checkpoints(checkpoints.list_checkpoints(str(run / "checkpoints"))[-2:])
    for loaded, mean in zip(model.get_weights(), expected):
        np.testing.assert_allclose(loaded, mean, rtol=1e-6)
    assert isinstance(model.translate("a dog runs .", beam_size=2), str)
    assert cli.main(["average", str(run), "--out", str(preset)]) == 1  # exists: needs --overwrite

    half = tmp_path / "half"
    assert cli.main(["average", str(run), "--last", "2", "--out", str(half), "--weights-dtype", "float16"]) == 0
    with h5py.File(half / "model.weights.h5") as weights_file:
        dtypes = set()
        weights_file.visititems(lambda _, item: dtypes.add(str(item.dtype)) if isinstance(item, h5py.Dataset) else None)
    assert dtypes == {"float16"}
    for loaded, mean in zip(kt.Transformer.from_preset(str(half)).get_weights(), expected):
        np.testing.assert_allclose(loaded, mean, atol=1e-2)


def test_accumulation_logs_the_validation_token_mean_and_the_next_updates_learning_rate(tmp_path, pairs):
    # 2 updates of 1 batch or of 2 micro-batches, the same validation batches,
    # and a learning rate so low that the weights barely move: both runs
    # validate the same model on the same batches.
    source, target = write_corpus(tmp_path, pairs, copies=5)
    command = [
        "train",
        "--src",
        source,
        "--tgt",
        target,
        "--valid-src",
        source,
        "--valid-tgt",
        target,
        *TINY_TRAIN_ARGUMENTS,
        "--peak-lr",
        "1e-9",
        "--max-steps",
        "2",
        "--valid-every",
        "1",
        "--valid-bleu-sentences",
        "0",
    ]
    curves = {}
    for accumulate in (1, 2):
        run = tmp_path / f"accumulate_{accumulate}"
        assert cli.main(command + ["--accumulate", str(accumulate), "--out", str(run)]) == 0
        curves[accumulate] = read_curves(str(run / CURVES_CSV))
    plain, accumulated = curves[1], curves[2]
    assert [r["step"] for r in accumulated] == [r["step"] for r in plain] == [1, 2]
    for one, other in zip(plain, accumulated):
        np.testing.assert_allclose(other["val_loss"], one["val_loss"], rtol=1e-5)
        np.testing.assert_allclose(other["learning_rate"], one["learning_rate"], rtol=1e-5)
    # Without accumulation, the logged rate is the schedule's at the next update.
    schedule = kt.TransformerSchedule.with_peak(1e-9, 4, 16)
    assert [r["learning_rate"] for r in plain] == pytest.approx([float(schedule(1)), float(schedule(2))], rel=1e-5)


def test_train_command_reports_bad_input(tmp_path, capsys):
    (tmp_path / "a.en").write_text("one\ntwo\n")
    (tmp_path / "a.de").write_text("eins\n")
    command = [
        "train",
        "--src",
        str(tmp_path / "a.en"),
        "--tgt",
        str(tmp_path / "a.de"),
        "--preset",
        "transformer_tiny",
        "--out",
        str(tmp_path / "run"),
    ]
    assert cli.main(command) == 1
    assert "goes on at line 2" in capsys.readouterr().err


@pytest.mark.slow
def test_training_on_multi30k_lowers_the_loss_and_beats_an_untrained_model(multi30k, tmp_path):
    from itertools import islice

    lines = {}
    for language in ("en", "de"):
        with gzip.open(multi30k / "raw" / f"train.{language}.gz", "rt", encoding="utf-8") as f:
            lines[language] = [line for line in islice(f, 400)]
    for split, part in (("train", slice(0, 300)), ("val", slice(300, 400))):
        for language in ("en", "de"):
            (tmp_path / f"{split}.{language}").write_text("".join(lines[language][part]), encoding="utf-8")
    run = tmp_path / "run"
    command = [
        "train",
        "--src",
        str(tmp_path / "train.en"),
        "--tgt",
        str(tmp_path / "train.de"),
        "--valid-src",
        str(tmp_path / "val.en"),
        "--valid-tgt",
        str(tmp_path / "val.de"),
        "--layers",
        "2",
        "--hidden-dim",
        "64",
        "--ff-dim",
        "128",
        "--heads",
        "4",
        "--dropout",
        "0.1",
        "--vocab-size",
        "1000",
        "--tokens-per-batch",
        "1024",
        "--max-steps",
        "120",
        "--warmup-steps",
        "40",
        "--peak-lr",
        "0.005",
        "--valid-every",
        "40",
        "--checkpoint-every-steps",
        "40",
        "--verbose",
        "0",
        "--out",
        str(run),
    ]
    assert cli.main(command) == 0
    curves = read_curves(str(run / CURVES_CSV))
    assert curves[-1]["loss"] < curves[0]["loss"] - 0.5
    assert curves[-1]["val_loss"] < curves[0]["val_loss"]

    # Translations get closer to the references than an untrained model's.
    from keras_transformer.evaluation.bleu import evaluate_model

    preset = tmp_path / "preset"
    assert cli.main(["average", str(run), "--last", "1", "--out", str(preset)]) == 0
    trained = kt.Transformer.from_preset(str(preset))
    keras.utils.set_random_seed(5)
    untrained = kt.Transformer(kt.TransformerBackbone.from_config(trained.backbone.get_config()), trained.preprocessor)
    sources = [s.strip() for s in lines["en"][300:360]]
    references = [s.strip() for s in lines["de"][300:360]]
    scores = [
        evaluate_model(model, sources, references, beam_size=None, max_extra_length=20, verbose=0)[1]
        for model in (untrained, trained)
    ]
    assert scores[1].chrf > scores[0].chrf + 5
    assert scores[1].bleu >= scores[0].bleu


def _recorded_orders(model, pairs, monkeypatch, **fit_options) -> dict[str, list[int]]:
    """The indices of `pairs` that the train and test steps of two epochs of
    `fit` on lists of strings get, in order; the steps compute nothing."""
    texts = {"encoder_text": [p[0] for p in pairs], "decoder_text": [p[1] for p in pairs]}
    x, y, weights = model.preprocessor(texts)
    index_of = {tuple(row): index for index, row in enumerate(keras.ops.convert_to_numpy(x["encoder_token_ids"]))}
    seen = {"train_step": [], "test_step": []}

    def recording_step(indices, *args):
        # JAX's steps take the state before the batch and return it after the logs.
        x = args[-1][0]
        indices.extend(index_of[tuple(row)] for row in keras.ops.convert_to_numpy(x["encoder_token_ids"]))
        logs = {"loss": 0.0}  # TensorFlow's trainer refuses empty logs
        return (logs, args[0]) if len(args) == 2 else logs

    for name, indices in seen.items():
        monkeypatch.setattr(model, name, functools.partial(recording_step, indices))
    model.compile(run_eagerly=True, jit_compile=False)  # eager: the steps see the values
    # Keras' TensorFlow trainer builds the metrics in the first real step, and these steps compute nothing.
    model.compute_metrics(x, y, model(x), weights)
    model.fit(texts, batch_size=2, epochs=2, verbose=0, **fit_options)
    return seen


def test_fit_on_lists_reshuffles_every_epoch_unless_told_not_to(tokenizer, pairs, monkeypatch):
    keras.utils.set_random_seed(0)
    trained = _recorded_orders(make_model(tokenizer), pairs, monkeypatch)["train_step"]
    first, second = trained[: len(pairs)], trained[len(pairs) :]
    in_order = list(range(len(pairs)))
    assert sorted(first) == sorted(second) == in_order  # each epoch sees every pair once
    assert first != second  # in a new order each epoch
    unshuffled = _recorded_orders(make_model(tokenizer), pairs, monkeypatch, shuffle=False)
    assert unshuffled["train_step"] == in_order + in_order


def test_fit_holds_out_the_last_examples_before_shuffling(tokenizer, pairs, monkeypatch):
    keras.utils.set_random_seed(0)
    seen = _recorded_orders(make_model(tokenizer), pairs, monkeypatch, validation_split=1 / 3)
    assert sorted(seen["train_step"]) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert seen["test_step"] == [4, 5, 4, 5]  # validated on in order, after each epoch
