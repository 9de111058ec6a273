import numpy as np
import pytest
from keras import ops

import keras_transformer as kt
from helpers import TINY_CONFIG

BASE = dict(num_encoder_layers=6, num_decoder_layers=6, num_heads=8, hidden_dim=512, intermediate_dim=2048)
BIG = dict(num_encoder_layers=6, num_decoder_layers=6, num_heads=16, hidden_dim=1024, intermediate_dim=4096)


def expected_parameters(vocabulary_size, num_encoder_layers, num_decoder_layers, hidden_dim, intermediate_dim, **_):
    """Section 3 by formula: one tied embedding, attention with biases, FFN, LayerNorms."""
    d, f = hidden_dim, intermediate_dim
    attention = 4 * (d * d + d)  # W^Q, W^K, W^V, W^O with biases
    ffn = d * f + f + f * d + d
    norm = 2 * d
    encoder_layer = attention + ffn + 2 * norm
    decoder_layer = 2 * attention + ffn + 3 * norm
    return vocabulary_size * d + num_encoder_layers * encoder_layer + num_decoder_layers * decoder_layer


@pytest.mark.parametrize(
    "config, paper, tolerance",
    # Building the big model's 213M weights takes most of a minute; its count is the same on every backend.
    [(BASE, 65e6, 0.04), pytest.param(BIG, 213e6, 0.02, marks=pytest.mark.slow)],
)
def test_table_3_parameter_counts(config, paper, tolerance):
    backbone = kt.TransformerBackbone(vocabulary_size=37000, **config)
    count = backbone.count_params()
    assert count == expected_parameters(37000, **config)
    assert abs(count - paper) / paper < tolerance


def tiny_backbone(**overrides):
    return kt.TransformerBackbone(vocabulary_size=50, **{**TINY_CONFIG, **overrides})


def batch(source, target, source_mask=None):
    source, target = np.array(source), np.array(target)
    return {
        "encoder_token_ids": source,
        "encoder_padding_mask": np.ones_like(source) if source_mask is None else np.array(source_mask),
        "decoder_token_ids": target,
        "decoder_padding_mask": np.ones_like(target),
    }


@pytest.mark.parametrize("normalize_first", [False, True])
def test_future_target_tokens_do_not_change_earlier_outputs(normalize_first):
    backbone = tiny_backbone(normalize_first=normalize_first)
    source = [[2, 10, 11, 12, 3]]
    out = backbone(batch(source, [[2, 20, 21, 22, 23]]))["decoder_sequence_output"]
    changed = backbone(batch(source, [[2, 20, 21, 40, 41]]))["decoder_sequence_output"]
    out, changed = ops.convert_to_numpy(out), ops.convert_to_numpy(changed)
    np.testing.assert_allclose(out[:, :3], changed[:, :3], atol=1e-5)
    assert np.abs(out[:, 3:] - changed[:, 3:]).max() > 1e-3


def test_extra_source_padding_does_not_change_outputs():
    backbone = tiny_backbone()
    target = [[2, 20, 21]]
    short = backbone(batch([[2, 10, 11, 3]], target))
    padded = backbone(batch([[2, 10, 11, 3, 0, 0, 0]], target, [[1, 1, 1, 1, 0, 0, 0]]))
    np.testing.assert_allclose(
        ops.convert_to_numpy(short["decoder_sequence_output"]),
        ops.convert_to_numpy(padded["decoder_sequence_output"]),
        atol=1e-5,
    )
    np.testing.assert_allclose(
        ops.convert_to_numpy(short["encoder_sequence_output"]),
        ops.convert_to_numpy(padded["encoder_sequence_output"])[:, :4],
        atol=1e-5,
    )


@pytest.mark.parametrize("normalize_first", [False, True])
def test_cached_decoding_equals_full_recomputation(normalize_first):
    backbone = tiny_backbone(normalize_first=normalize_first)
    inputs = batch([[2, 10, 11, 12, 3, 0]], [[2, 20, 21, 22, 23]], [[1, 1, 1, 1, 1, 0]])
    hidden = backbone(inputs)["decoder_sequence_output"]
    full_logits = ops.convert_to_numpy(backbone.token_embedding(hidden, reverse=True))

    encoder_output = backbone.encode(inputs["encoder_token_ids"], inputs["encoder_padding_mask"])
    target = inputs["decoder_token_ids"]
    # A buffer longer than the target: positions after `index` must be masked.
    self_cache = backbone.empty_cache(1, target.shape[1] + 3)
    cross_cache = backbone.cross_attention_cache(encoder_output)
    for index in range(target.shape[1]):
        logits, self_cache = backbone.decode_step(
            target[:, index : index + 1], index, inputs["encoder_padding_mask"], self_cache, cross_cache
        )
        np.testing.assert_allclose(ops.convert_to_numpy(logits)[:, 0], full_logits[:, index], atol=1e-4)


def test_beams_sharing_a_cache_each_read_their_own_history():
    """Beam search keeps hypotheses grown from other beams of the sentence;
    only the table of who owns which slot moves. Each row must still decode
    exactly as a full forward pass of its own tokens."""
    backbone = tiny_backbone()
    rng = np.random.default_rng(0)
    sentences, beams, steps = 2, 3, 6
    source = np.array([[2, 10, 11, 12, 3], [2, 13, 3, 0, 0]])
    source_mask = (source != 0).astype("int32")
    cross_cache = backbone.cross_attention_cache(backbone.encode(source, source_mask))
    cache = backbone.empty_cache(sentences, steps + 2)  # longer than decoded: the rest is masked
    _, cache = backbone.decode_step(np.full((sentences, 1), 2), 0, source_mask, cache, cross_cache)
    cache = backbone.expand_cache(cache, beams)
    histories = np.full((sentences * beams, 1), 2)
    for index in range(1, steps):
        tokens = rng.integers(4, 50, (sentences * beams, 1))
        histories = np.concatenate([histories, tokens], axis=1)
        logits, cache = backbone.decode_step(tokens, index, source_mask, cache, cross_cache)

        full = backbone(batch(np.repeat(source, beams, axis=0), histories, np.repeat(source_mask, beams, axis=0)))
        expected = backbone.logits(full["decoder_sequence_output"])[:, -1]
        np.testing.assert_allclose(ops.convert_to_numpy(logits)[:, 0], ops.convert_to_numpy(expected), atol=1e-4)

        origin = rng.integers(0, beams, (sentences, beams))  # new beam j continues old beam origin[j]
        rows = (origin + np.arange(sentences)[:, None] * beams).reshape(-1)
        histories = histories[rows]
        cache = backbone.reorder_cache(cache, rows, index + 1)


def test_hidden_dim_must_divide_into_heads():
    with pytest.raises(ValueError, match="divisible by num_heads"):
        tiny_backbone(hidden_dim=10, num_heads=4)


def test_backbone_config_round_trip():
    backbone = tiny_backbone(normalize_first=True, dropout=0.2, attention_dropout=0.1)
    restored = kt.TransformerBackbone.from_config(backbone.get_config())
    assert restored.get_config() == backbone.get_config()
    assert restored.count_params() == backbone.count_params()
    assert restored.decoder_blocks[0].cross_attention.weights_dropout.rate == 0.1


def test_configs_saved_before_attention_dropout_load_without_it():
    config = tiny_backbone().get_config()
    del config["attention_dropout"]
    assert kt.TransformerBackbone.from_config(config).attention_dropout == 0.0


def test_a_separate_target_vocabulary_has_its_own_tied_embedding():
    backbone = kt.TransformerBackbone(
        vocabulary_size=40,
        target_vocabulary_size=30,
        use_logits_bias=True,
        pad_token_id=29,
        start_token_id=29,
        end_token_id=0,
        unk_token_id=1,
        **TINY_CONFIG,
    )
    target = ops.convert_to_numpy(backbone.target_token_embedding.embeddings)
    assert target.shape == (30, 16) and backbone.token_embedding.input_dim == 40
    hidden = np.random.default_rng(0).normal(size=(2, 1, 16)).astype("float32")
    np.testing.assert_allclose(ops.convert_to_numpy(backbone.logits(hidden)), hidden @ target.T, rtol=1e-5, atol=1e-5)
    # Decoder tokens read the target matrix; source ids beyond it are fine.
    inputs = {
        "encoder_token_ids": np.array([[35, 39, 0]]),
        "encoder_padding_mask": np.ones((1, 3), "int32"),
        "decoder_token_ids": np.array([[29, 5]]),
        "decoder_padding_mask": np.ones((1, 2), "int32"),
    }
    assert tuple(backbone(inputs)["decoder_sequence_output"].shape) == (1, 2, 16)
    restored = kt.TransformerBackbone.from_config(backbone.get_config())
    assert restored.target_vocabulary_size == 30 and restored.count_params() == backbone.count_params()
    # The shared-vocabulary backbone's count, plus the target matrix and its logits bias.
    assert backbone.count_params() == kt.TransformerBackbone(vocabulary_size=40, **TINY_CONFIG).count_params() + 30 * 17


def test_special_ids_of_a_separate_target_vocabulary_must_be_target_ids():
    with pytest.raises(ValueError, match="outside the target vocabulary of 30"):
        kt.TransformerBackbone(vocabulary_size=40, target_vocabulary_size=30, pad_token_id=35, **TINY_CONFIG)
