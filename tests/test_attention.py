"""The one attention function: equation 1, and the blocks computing what KerasHub's compute."""

import keras
import keras_hub
import numpy as np
import pytest
from keras import ops

from keras_transformer.layers import DecoderBlock, EncoderBlock
from keras_transformer.layers.attention import causal_mask, scaled_dot_product_attention


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_scaled_dot_product_attention_is_equation_1():
    rng = np.random.default_rng(0)
    shapes = [(2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 6)]  # (batch, heads, queries or keys, d_k or d_v)
    query, keys, values = (rng.normal(size=shape).astype("float32") for shape in shapes)
    mask = rng.random((2, 1, 4, 5)) > 0.3
    mask[..., 0] = True  # every query sees a key
    output, weights = scaled_dot_product_attention(query, np.swapaxes(keys, -1, -2), values, mask)

    expected_weights = _softmax(np.where(mask, query @ np.swapaxes(keys, -1, -2) / np.sqrt(8), -np.inf))
    np.testing.assert_allclose(ops.convert_to_numpy(weights), expected_weights, atol=1e-6)
    np.testing.assert_allclose(ops.convert_to_numpy(output), expected_weights @ values, atol=1e-5)


def test_causal_mask_lets_a_position_see_itself_and_the_past():
    np.testing.assert_array_equal(ops.convert_to_numpy(causal_mask(3))[0], np.tril(np.ones((3, 3), bool)))


def _copy_into_keras_hubs(ours, theirs):
    """Gives KerasHub's block (Keras' attention) the weights of ours, sublayer by sublayer."""
    pairs = [("self_attention", "_self_attention_layer"), ("cross_attention", "_cross_attention_layer")]
    for mine, keras_hubs in pairs:
        if getattr(ours, mine, None) is None:
            continue
        attention, reference = getattr(ours, mine), getattr(theirs, keras_hubs)
        for projection, dense in (
            (attention.query_projection, reference.query_dense),
            (attention.key_projection, reference.key_dense),
            (attention.value_projection, reference.value_dense),
            (attention.output_projection, reference.output_dense),
        ):
            dense.set_weights(projection.get_weights())
        getattr(theirs, f"{keras_hubs}_norm").set_weights(getattr(ours, f"{mine}_norm").get_weights())
    theirs._feedforward_intermediate_dense.set_weights(ours.feed_forward.inner.get_weights())
    theirs._feedforward_output_dense.set_weights(ours.feed_forward.outer.get_weights())
    theirs._feedforward_layer_norm.set_weights(ours.feed_forward_norm.get_weights())


@pytest.mark.parametrize("normalize_first", [False, True], ids=["post-ln", "pre-ln"])
@pytest.mark.parametrize("block_cls", [EncoderBlock, DecoderBlock])
def test_blocks_compute_what_keras_hubs_blocks_compute(block_cls, normalize_first):
    """The blocks (the package's attention function) against KerasHub's
    blocks (Keras' attention) with the same weights, padding included."""
    keras.utils.set_random_seed(1)
    block = block_cls(intermediate_dim=32, num_heads=4, dropout=0.0, normalize_first=normalize_first)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 6, 16)).astype("float32")
    memory = rng.normal(size=(2, 5, 16)).astype("float32")
    x_mask = np.array([[1] * 6, [1] * 4 + [0] * 2], "int32")
    memory_mask = np.array([[1] * 5, [1] * 3 + [0] * 2], "int32")
    arguments = dict(intermediate_dim=32, num_heads=4, dropout=0.0, normalize_first=normalize_first)
    if block_cls is EncoderBlock:
        ours = block(x, padding_mask=x_mask)
        reference = keras_hub.layers.TransformerEncoder(**arguments, layer_norm_epsilon=1e-6)
        reference.build(x.shape)
        _copy_into_keras_hubs(block, reference)
        theirs = reference(x, padding_mask=x_mask)
    else:
        ours = block(x, memory, decoder_padding_mask=x_mask, encoder_padding_mask=memory_mask)
        reference = keras_hub.layers.TransformerDecoder(**arguments, layer_norm_epsilon=1e-6)
        reference.build(x.shape, memory.shape)
        _copy_into_keras_hubs(block, reference)
        theirs = reference(x, memory, decoder_padding_mask=x_mask, encoder_padding_mask=memory_mask)
    np.testing.assert_allclose(ops.convert_to_numpy(ours), ops.convert_to_numpy(theirs), atol=1e-5)


def test_cross_attention_weights_come_with_the_blocks_output():
    block = DecoderBlock(intermediate_dim=32, num_heads=4, dropout=0.0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1, 3, 16)).astype("float32")
    memory = rng.normal(size=(1, 5, 16)).astype("float32")
    memory_mask = np.array([[1, 1, 1, 0, 0]], "int32")
    output, weights = block(x, memory, encoder_padding_mask=memory_mask, return_cross_attention_scores=True)
    np.testing.assert_array_equal(
        ops.convert_to_numpy(output), ops.convert_to_numpy(block(x, memory, encoder_padding_mask=memory_mask))
    )
    weights = ops.convert_to_numpy(weights)
    assert weights.shape == (1, 4, 3, 5)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)
    assert np.all(weights[..., 3:] == 0.0)  # padded source positions get no attention


def test_a_decoder_block_is_called_as_it_was_built():
    block = DecoderBlock(intermediate_dim=32, num_heads=4)
    x = np.zeros((1, 3, 16), "float32")
    block(x, x)
    with pytest.raises(ValueError, match="built with an encoder-decoder attention"):
        block(x)
