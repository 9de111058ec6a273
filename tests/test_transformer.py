import gc
import weakref

import keras
import keras_hub
import numpy as np
import pytest
from keras import ops

import keras_transformer as kt
from helpers import PAIRS, TINY_CONFIG, make_model, random_algorithms
from keras_transformer.generation.settings import SearchSettings


def test_compile_defaults_are_the_paper_recipe(tiny_model):
    tiny_model.compile()
    optimizer = tiny_model.optimizer
    assert isinstance(optimizer, keras.optimizers.Adam)
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)
    schedule = optimizer._learning_rate
    assert isinstance(schedule, kt.TransformerSchedule)
    assert (schedule.hidden_dim, schedule.warmup_steps) == (16, 4000)
    assert isinstance(tiny_model.loss, kt.LabelSmoothedCrossEntropy)
    assert tiny_model.loss.label_smoothing == 0.1


@pytest.mark.parametrize("step", [1, 100, 4000, 10000])
def test_schedule_is_section_5_3(step):
    schedule = kt.TransformerSchedule(hidden_dim=512, warmup_steps=4000)
    expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
    assert float(schedule(step - 1)) == pytest.approx(expected, rel=1e-5)


def test_schedule_with_peak_reaches_the_peak():
    schedule = kt.TransformerSchedule.with_peak(0.005, warmup_steps=2000, hidden_dim=128)
    assert float(schedule(1999)) == pytest.approx(0.005, rel=1e-5)
    assert float(schedule(999)) < 0.005 and float(schedule(5000)) < 0.005
    restored = kt.TransformerSchedule.from_config(schedule.get_config())
    assert float(restored(1999)) == pytest.approx(0.005, rel=1e-5)


def test_label_smoothing_matches_the_formula_and_ignores_padding():
    rng = np.random.RandomState(0)
    logits = rng.normal(size=(2, 3, 5)).astype("float32")
    labels = np.array([[4, 2, 0], [1, 0, 0]])
    loss = float(kt.LabelSmoothedCrossEntropy(0.1)(labels, logits))
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    # Smoothing mass goes to the real tokens only, not <pad> 0, <unk> 1, <s> 2.
    per_token = [0.9 * -log_p[b, t, labels[b, t]] - 0.1 * log_p[b, t, 3:].mean() for b, t in [(0, 0), (0, 1), (1, 0)]]
    assert loss == pytest.approx(np.mean(per_token), rel=1e-5)
    probabilities = kt.LabelSmoothedCrossEntropy(0.1, from_logits=False)(labels, np.exp(log_p))
    assert float(probabilities) == pytest.approx(loss, rel=1e-5)
    # Changing the logits at padded positions changes nothing.
    logits[0, 2] += 100.0
    assert float(kt.LabelSmoothedCrossEntropy(0.1)(labels, logits)) == pytest.approx(loss, rel=1e-6)


def _logits_gradient(loss, labels, logits):
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return np.asarray(jax.grad(lambda z: loss(labels, z))(logits))
    if backend == "tensorflow":
        import tensorflow as tf

        z = tf.constant(logits)
        with tf.GradientTape() as tape:
            tape.watch(z)
            value = loss(labels, z)
        return tape.gradient(value, z).numpy()
    import torch

    z = torch.tensor(logits, requires_grad=True)
    loss(torch.tensor(labels), z).backward()
    return z.grad.numpy()


def test_label_smoothing_gradient_is_softmax_minus_the_smoothed_target():
    rng = np.random.RandomState(1)
    logits = rng.normal(size=(2, 3, 6)).astype("float32")
    labels = np.array([[4, 2, 0], [5, 3, 0]])
    gradient = _logits_gradient(kt.LabelSmoothedCrossEntropy(0.1), labels, logits)
    target = np.zeros_like(logits)
    target[..., 3:] = 0.1 / 3  # <pad>, <unk> and <s> get no smoothing mass
    target += 0.9 * np.eye(6, dtype="float32")[labels]
    softmax = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    real_tokens = (labels != 0)[..., None]
    expected = (softmax - target) * real_tokens / real_tokens.sum()
    np.testing.assert_allclose(gradient, expected, atol=1e-6)


def test_masked_accuracy_ignores_padding():
    metric = kt.MaskedAccuracy()
    labels = np.array([[5, 6, 0, 0]])
    predictions = np.eye(8)[[[5, 1, 0, 0]]].astype("float32")  # padding "predicted right"
    metric.update_state(labels, predictions)
    assert float(metric.result()) == pytest.approx(0.5)


def test_masked_accuracy_equals_keras_argmax_accuracy_on_real_tokens():
    rng = np.random.default_rng(0)
    labels = rng.integers(1, 50, size=(4, 30))
    labels[:, 20:] = 0  # padding
    logits = rng.normal(size=(4, 30, 50)).astype("float32")
    logits[:, :10] += 10 * np.eye(50)[labels[:, :10]]  # a third of the real tokens right
    reference = keras.metrics.SparseCategoricalAccuracy()
    reference.update_state(labels, logits, sample_weight=(labels != 0).astype("float32"))
    metric = kt.MaskedAccuracy()
    metric.update_state(labels, logits)
    assert float(metric.result()) == pytest.approx(float(reference.result()), abs=1e-7)
    assert 0.4 < float(metric.result()) < 0.7
    restored = kt.MaskedAccuracy.from_config(kt.MaskedAccuracy(pad_token_id=3, name="acc").get_config())
    assert (restored.pad_token_id, restored.name) == (3, "acc")


def test_tiny_model_memorises_pairs_and_reproduces_them(trained_model):
    sources = [p[0] for p in PAIRS]
    targets = [p[1] for p in PAIRS]
    assert trained_model.translate(sources, beam_size=None) == targets
    assert trained_model.translate(sources, beam_size=4) == targets
    assert trained_model.translate(sources[0]) == targets[0]


def test_beam_one_equals_greedy_on_a_model(trained_model):
    sources = [p[0] for p in PAIRS] + ["a dog sleeps .", "two women walk ."]
    greedy = trained_model.generate(sources, beam_size=None)
    assert trained_model.generate(sources, beam_size=1, alpha=0.0) == greedy


def test_fit_on_token_ids_without_preprocessor(tokenizer):
    keras.utils.set_random_seed(1)
    model = make_model(tokenizer)
    x, y, w = model.preprocessor({"encoder_text": [p[0] for p in PAIRS], "decoder_text": [p[1] for p in PAIRS]})
    x = {k: ops.convert_to_numpy(v) for k, v in x.items()}
    bare = kt.Transformer(backbone=model.backbone, preprocessor=None)
    bare.compile(optimizer=keras.optimizers.Adam(0.01))
    history = bare.fit(x, ops.convert_to_numpy(y), batch_size=3, epochs=5, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    out = bare.generate(
        {"encoder_token_ids": x["encoder_token_ids"], "encoder_padding_mask": x["encoder_padding_mask"]}, beam_size=2
    )
    assert out["decoder_token_ids"].shape[0] == len(PAIRS)
    assert (out["decoder_token_ids"][:, 0] == tokenizer.start_token_id).all()


def test_the_first_fit_runs_the_training_step_function_once(tokenizer, monkeypatch):
    # Compiled backends trace `train_step` once per program; before the
    # optimizer was built ahead of the first step, TensorFlow traced it twice
    # (once to create the optimizer's variables), doubling the first call.
    model = make_model(tokenizer)
    model.compile()
    x, y, w = model.preprocessor({"encoder_text": [p[0] for p in PAIRS], "decoder_text": [p[1] for p in PAIRS]})
    x, y, w = keras.tree.map_structure(ops.convert_to_numpy, (x, y, w))
    calls = []
    original = kt.Transformer.train_step
    monkeypatch.setattr(kt.Transformer, "train_step", lambda self, *args: calls.append(1) or original(self, *args))
    model.fit(x, y, sample_weight=w, batch_size=len(PAIRS), epochs=1, verbose=0)
    assert len(calls) == 1
    assert int(ops.convert_to_numpy(model.optimizer.iterations)) == 1


@pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="Threefry masks are for TensorFlow + XLA")
@pytest.mark.parametrize("jit_compile", [True, False])
def test_every_dropout_of_a_compiled_training_step_draws_threefry_masks(tokenizer, jit_compile):
    import tensorflow as tf

    model = make_model(tokenizer, dropout=0.1)
    model.compile(jit_compile=jit_compile)
    x, y, w = model.preprocessor({"encoder_text": [p[0] for p in PAIRS], "decoder_text": [p[1] for p in PAIRS]})
    x, y, w = keras.tree.map_structure(ops.convert_to_numpy, (x, y, w))
    # Fit first: it builds the optimizer, so the step below is traced once
    # (a tf.function that creates variables is traced twice).
    assert np.isfinite(float(model.fit(x, y, sample_weight=w, epochs=1, verbose=0).history["loss"][0]))
    # What Keras traces into its training function (XLA-compiled when jit_compile).
    step = tf.function(lambda x, y, w: model.train_step((x, y, w)), jit_compile=jit_compile)
    traced = step.get_concrete_function(x, y, w)
    # Two embedding dropouts, two residual dropouts per encoder block, three per decoder block.
    expected_count = 2 + 2 * TINY_CONFIG["num_encoder_layers"] + 3 * TINY_CONFIG["num_decoder_layers"]
    ops_found = [op for op in traced.graph.get_operations() if op.type == "StatelessRandomUniformV2"]
    assert len(ops_found) == expected_count
    assert random_algorithms(traced) == ({2} if jit_compile else {3})  # Threefry only where XLA compiles the step


def logits_of(model, pairs=PAIRS):
    x, _, _ = model.preprocessor({"encoder_text": [p[0] for p in pairs], "decoder_text": [p[1] for p in pairs]})
    return ops.convert_to_numpy(model(x))


def test_keras_file_round_trip(trained_model, tmp_path):
    path = tmp_path / "model.keras"
    trained_model.save(path)
    restored = keras.saving.load_model(path)
    assert isinstance(restored, kt.Transformer)
    np.testing.assert_allclose(logits_of(restored), logits_of(trained_model), atol=1e-5)
    sources = [p[0] for p in PAIRS]
    assert restored.translate(sources) == trained_model.translate(sources)


def test_preset_round_trip(trained_model, tmp_path):
    trained_model.save_to_preset(str(tmp_path / "preset"))
    restored = kt.Transformer.from_preset(str(tmp_path / "preset"))
    np.testing.assert_allclose(logits_of(restored), logits_of(trained_model), atol=1e-5)
    sources = [p[0] for p in PAIRS]
    assert restored.translate(sources) == trained_model.translate(sources)


def test_quantize_int8_quantizes_the_backbone_and_recompiles_the_search(trained_model, tmp_path):
    trained_model.save_to_preset(str(tmp_path / "preset"))
    model = kt.Transformer.from_preset(str(tmp_path / "preset"))  # a copy: the fixture stays float32
    sources = [p[0] for p in PAIRS]
    model.translate(sources)  # compiles a float32 search, which quantize must drop
    float_logits = logits_of(model)
    ids = np.arange(8)[None, :]
    float_embedded = ops.convert_to_numpy(model.backbone.token_embedding(ids))
    float_kernel = weakref.ref(model.backbone.decoder_blocks[0].feed_forward.inner.kernel)
    model.quantize("int8")  # keras.Model.quantize would refuse the tokenizer
    assert any(w.dtype == "int8" for w in model.backbone.weights)
    # The replaced float weights are freed, and the collector is as it was.
    assert float_kernel() is None and gc.get_freeze_count() == 0
    # E too (the largest weight); its lookups keep the sqrt(d_model) scale.
    assert model.backbone.token_embedding.quantization_mode == "int8"
    embedded = ops.convert_to_numpy(model.backbone.token_embedding(ids))
    assert np.abs(embedded - float_embedded).max() < 0.02 * np.abs(float_embedded).max()
    assert not model.compiled_searches
    int8_logits = logits_of(model)
    # Changed by the quantization, but by a few percent of the logits' range.
    assert 0 < np.abs(int8_logits - float_logits).max() < 0.1 * np.abs(float_logits).max()
    assert all(isinstance(t, str) for t in model.translate(sources))


def test_quantize_freezes_the_collector_only_when_nobody_else_did(monkeypatch):
    from keras_transformer.models.transformer import _older_objects_left_out_of_collections

    with _older_objects_left_out_of_collections():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    gc.freeze()  # a caller's own freeze (e.g. before forking workers) stays
    try:
        # The count alone cannot tell: frozen objects still die by reference
        # counting, so it may drop by a few while the block runs.
        calls = []
        monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
        monkeypatch.setattr(gc, "unfreeze", lambda: calls.append("unfreeze"))
        with _older_objects_left_out_of_collections():
            pass
        assert calls == []
        assert gc.get_freeze_count() > 0
    finally:
        monkeypatch.undo()
        gc.unfreeze()


def test_preprocessor_never_cuts_silently(tokenizer):
    long_text = " ".join(["a dog runs ."] * 20)
    warn = kt.TransformerPreprocessor(tokenizer, 8, 8)
    with pytest.warns(UserWarning, match="1 source sentence"):
        warn({"encoder_text": [long_text, "a dog"], "decoder_text": ["ein", "ein"]})
    strict = kt.TransformerPreprocessor(tokenizer, 8, 8, too_long="error")
    with pytest.raises(ValueError, match="target sentence"):
        strict({"encoder_text": ["a dog"], "decoder_text": [long_text]})
    with pytest.raises(ValueError, match="too_long"):
        kt.TransformerPreprocessor(tokenizer, too_long="truncate")


def test_preprocessor_layout(tokenizer):
    preprocessor = kt.TransformerPreprocessor(tokenizer, 8, 8)
    x, y, w = preprocessor({"encoder_text": ["a dog"], "decoder_text": ["ein hund"]})
    x = {k: ops.convert_to_numpy(v) for k, v in x.items()}
    target = (
        tokenizer("ein hund").numpy().tolist()
        if hasattr(tokenizer("ein hund"), "numpy")
        else list(tokenizer("ein hund"))
    )
    n = len(target)
    assert x["decoder_token_ids"][0, 0] == tokenizer.start_token_id
    assert list(x["decoder_token_ids"][0, 1 : n + 1]) == target
    assert list(ops.convert_to_numpy(y)[0, : n + 1]) == target + [tokenizer.end_token_id]
    assert ops.convert_to_numpy(w)[0].sum() == n + 1


def test_generate_rejects_bad_beam_size(trained_model):
    with pytest.raises(ValueError, match="beam_size"):
        trained_model.generate(["a dog"], beam_size=0)


def test_decoding_compiles_once_per_length_bucket(trained_model):
    if keras.config.backend() != "tensorflow":
        pytest.skip("counts tf.function traces; jax.jit caches by shape the same way")
    trained_model.translate(["a dog runs ."], beam_size=2)
    function = next(iter(trained_model.compiled_searches.values()))
    traces = function.experimental_get_tracing_count()
    # Other sentences of the same batch size and source bucket reuse the graph.
    trained_model.translate(["two cats play ."], beam_size=2)
    trained_model.translate(["a man walks . a dog"], beam_size=2)
    assert function.experimental_get_tracing_count() == traces


def test_a_partial_last_batch_reuses_the_search_of_the_full_batches(trained_model):
    sources = [p[0] for p in PAIRS]  # 6 sentences of one length bucket
    in_batches = trained_model.translate(sources, beam_size=2, batch_size=4)  # batches of 4 and 2
    if keras.config.backend() == "tensorflow":
        function = trained_model.compiled_searches[(SearchSettings(beam_size=2), True)]
        traces = function.experimental_get_tracing_count()
        # Batches of 4 and 1: no new batch size, so no new graph.
        assert trained_model.translate(sources[:5], beam_size=2, batch_size=4) == in_batches[:5]
        assert function.experimental_get_tracing_count() == traces
    assert in_batches == [trained_model.translate(s, beam_size=2) for s in sources]


def test_keras_hub_decoding_api_follows_compile_sampler(trained_model):
    # KerasHub's inherited API works: compile(sampler=...) picks the search
    # that generate, generate_step and make_generate_function then use.
    greedy = trained_model.generate(["a dog runs ."], beam_size=None)
    trained_model.compile(optimizer=keras.optimizers.Adam(0.01), sampler=keras_hub.samplers.GreedySampler())
    try:
        assert trained_model.generate(["a dog runs ."]) == greedy
        packed = trained_model.preprocessor.pack_sources([[5, 6]])
        packed["decoder_token_ids"] = np.zeros((1, 16), "int32")
        stepped = trained_model.generate_step(packed)
        direct = trained_model.make_generate_function()(packed)
        np.testing.assert_array_equal(
            ops.convert_to_numpy(stepped["decoder_token_ids"]), ops.convert_to_numpy(direct["decoder_token_ids"])
        )
        with pytest.raises(ValueError, match="greedy or beam search"):
            trained_model.compile(sampler="top_k")
        with pytest.raises(ValueError, match="stops at the end token"):
            trained_model.generate(["a dog"], stop_token_ids=[7])
        assert trained_model.generate(["a dog runs ."], stop_token_ids=[3]) == greedy
    finally:
        trained_model.compile(optimizer=keras.optimizers.Adam(0.01), label_smoothing=0.0)


def test_generate_searches_a_short_buffer_first_and_the_full_one_only_if_needed(trained_model, monkeypatch):
    from keras_transformer.models import transformer_generation

    buffers = []
    search = trained_model._search

    def recording(token_ids, settings, buffer_length, **kwargs):
        buffers.append(buffer_length)
        return search(token_ids, settings, buffer_length, **kwargs)

    monkeypatch.setattr(trained_model, "_search", recording)
    sources = [pair[0] for pair in PAIRS]
    source_length = 16  # pack_sources pads these to one bucket
    full = trained_model.generate(sources, max_length=source_length + 50)
    assert buffers == [source_length + 50]

    buffers.clear()
    assert trained_model.generate(sources) == full
    assert buffers == [source_length + transformer_generation.FIRST_BUFFER_EXTRA]  # finished within it

    buffers.clear()
    monkeypatch.setattr(transformer_generation, "FIRST_BUFFER_EXTRA", 2 - source_length)  # room for one token
    assert trained_model.generate(sources) == full
    assert buffers == [2, source_length + 50]  # not finished: searched again

    # Token ids in, token ids out: as wide as the full buffer, whichever search found them.
    monkeypatch.undo()
    bare = kt.Transformer(trained_model.backbone)
    ids = trained_model.preprocessor.pack_sources([[5, 6, 7]])
    out, full = bare.generate(ids), bare.generate(ids, max_length=source_length + 50)
    assert out["decoder_token_ids"].shape == (1, source_length + 50) == out["decoder_padding_mask"].shape
    for key in out:
        np.testing.assert_array_equal(out[key], full[key])


def test_a_target_prefix_fits_a_short_max_length(trained_model):
    # Prompts are padded to a multiple of 16 positions; max_length only has to hold the real prefix.
    inputs = {"encoder_text": ["two dogs play .", "a dog runs ."], "decoder_text": ["zwei", "ein hund"]}
    greedy = trained_model.generate(inputs, max_length=8, beam_size=None)
    # The prefixes begin the memorised translations, which greedy search continues as it would without them.
    assert greedy == trained_model.generate(inputs["encoder_text"], max_length=8, beam_size=None)
    for outputs in (greedy, trained_model.generate(inputs, max_length=8, beam_size=2)):
        for output, prefix in zip(outputs, inputs["decoder_text"]):
            assert output.startswith(prefix + " ")  # the prefix, then what the search added
    # "ein hund" is three pieces: with the start token, four positions.
    with pytest.raises(ValueError, match=r"max_length=4 leaves no room after the target prefix \(4 positions"):
        trained_model.generate({"encoder_text": ["a dog runs ."], "decoder_text": ["ein hund"]}, max_length=4)


def test_generate_on_token_ids_uses_the_backbones_special_ids():
    # A vocabulary whose end token is 5 and whose sources carry no start
    # token (Marian's packing): the search must stop at 5 and count the
    # source's length without special tokens.
    keras.utils.set_random_seed(0)
    backbone = kt.TransformerBackbone(
        vocabulary_size=20,
        num_encoder_layers=1,
        num_decoder_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        pad_token_id=19,
        start_token_id=19,
        end_token_id=5,
    )
    model = kt.Transformer(backbone)
    source = np.array([[7, 8, 9, 5, 19, 19]], "int32")
    out = model.generate(
        {"encoder_token_ids": source, "encoder_padding_mask": source != 19}, beam_size=None, max_extra_length=2
    )
    tokens = out["decoder_token_ids"][0]
    assert tokens[0] == 19  # the start token
    length = int(np.argmax(tokens == 5))  # where the end token is
    assert 1 <= length <= 3 + 2 + 1  # source tokens 7 8 9, plus 2, then the end token
    assert np.all(tokens[length + 1 :] == 19) and not np.any(tokens[1:length] == 19)


def test_special_ids_must_agree_with_the_tokenizer(tokenizer):
    backbone = kt.TransformerBackbone(
        vocabulary_size=tokenizer.vocabulary_size(),
        num_encoder_layers=1,
        num_decoder_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        end_token_id=7,
    )
    with pytest.raises(ValueError, match="disagree on special token ids.*end_token_id"):
        kt.Transformer(backbone, kt.TransformerPreprocessor(tokenizer, 8, 8))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        kt.TransformerBackbone(
            vocabulary_size=4,
            num_encoder_layers=1,
            num_decoder_layers=1,
            num_heads=2,
            hidden_dim=8,
            intermediate_dim=16,
            end_token_id=9,
        )


@pytest.mark.parametrize("alpha", [-0.5, float("nan")])
def test_negative_length_penalty_is_refused(trained_model, alpha):
    # The early stop's bound on what a live beam can still reach needs alpha >= 0.
    with pytest.raises(ValueError, match="alpha"):
        trained_model.generate(["a dog"], alpha=alpha)


def test_a_graph_packs_sources_as_translate_does(tiny_model):
    # The SavedModel packs at one static width, then keeps the bucketed
    # length: for sources the model takes whole, what `pack_sources` gives.
    import tensorflow as tf

    preprocessor = tiny_model.preprocessor
    width = tiny_model.max_source_tokens + 2
    in_graph = tf.function(lambda ids: preprocessor.pack_source_tensor(ids, width=width))
    for rows in ([[5, 6, 7], [8]], [[9] * tiny_model.max_source_tokens], [[4, 5] * 3], []):
        packed = preprocessor.pack_sources(rows)
        ids, mask = in_graph(tf.ragged.constant(rows, dtype="int32", ragged_rank=1))
        np.testing.assert_array_equal(ids.numpy(), packed["encoder_token_ids"])
        np.testing.assert_array_equal(mask.numpy(), packed["encoder_padding_mask"])
