import math

import numpy as np
import pytest
from keras import ops

from keras_transformer.layers import (
    DecoderBlock,
    EncoderBlock,
    ScaledSharedEmbedding,
    SinusoidalPositionEncoding,
)


def test_position_encoding_is_the_formula_of_section_3_5():
    d_model, length = 8, 6
    pe = ops.convert_to_numpy(SinusoidalPositionEncoding()(np.zeros((1, length, d_model), "float32")))[0]
    for pos in range(length):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert pe[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-5)
            assert pe[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-5)


def test_position_encoding_start_index_shifts_positions():
    layer = SinusoidalPositionEncoding()
    full = ops.convert_to_numpy(layer(np.zeros((1, 5, 8), "float32")))
    shifted = ops.convert_to_numpy(layer(np.zeros((1, 1, 8), "float32"), start_index=3))
    np.testing.assert_allclose(shifted[0, 0], full[0, 3], atol=1e-6)


def test_shared_embedding_scales_by_sqrt_d_model_and_reverse_is_the_transpose():
    layer = ScaledSharedEmbedding(input_dim=10, output_dim=4)
    ids = np.array([[1, 7]])
    embedded = ops.convert_to_numpy(layer(ids))
    matrix = ops.convert_to_numpy(layer.embeddings)
    np.testing.assert_allclose(embedded[0], matrix[[1, 7]] * 2.0, rtol=1e-6)  # sqrt(4)
    hidden = np.random.rand(1, 3, 4).astype("float32")
    np.testing.assert_allclose(
        ops.convert_to_numpy(layer(hidden, reverse=True)), hidden @ matrix.T, rtol=1e-5, atol=1e-6
    )


def test_embedding_init_gives_unit_variance_after_scaling():
    layer = ScaledSharedEmbedding(input_dim=4000, output_dim=64)
    embedded = ops.convert_to_numpy(layer(np.arange(4000)[None]))
    assert np.std(embedded) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("block_cls", [EncoderBlock, DecoderBlock])
def test_post_ln_output_is_normalised_and_pre_ln_is_not(block_cls):
    x = np.random.RandomState(0).normal(3.0, 5.0, (2, 4, 8)).astype("float32")
    args = (x,) if block_cls is EncoderBlock else (x, x)
    post = ops.convert_to_numpy(block_cls(intermediate_dim=16, num_heads=2)(*args))
    pre = ops.convert_to_numpy(block_cls(intermediate_dim=16, num_heads=2, normalize_first=True)(*args))
    # Post-LN (the paper): LayerNorm is the last operation of every sublayer.
    np.testing.assert_allclose(post.mean(-1), 0.0, atol=1e-4)
    np.testing.assert_allclose(post.std(-1), 1.0, atol=1e-2)
    # Pre-LN ends with a residual sum, not a LayerNorm.
    assert np.abs(pre.mean(-1)).max() > 0.1


@pytest.mark.parametrize(
    "layer",
    [
        SinusoidalPositionEncoding(),
        ScaledSharedEmbedding(10, 4),
        EncoderBlock(16, 2, dropout=0.2, normalize_first=True),
        DecoderBlock(16, 2, dropout=0.3, attention_dropout=0.1),
    ],
)
def test_layers_round_trip_their_config(layer):
    restored = layer.__class__.from_config(layer.get_config())
    assert restored.get_config() == layer.get_config()


def test_encoder_padding_mask_reaches_attention():
    block = EncoderBlock(intermediate_dim=16, num_heads=2, dropout=0.0)
    x = np.random.rand(1, 4, 8).astype("float32")
    mask = np.array([[1, 1, 1, 0]])
    out = ops.convert_to_numpy(block(x, padding_mask=mask))
    x_changed = x.copy()
    x_changed[0, 3] += 10.0  # change only the padded position
    out_changed = ops.convert_to_numpy(block(x_changed, padding_mask=mask))
    np.testing.assert_allclose(out[0, :3], out_changed[0, :3], atol=1e-5)


def _block_outputs(block_cls, training, **kwargs):
    block = block_cls(intermediate_dim=16, num_heads=2, dropout=0.0, **kwargs)
    rng = np.random.default_rng(0)
    args = [rng.random((2, 6, 8), dtype="float32")]
    if block_cls is DecoderBlock:
        args.append(rng.random((2, 5, 8), dtype="float32"))
    return [ops.convert_to_numpy(block(*args, training=training)) for _ in range(2)]


@pytest.mark.parametrize("block_cls", [EncoderBlock, DecoderBlock])
def test_attention_weights_have_no_dropout_by_default(block_cls):
    # Section 5.4: dropout on sublayer outputs and embedding sums only; with
    # those at 0, training-mode calls must be deterministic.
    first, second = _block_outputs(block_cls, training=True)
    np.testing.assert_array_equal(first, second)


@pytest.mark.parametrize("block_cls", [EncoderBlock, DecoderBlock])
def test_attention_dropout_drops_attention_weights_when_asked(block_cls):
    first, second = _block_outputs(block_cls, training=True, attention_dropout=0.5)
    assert np.abs(first - second).max() > 1e-3
    first, second = _block_outputs(block_cls, training=False, attention_dropout=0.5)
    np.testing.assert_array_equal(first, second)


@pytest.mark.parametrize("block_cls", [EncoderBlock, DecoderBlock])
def test_attention_kernels_have_the_glorot_scale_of_a_d_model_matrix(block_cls):
    # Glorot for a 64 x 64 matrix: uniform(+-sqrt(6 / 128)), std sqrt(2 / 128).
    # Keras' own fans for the (64, 4, 16) kernel would give std 0.016.
    block = block_cls(intermediate_dim=16, num_heads=4)
    args = [np.zeros((1, 3, 64), "float32")] * (2 if block_cls is DecoderBlock else 1)
    block(*args)
    for attention in block._attention_layers():
        for dense in (attention._query_dense, attention._key_dense, attention._value_dense, attention._output_dense):
            kernel = ops.convert_to_numpy(dense.kernel)
            assert kernel.size == 64 * 64
            np.testing.assert_allclose(kernel.std(), np.sqrt(2 / 128), rtol=0.05)
