import math

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer import TransformerBackbone
from keras_transformer.layers import (
    DecoderBlock,
    EncoderBlock,
    ScaledSharedEmbedding,
    SinusoidalPositionEncoding,
)
from keras_transformer.layers.multi_head_attention import MultiHeadAttention


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


@pytest.mark.parametrize("tie_weights", [True, False])
def test_the_output_projection_computes_in_the_policys_dtype(tie_weights):
    layer = ScaledSharedEmbedding(input_dim=10, output_dim=4, tie_weights=tie_weights, dtype="mixed_bfloat16")
    layer.build((None, None))
    hidden = np.random.rand(1, 3, 4).astype("float32")
    logits = layer(ops.cast(hidden, "bfloat16"), reverse=True)
    assert keras.backend.standardize_dtype(logits.dtype) == "bfloat16"  # not promoted by the float32 weights
    matrix = ops.convert_to_numpy(layer.embeddings if tie_weights else ops.transpose(layer.reverse_embeddings))
    expected = hidden @ matrix.T
    np.testing.assert_allclose(ops.convert_to_numpy(ops.cast(logits, "float32")), expected, rtol=0.02, atol=0.02)


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


def test_every_attention_projection_is_its_own_glorot_matrix():
    # Every W^Q, W^K, W^V, W^O of every block of a backbone is drawn on its
    # own (no two equal, nor strongly correlated) with the Glorot scale of a
    # d_model x d_model matrix: std sqrt(2 / (2 d_model)). (An initializer
    # shared between them once made all four equal in every block.)
    backbone = TransformerBackbone(
        vocabulary_size=50,
        num_encoder_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        hidden_dim=64,
        intermediate_dim=32,
    )
    kernels = {}
    attentions = [block.self_attention for block in backbone.encoder_blocks + backbone.decoder_blocks]
    attentions += [block.cross_attention for block in backbone.decoder_blocks]
    for attention in attentions:
        for name in ("query_projection", "key_projection", "value_projection", "output_projection"):
            kernel = getattr(attention, name).kernel
            kernels[f"{attention.path}/{name}"] = ops.convert_to_numpy(kernel).reshape(64, 64)
    assert len(kernels) == 4 * (2 + 2 * 2)
    for path, kernel in kernels.items():
        np.testing.assert_allclose(kernel.std(), np.sqrt(2 / 128), rtol=0.05, err_msg=path)
    flat = np.stack([k.ravel() for k in kernels.values()])
    correlation = np.corrcoef(flat)
    np.fill_diagonal(correlation, 0.0)
    assert np.abs(correlation).max() < 0.1, "two attention projections start (nearly) equal"


SUBLAYERS = {
    EncoderBlock: ("self_attention", "feed_forward"),
    DecoderBlock: ("self_attention", "cross_attention", "feed_forward"),
}


@pytest.mark.parametrize("block_cls", [EncoderBlock, DecoderBlock])
def test_blocks_are_this_packages_layers_with_named_sublayers(block_cls):
    import keras_hub

    block = block_cls(intermediate_dim=16, num_heads=2, dropout=0.3, attention_dropout=0.0)
    block(*[np.zeros((1, 3, 8), "float32")] * (2 if block_cls is DecoderBlock else 1))
    assert not isinstance(block, (keras_hub.layers.TransformerEncoder, keras_hub.layers.TransformerDecoder))
    assert isinstance(block, keras.layers.Layer)
    for name in SUBLAYERS[block_cls]:
        assert isinstance(getattr(block, f"{name}_norm"), keras.layers.LayerNormalization)
        # The softmax weights get the attention dropout; the residual dropouts keep P_drop.
        assert getattr(block, f"{name}_dropout").rate == 0.3
    for name in SUBLAYERS[block_cls][:-1]:
        assert isinstance(getattr(block, name), MultiHeadAttention)
        assert getattr(block, name).weights_dropout.rate == 0.0
    assert [tuple(v.shape) for v in block.feed_forward.weights] == [(8, 16), (16,), (16, 8), (8,)]
    # Every weight belongs to a named sublayer.
    named = {
        id(v)
        for name in SUBLAYERS[block_cls] + tuple(f"{n}_norm" for n in SUBLAYERS[block_cls])
        for v in getattr(block, name).weights
    }
    assert named == {id(v) for v in block.weights}


def test_a_decoder_block_without_encoder_has_no_cross_attention():
    block = DecoderBlock(intermediate_dim=16, num_heads=2)
    block(np.zeros((1, 3, 8), "float32"))
    assert block.cross_attention is None and block.cross_attention_norm is None
    with pytest.raises(ValueError, match="built without"):
        block(np.zeros((1, 3, 8), "float32"), np.zeros((1, 2, 8), "float32"))


@pytest.mark.parametrize("block_cls", [EncoderBlock, DecoderBlock])
def test_a_built_block_round_trips_its_config(block_cls):
    block = block_cls(intermediate_dim=16, num_heads=2, dropout=0.2, attention_dropout=0.1, activation="swish")
    block(*[np.zeros((1, 3, 8), "float32")] * (2 if block_cls is DecoderBlock else 1))
    restored = block_cls.from_config(block.get_config())
    assert restored.get_config() == block.get_config()
    assert restored.attention_dropout == 0.1


def test_a_built_backbone_round_trips_its_config():
    backbone = TransformerBackbone(
        vocabulary_size=50,
        num_encoder_layers=1,
        num_decoder_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        attention_dropout=0.1,
        activation="swish",
        position_encoding_layout="concatenated",
    )
    restored = TransformerBackbone.from_config(backbone.get_config())
    assert restored.get_config() == backbone.get_config()
    assert len(restored.weights) == len(backbone.weights)


@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("layout", ["interleaved", "concatenated"])
def test_position_table_is_float32_exact_under_every_policy(policy, layout):
    # Up to the longest sequence train accepts plus the 50 extra decoding
    # steps; KerasHub's table in bfloat16 made positions 256 and 257 equal.
    length, d_model = 1024 + 50, 64
    layer = SinusoidalPositionEncoding(layout=layout, dtype=policy)
    table = ops.convert_to_numpy(ops.cast(layer(np.zeros((1, length, d_model), "float32")), "float32"))[0]
    angles = np.arange(length)[:, None] / 10000 ** (np.arange(0, d_model, 2)[None, :] / d_model)
    if layout == "interleaved":
        expected = np.stack([np.sin(angles), np.cos(angles)], axis=-1).reshape(length, d_model)
    else:
        expected = np.concatenate([np.sin(angles), np.cos(angles)], axis=-1)
    # Only the final cast rounds: half an ulp at 1.0 of the compute dtype,
    # plus float32's own error on angles up to ~1000.
    tolerance = {"float32": 2e-4, "mixed_float16": 2e-4 + 2**-11, "mixed_bfloat16": 2e-4 + 2**-8}[policy]
    np.testing.assert_allclose(table, expected, atol=tolerance)
    assert not np.array_equal(table[256], table[257])
