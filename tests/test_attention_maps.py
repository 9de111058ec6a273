"""Attention pictures: the weights are the blocks' own, and the PNG shows them."""

import json

import numpy as np
import pytest

from keras_transformer.generation import attention_maps as attention_maps_module
from keras_transformer.generation.attention_maps import (
    attention_maps,
    plot_cross_attention,
    plot_self_attention,
)

SENTENCE = "two dogs play ."


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


@pytest.fixture(scope="module")
def separate_vocabularies(tmp_path_factory):
    """A Marian checkpoint whose target has its own, smaller vocabulary, written by `transformers`."""
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    import keras_transformer as kt
    from marian_fixtures import write_multilingual_repo

    folder = write_multilingual_repo(tmp_path_factory.mktemp("separate") / "folder")["folder"]
    target_pieces = json.loads((folder / "target_vocab.json").read_text(encoding="utf-8"))
    return kt.Transformer.from_preset(str(folder)), {index: piece for piece, index in target_pieces.items()}


def _label(piece):
    """A piece as the pictures label it: word starts bare, special tokens as they are, the rest after "##"."""
    if piece.startswith("\u2581"):
        return piece[1:] or piece
    return piece if piece.startswith("<") and piece.endswith(">") else "##" + piece


def test_output_pieces_come_from_the_target_vocabulary(separate_vocabularies, monkeypatch):
    model, target_pieces = separate_vocabularies
    greedy, emitted = attention_maps_module._greedy_output, []

    def greedy_output(*args):
        ids = greedy(*args)
        emitted.extend(ids)
        return ids

    monkeypatch.setattr(attention_maps_module, "_greedy_output", greedy_output)
    maps = attention_maps(model, ">>deu<< A dog runs across the green field.")
    assert len(emitted) > 3  # the start token, </s>, and words between
    assert maps.output_pieces == [_label(target_pieces[i]) for i in emitted[1:]]
    assert maps.cross_attention.shape[2] == len(maps.output_pieces)
