"""The speed path `direct_calls`: attached, layers skip Keras' `Layer.__call__` on torch and eager
TensorFlow where it adds nothing, with Keras' values to the bit, and go through it otherwise."""

import keras
import numpy as np
import pytest
from keras import ops

from helpers import make_model
from keras_transformer import speed_paths
from keras_transformer.layers.encoder_block import FeedForward
from keras_transformer.layers.scaled_shared_embedding import ScaledSharedEmbedding
from keras_transformer.layers.sinusoidal_position_encoding import SinusoidalPositionEncoding
from keras_transformer.speed_paths.direct_calls import calls_directly

Dense, EinsumDense, LayerNormalization = keras.layers.Dense, keras.layers.EinsumDense, keras.layers.LayerNormalization

ON_TORCH = keras.config.backend() == "torch"
DIRECT = keras.config.backend() in ("torch", "tensorflow")
# The layers of a decoder block's step that are called once or more per step.
STEP_LAYERS = {"query", "key", "value", "attention_output", "inner", "outer", "feed_forward"}
# Every path but this one switched off.
ONLY_DIRECT_CALLS = frozenset(set(speed_paths.PATHS) - {"direct_calls"})
# Layers a torch decoding step leaves out (dropouts) or calls directly, beside the blocks'.
STEP_EXTRAS = {"decoder_embedding_dropout", "logits_bias", "token_embedding", "position_encoding"}


@pytest.fixture
def through_keras(monkeypatch) -> list[str]:
    """The names of the layers called through Keras' `Layer.__call__`."""
    names = []
    keras_call = keras.layers.Layer.__call__

    def recorded(layer, *args, **kwargs):
        names.append(layer.name)
        return keras_call(layer, *args, **kwargs)

    monkeypatch.setattr(keras.layers.Layer, "__call__", recorded)
    return names


def _layers():
    return [
        Dense(6, activation="relu"),
        EinsumDense("abc,cd->abd", output_shape=(None, 6), bias_axes="d"),
        LayerNormalization(),
        FeedForward(intermediate_dim=12),
    ]


@pytest.mark.parametrize("layer", _layers(), ids=lambda layer: type(layer).__name__)
def test_a_direct_call_gives_keras_values(layer, through_keras):
    x = ops.convert_to_tensor(np.random.default_rng(0).normal(size=(2, 3, 4)).astype("float32"))
    layer.build(x.shape)
    expected = ops.convert_to_numpy(layer(x))  # plain
    speed_paths.attach(layer, speed_paths.Runtime(keras.config.backend(), "cpu", paths_off=ONLY_DIRECT_CALLS))
    through_keras.clear()
    direct = ops.convert_to_numpy(layer(x))
    assert (layer.name in through_keras) != DIRECT
    np.testing.assert_array_equal(direct, expected)
    speed_paths.detach(layer)
    assert type(layer) in (Dense, EinsumDense, LayerNormalization, FeedForward)  # the plain class again


def test_keyword_arguments_keras_passes_on_as_they_are_pass_directly(through_keras):
    embedding, positions = ScaledSharedEmbedding(10, 4), SinusoidalPositionEncoding()
    ids = ops.convert_to_tensor(np.array([[1, 2, 3]], "int32"))
    tokens = embedding(ids)  # builds them, through Keras
    positions(tokens)
    for layer in (embedding, positions):
        speed_paths.attach(layer)
    through_keras.clear()
    calls = [
        (embedding, (ids,), {}),
        (embedding, (tokens,), {"reverse": True}),
        (positions, (tokens,), {"start_index": 2}),
        (positions, (tokens,), {"start_index": ops.convert_to_tensor(2, "int32")}),
    ]
    for layer, args, kwargs in calls:
        direct = ops.convert_to_numpy(layer(*args, **kwargs))
        expected = ops.convert_to_numpy(keras.layers.Layer.__call__(layer, *args, **kwargs))
        np.testing.assert_array_equal(direct, expected)
    assert len(through_keras) == len(calls) * (1 + (not DIRECT))  # the reference calls; on JAX all
    through_keras.clear()
    embedding(tokens, reverse=True, training=False)  # Keras resolves `training`
    assert through_keras == [embedding.name]


@pytest.mark.parametrize("run_eagerly", [False, True])
def test_eager_decoding_steps_call_the_blocks_layers_directly(tokenizer, through_keras, run_eagerly):
    model = make_model(tokenizer, use_logits_bias=True, dropout=0.1)
    model.run_eagerly = run_eagerly
    through_keras.clear()  # building it
    model.generate(["a dog runs ."], max_length=6)
    layers_of_steps = STEP_LAYERS | {name for name in through_keras if name.endswith("_norm")}
    if ON_TORCH or (DIRECT and run_eagerly):
        assert not (layers_of_steps | STEP_EXTRAS) & set(through_keras)
    else:  # traced once under XLA, where Keras' name scopes name the compiled operations
        assert STEP_LAYERS | {"logits_bias"} <= set(through_keras)


@pytest.mark.skipif(not DIRECT, reason="direct calls are chosen on torch and TensorFlow only")
def test_what_keras_call_would_change_goes_through_it():
    layer = Dense(3)
    x = ops.ones((2, 4))
    assert not calls_directly(layer, x)  # not built: Keras builds it
    layer(x)
    assert calls_directly(layer, x)
    assert not calls_directly(layer, keras.Input((4,)))  # symbolic
    assert not calls_directly(layer, ops.ones((2, 4), "float16"))  # Keras casts a floating input
    assert calls_directly(layer, ops.ones((2, 4), "int32"))  # and leaves an integer one as it is
    mixed = Dense(3, dtype="mixed_bfloat16")
    mixed.build((2, 4))
    speed_paths.attach(mixed)
    assert not calls_directly(mixed, ops.ones((2, 4), "bfloat16"))  # variables autocast in Keras' scope
    assert keras.backend.standardize_dtype(mixed(x).dtype) == "bfloat16"
    masked = ops.ones((2, 4))
    masked._keras_mask = ops.ones((2,), "bool")
    assert not calls_directly(layer, masked)
