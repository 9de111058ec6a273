"""Attention pictures: the weights are the blocks' own, and the PNG shows them."""

import keras
import numpy as np
import pytest
from conftest import make_model

from keras_transformer.generation.attention_maps import (
    attention_maps,
    cross_attention_of_block,
    plot_cross_attention,
    plot_self_attention,
)

SENTENCE = "two dogs play ."


@pytest.mark.parametrize("normalize_first", [False, True], ids=["post-ln", "pre-ln"])
def test_recomputed_cross_attention_is_the_one_inside_each_block(tokenizer, normalize_first):
    """The weights come with the attention output that the block itself
    computes (its weighted sum of values), on the query the block uses."""
    keras.utils.set_random_seed(5)
    backbone = make_model(tokenizer, normalize_first=normalize_first).backbone
    rng = np.random.default_rng(0)
    source_ids = np.array([[2, *rng.integers(4, 60, 6), 3]], "int32")
    source_mask = np.ones_like(source_ids)
    decoder_ids = np.array([[2, *rng.integers(4, 60, 4)]], "int32")
    encoder_output = backbone.encode(source_ids, source_mask)
    length = decoder_ids.shape[1]
    causal_mask = np.tril(np.ones((1, length, length), "int32"))

    x = backbone.embed(decoder_ids, backbone.decoder_embedding_dropout)
    for block in backbone.decoder_blocks:
        cross_attention = block.attention_layers()[1]
        seen = {}
        original_call = cross_attention.call

        def recording_call(query, value, **kwargs):
            output = original_call(query, value, **kwargs)
            seen["output"] = output
            return output

        cross_attention.call = recording_call
        try:
            next_x = block(x, encoder_output, encoder_padding_mask=source_mask)
        finally:
            del cross_attention.call
        output, scores = cross_attention_of_block(
            block, x, encoder_output, causal_mask, source_mask[:, None, :]
        )
        np.testing.assert_allclose(keras.ops.convert_to_numpy(output), keras.ops.convert_to_numpy(seen["output"]), atol=1e-5)
        scores = keras.ops.convert_to_numpy(scores)
        assert scores.shape == (1, 2, length, source_ids.shape[1])
        np.testing.assert_allclose(scores.sum(-1), 1.0, atol=1e-5)
        x = next_x


def test_maps_cover_every_layer_and_label_every_subword(trained_model):
    maps = attention_maps(trained_model, SENTENCE)
    assert maps.translation == "zwei hunde spielen ."
    assert maps.source_pieces[0] == "<s>" and maps.source_pieces[-1] == "</s>"
    assert maps.output_pieces[-1] == "</s>"
    backbone = trained_model.backbone
    sources, outputs = len(maps.source_pieces), len(maps.output_pieces)
    assert maps.encoder_self_attention.shape == (backbone.num_encoder_layers, backbone.num_heads, sources, sources)
    assert maps.cross_attention.shape == (backbone.num_decoder_layers, backbone.num_heads, outputs, sources)
    np.testing.assert_allclose(maps.cross_attention.sum(-1), 1.0, atol=1e-5)


def _image(path):
    import matplotlib.image

    return matplotlib.image.imread(path)


def test_pictures_are_drawn(trained_model, tmp_path):
    maps = attention_maps(trained_model, SENTENCE)
    plot_cross_attention(maps, tmp_path / "cross.png")
    plot_cross_attention(maps, tmp_path / "head1.png", layer=0, heads=[1])
    plot_self_attention(maps, tmp_path / "self.png", layer=-1, head=0)
    sizes = {}
    for name in ("cross", "head1", "self"):
        image = _image(tmp_path / f"{name}.png")
        height, width = image.shape[:2]
        sizes[name] = width
        assert height >= 250 and width >= 300, (name, image.shape)
        pixels = image[..., :3].reshape(-1, 3)
        assert pixels.std() > 0.05  # not blank
        assert len(np.unique(pixels.round(2), axis=0)) > 50  # a colour scale, not a few flat areas
    assert sizes["cross"] > sizes["head1"]  # two heads side by side


def test_bad_layer_or_head_is_named(trained_model, tmp_path):
    maps = attention_maps(trained_model, SENTENCE)
    with pytest.raises(ValueError, match="--layer 2 is out of range: the decoder has 2 layers"):
        plot_cross_attention(maps, tmp_path / "x.png", layer=2)
    with pytest.raises(ValueError, match=r"heads \[5\] are out of range: the model has 2 heads"):
        plot_cross_attention(maps, tmp_path / "x.png", heads=[0, 5])
    with pytest.raises(ValueError, match="no tokens"):
        attention_maps(trained_model, "  ")
