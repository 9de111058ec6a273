"""Every private Keras/KerasHub name `library_internals` touches still exists.

When an upgrade of Keras or KerasHub moves one of them, this fails first,
naming it, instead of a training run failing (or silently misbehaving) later.
"""

import keras
import keras_hub
import numpy as np
import tensorflow_text as tf_text

from keras_transformer.utils import library_internals
from keras_transformer.layers import DecoderBlock, EncoderBlock


def test_keras_hub_blocks_still_have_the_attributes_the_blocks_use():
    encoder = keras_hub.layers.TransformerEncoder(16, 2)
    encoder.build((1, 3, 8))
    decoder = keras_hub.layers.TransformerDecoder(16, 2)
    decoder.build((1, 3, 8), (1, 4, 8))
    for block, dropouts, attentions in (
        (encoder, library_internals.ENCODER_RESIDUAL_DROPOUTS, library_internals.ENCODER_ATTENTION_LAYERS),
        (decoder, library_internals.DECODER_RESIDUAL_DROPOUTS, library_internals.DECODER_ATTENTION_LAYERS),
    ):
        for name in dropouts:
            assert isinstance(getattr(block, name, None), keras.layers.Dropout), name
            assert getattr(block, name) in block._layers, name
        for name in attentions:
            assert isinstance(getattr(block, name, None), keras.layers.MultiHeadAttention), name
            kernels = library_internals.projection_kernels(getattr(block, name))
            assert {k: tuple(v.shape) for k, v in kernels.items()} == {
                "query": (8, 2, 4), "key": (8, 2, 4), "value": (8, 2, 4), "output": (2, 4, 8)
            }


def test_keras_hub_decoder_still_has_its_attention_norms():
    decoder = keras_hub.layers.TransformerDecoder(16, 2)
    decoder.build((1, 3, 8), (1, 4, 8))
    norms = library_internals.decoder_attention_norms(decoder)
    assert len(norms) == 2
    assert all(isinstance(norm, keras.layers.LayerNormalization) for norm in norms)


def test_replaced_dropouts_leave_no_stale_layer():
    for block_cls in (EncoderBlock, DecoderBlock):
        block = block_cls(16, 2, dropout=0.3, attention_dropout=0.2)
        block(*[np.zeros((1, 3, 8), "float32")] * (2 if block_cls is DecoderBlock else 1))
        dropouts = [layer for layer in block._layers if isinstance(layer, keras.layers.Dropout)]
        assert sorted(layer.rate for layer in dropouts) == [0.3] * len(dropouts)


def test_optimizer_learning_rate_helper():
    optimizer = keras.optimizers.Adam(0.25)
    assert library_internals.current_learning_rate(optimizer) == 0.25


def test_tokenizer_internals():
    assert callable(getattr(keras_hub.tokenizers.Tokenizer, "_add_special_token", None))
    assert callable(getattr(keras_hub.tokenizers.Tokenizer, "_update_special_token_ids", None))
    import sentencepiece
    import io

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(["a b c d e f g"] * 10), model_writer=model, vocab_size=12
    )
    tokenizer = keras_hub.tokenizers.SentencePieceTokenizer(proto=model.getvalue())
    assert isinstance(library_internals.sentence_piece_op(tokenizer), tf_text.SentencepieceTokenizer)


def test_keras_hub_preset_names():
    assert library_internals.CONFIG_FILE == "config.json"
    assert library_internals.HF_PREFIX == "hf://"
    assert callable(library_internals.get_preset_saver) and callable(library_internals.register_presets)


def test_block_sublayers_and_projections():
    encoder = keras_hub.layers.TransformerEncoder(16, 2)
    encoder.build((1, 3, 8))
    decoder = keras_hub.layers.TransformerDecoder(16, 2)
    decoder.build((1, 3, 8), (1, 4, 8))
    assert set(library_internals.block_sublayers(decoder)) == set(library_internals.BLOCK_SUBLAYERS)
    assert "cross_attention" not in library_internals.block_sublayers(encoder)
    for attention in (library_internals.block_sublayers(decoder)[r] for r in ("self_attention", "cross_attention")):
        projections = library_internals.attention_projections(attention)
        assert [tuple(p.kernel.shape) for p in projections.values()] == [(8, 2, 4)] * 3 + [(2, 4, 8)]
    assert callable(library_internals.preprocessing_function) and callable(library_internals.convert_to_ragged_batch)
