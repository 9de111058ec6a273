"""The Transformer's layers, each one a section of the paper."""

from keras_transformer.layers.decoder_block import DecoderBlock
from keras_transformer.layers.encoder_block import EncoderBlock
from keras_transformer.layers.logits_bias import LogitsBias
from keras_transformer.layers.scaled_shared_embedding import ScaledSharedEmbedding
from keras_transformer.layers.sinusoidal_position_encoding import (
    SinusoidalPositionEncoding,
)

__all__ = [
    "DecoderBlock",
    "EncoderBlock",
    "LogitsBias",
    "ScaledSharedEmbedding",
    "SinusoidalPositionEncoding",
]
