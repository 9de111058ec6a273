"""`ScaledSharedEmbedding(mask_zero=True)` keeps Keras' padding mask through
its sqrt(d_model) scale, as `keras.layers.Embedding` gives it."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer.layers import ScaledSharedEmbedding
from keras_transformer.utils import library_internals

IDS = np.array([[5, 3, 0, 0], [7, 0, 0, 0]], "int32")


def embedding(**options):
    layer = ScaledSharedEmbedding(input_dim=10, output_dim=4, mask_zero=True, **options)
    layer.build(IDS.shape)
    return layer


def test_compute_mask_gives_the_padding_mask_of_ids_and_none_for_the_output_projection():
    layer = embedding()
    np.testing.assert_array_equal(ops.convert_to_numpy(layer.compute_mask(IDS)), IDS != 0)
    assert layer.compute_mask(np.ones((2, 4, 4), "float32")) is None


@pytest.mark.parametrize("quantized", [False, True])
def test_the_scaled_embeddings_carry_the_padding_mask(quantized):
    layer = embedding()
    if quantized:
        layer.quantize("int8")
    outputs = layer(ops.convert_to_tensor(IDS))
    mask = library_internals.keras_mask(outputs)
    assert mask is not None
    np.testing.assert_array_equal(ops.convert_to_numpy(mask), IDS != 0)
    assert library_internals.keras_mask(layer(outputs, reverse=True)) is None


def test_a_functional_model_passes_the_mask_on():
    ids = keras.Input((None,), dtype="int32")
    embedded = ScaledSharedEmbedding(input_dim=10, output_dim=4, mask_zero=True)(ids)
    assert embedded._keras_mask is not None
