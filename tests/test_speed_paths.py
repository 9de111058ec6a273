"""The speed paths, attached to the plain layers at one point (`speed_paths.attach`): chosen from the runtime,
switched off by name, idempotent and thread-safe, leaving configs and weights alone, undone by `detach`, and
each giving the plain layers' outputs (bit for bit where the path claims it; Threefry dropout draws other
masks, so its statistics are tested instead)."""

import threading

import keras
import numpy as np
import pytest
from keras import ops

from helpers import make_model, random_algorithms
from keras_transformer import speed_paths
from keras_transformer.generation.decoding import search_step
from keras_transformer.speed_paths import Runtime
from keras_transformer.speed_paths.direct_calls import DirectCall
from keras_transformer.utils import library_internals

BACKEND = keras.config.backend()
EVERY_PATH = frozenset(speed_paths.PATHS)
# The paths that claim the plain layers' values to the bit.
BIT_FOR_BIT = ("direct_calls", "eager_ops", "in_place_cache_writes")
SOURCES = {
    "encoder_token_ids": np.array([[2, 9, 14, 21, 3, 0], [2, 30, 11, 3, 0, 0]], "int32"),
    "encoder_padding_mask": np.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]], "int32"),
}


def only(*names: str, compiled: bool = False) -> Runtime:
    """This machine's runtime with every path but `names` switched off."""
    machine = speed_paths.describe_runtime()
    return Runtime(BACKEND, machine.device, machine.cpu_flags, machine.cores, EVERY_PATH - set(names), compiled)


def test_every_named_path_is_registered_with_a_reason():
    expected = {
        "bfloat16_products",
        "direct_calls",
        "eager_ops",
        "in_place_cache_writes",
        "threefry_dropout",
        "torch_int8",
        "torch_linear",
    }
    assert expected <= set(speed_paths.PATHS)
    assert all(path.reason and "\n" not in path.reason for path in speed_paths.PATHS.values())


@pytest.mark.parametrize("name", sorted(speed_paths.PATHS))
def test_every_path_is_switched_off_by_name(name, monkeypatch):
    runtime = Runtime(BACKEND, "cpu", frozenset({"avx512_bf16"}), 2, frozenset({name}), compiled=True)
    assert not speed_paths.is_chosen(name, runtime)
    monkeypatch.setenv("KERAS_TRANSFORMER_SPEED_PATHS_OFF", f"another, {name}")
    assert not speed_paths.is_chosen(name)
    monkeypatch.setenv("KERAS_TRANSFORMER_SPEED_PATHS_OFF", "all")
    assert speed_paths.describe_runtime().paths_off == {"all"} and not speed_paths.is_chosen(name)


def test_a_model_with_every_path_off_is_left_plain(tokenizer, monkeypatch):
    model = make_model(tokenizer)
    classes = {id(layer): type(layer) for layer in library_internals.sublayers(model.backbone)}
    monkeypatch.setenv("KERAS_TRANSFORMER_SPEED_PATHS_OFF", "all")
    assert speed_paths.attach(model) == ()
    model.generate(["a dog runs ."], max_length=6)
    assert {id(layer): type(layer) for layer in library_internals.sublayers(model.backbone)} == classes
    assert not any("call" in vars(layer) for layer in library_internals.sublayers(model.backbone))


def test_attaching_is_idempotent_and_detaching_restores_the_plain_layers(tokenizer):
    model = make_model(tokenizer)
    layers = list(library_internals.sublayers(model.backbone))
    plain = {id(layer): (type(layer), dict(vars(layer))) for layer in layers}
    config, weights = model.get_config(), model.get_weights()
    chosen = speed_paths.attach(model)
    assert speed_paths.attach(model) == chosen == speed_paths.attached_paths(model)
    assert model.get_config() == config
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), weights))
    speed_paths.detach(model)
    assert speed_paths.attached_paths(model) == ()
    for layer in layers:
        kind, attributes = plain[id(layer)]
        assert type(layer) is kind and vars(layer).keys() == attributes.keys()


def test_attaching_from_several_threads_attaches_once(tokenizer):
    model = make_model(tokenizer)
    results = []
    threads = [threading.Thread(target=lambda: results.append(speed_paths.attach(model))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(results)) == 1
    speed_paths.detach(model)
    assert not any(vars(layer).get("call") for layer in library_internals.sublayers(model.backbone))


def test_an_attached_model_saves_and_loads_as_a_plain_one(trained_model, tmp_path):
    speed_paths.attach(trained_model)
    trained_model.save(tmp_path / "model.keras")
    restored = keras.saving.load_model(tmp_path / "model.keras")
    speed_paths.detach(trained_model)
    assert not any(isinstance(layer, DirectCall) for layer in library_internals.sublayers(restored))
    for ours, theirs in zip(trained_model.weights, restored.weights):
        assert ours.path == theirs.path
        np.testing.assert_array_equal(ops.convert_to_numpy(ours), ops.convert_to_numpy(theirs))


def test_an_attached_model_quantizes_to_int8(tokenizer):
    model = make_model(tokenizer)
    speed_paths.attach(model)
    model.quantize("int8")
    projections = (
        model.backbone.decoder_blocks[0].feed_forward.inner,
        model.backbone.encoder_blocks[0].self_attention.query_projection,
    )
    assert all(layer.quantization_mode == "int8" for layer in projections)
    speed_paths.detach(model)
    assert all(type(layer) in (keras.layers.Dense, keras.layers.EinsumDense) for layer in projections)


def _search(model, beam_size=3):
    inputs = {name: ops.convert_to_tensor(value) for name, value in SOURCES.items()}
    inputs["decoder_token_ids"] = ops.zeros((2, 10), "int32")

    def run():
        found = search_step(model.backbone, inputs, beam_size=beam_size)
        return ops.convert_to_numpy(found["decoder_token_ids"])

    if BACKEND == "torch":
        import torch

        with torch.inference_mode():  # as `compiled_search` runs it: the caches may be written in place
            return run()
    return run()


def _encoded(model):
    return ops.convert_to_numpy(model.backbone.encode(SOURCES["encoder_token_ids"], SOURCES["encoder_padding_mask"]))


def _step_logits(model):
    """The logits of two decoding steps, the second reading the first's cache."""
    backbone = model.backbone
    encoded = backbone.encode(SOURCES["encoder_token_ids"], SOURCES["encoder_padding_mask"])
    cross = backbone.cross_attention_cache(encoded)
    cache = backbone.empty_cache(2, 4)
    mask = ops.convert_to_tensor(SOURCES["encoder_padding_mask"])
    first, cache = backbone.decode_step(ops.full((2, 1), 2, "int32"), 0, mask, cache, cross)
    second, _ = backbone.decode_step(ops.full((2, 1), 9, "int32"), 1, mask, cache, cross)
    return [ops.convert_to_numpy(first), ops.convert_to_numpy(second)]


@pytest.mark.parametrize("name", BIT_FOR_BIT)
def test_a_bit_for_bit_path_gives_the_plain_layers_values(tokenizer, name):
    model = make_model(tokenizer, use_logits_bias=True)
    plain = (_encoded(model), _step_logits(model), _search(model))
    attached = speed_paths.attach(model, only(name))
    if name not in attached:
        speed_paths.detach(model)
        pytest.skip(f"{name} is not chosen on {BACKEND}")
    encoded, steps, tokens = _encoded(model), _step_logits(model), _search(model)
    speed_paths.detach(model)
    np.testing.assert_array_equal(encoded, plain[0])
    for got, expected in zip(steps, plain[1]):
        np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(tokens, plain[2])


@pytest.mark.skipif(BACKEND != "torch", reason="torch's addmm")
def test_torch_linear_gives_the_plain_layers_values_within_float32_rounding(tokenizer):
    model = make_model(tokenizer, use_logits_bias=True)
    plain = (_encoded(model), _step_logits(model))
    assert speed_paths.attach(model, only("torch_linear")) == ("torch_linear",)
    encoded, steps = _encoded(model), _step_logits(model)
    speed_paths.detach(model)
    # `addmm` adds the bias into the sums: the same values up to float32 rounding.
    np.testing.assert_allclose(encoded, plain[0], rtol=1e-5, atol=1e-5)
    for got, expected in zip(steps, plain[1]):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_every_chosen_path_together_gives_the_plain_translations(tokenizer):
    model = make_model(tokenizer, use_logits_bias=True)
    plain = _search(model)
    speed_paths.attach(model)
    attached = _search(model)
    speed_paths.detach(model)
    np.testing.assert_array_equal(attached, plain)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="Threefry masks are for TensorFlow + XLA")
def test_threefry_dropout_under_xla_draws_threefry_masks_of_the_right_rate():
    import tensorflow as tf

    layer = keras.layers.Dropout(0.1, seed=3)
    x = tf.ones((200, 500))
    speed_paths.attach(layer, only("threefry_dropout"), compiled=True)
    compiled = tf.function(lambda x: layer(x, training=True), jit_compile=True)
    first, second = np.asarray(compiled(x)), np.asarray(compiled(x))
    assert random_algorithms(compiled.get_concrete_function(x)) == {2}  # Threefry
    for y in (first, second):
        np.testing.assert_allclose(np.unique(y), [0.0, 1 / 0.9], rtol=1e-6)  # kept values scaled by 1 / (1 - p)
        assert abs((y == 0).mean() - 0.1) < 0.005
    assert (first != second).mean() > 0.1  # the seed moves on: a new mask every step
    assert np.array_equal(np.asarray(layer(x, training=False)), np.asarray(x))
    # Not for a step without XLA, where TensorFlow has no Threefry kernel: Keras' dropout.
    assert speed_paths.attach(layer, only("threefry_dropout"), compiled=False) == ()
    plain = tf.function(lambda x: layer(x, training=True), jit_compile=True)
    assert random_algorithms(plain.get_concrete_function(x)) == {3}


@pytest.mark.skipif(BACKEND != "jax", reason="JAX's variant of the Threefry masks")
def test_threefry_dropout_on_jax_uses_xla_threefry_with_the_right_rate():
    import jax

    layer = keras.layers.Dropout(0.1, seed=3)
    speed_paths.attach(layer, only("threefry_dropout"))
    x = np.ones((200, 500), "float32")
    first, second = np.asarray(layer(x, training=True)), np.asarray(layer(x, training=True))
    for y in (first, second):
        np.testing.assert_allclose(np.unique(y), [0.0, 1 / 0.9], rtol=1e-6)
        assert abs((y == 0).mean() - 0.1) < 0.005
    assert (first != second).mean() > 0.1  # the seed moves on
    variables = layer.non_trainable_variables

    def stateless_call(values, x):
        with keras.StatelessScope(state_mapping=list(zip(variables, values))):
            return layer(x, training=True)

    program = str(jax.make_jaxpr(stateless_call)([v.value for v in variables], x))
    assert "rng_bit_generator" in program and "THREE_FRY" in program
    assert "threefry2x32" not in program  # not jax.random's Threefry, written in JAX operations
    speed_paths.detach(layer)
    assert "call" not in vars(layer)  # Keras' own dropout again
