"""Token embeddings shared with the pre-softmax projection (section 3.4)."""

import math

import keras
from keras import ops

from keras_transformer.utils import library_internals


@keras.saving.register_keras_serializable(package="keras_transformer")
class ScaledSharedEmbedding(keras.layers.ReversibleEmbedding):
    """One matrix `E` for source embedding, target embedding and output softmax.

    Section 3.4: "we share the same weight matrix between the two embedding
    layers and the pre-softmax linear transformation ... In the embedding
    layers, we multiply those weights by sqrt(d_model)."

        embed(ids)        = E[ids] * sqrt(d_model)
        embed(h, reverse) = h @ E^T            (the logits)

    Keras' `ReversibleEmbedding` gives the tied `reverse` projection; what it
    lacks is the sqrt(d_model) scale, which is the only thing this subclass adds
    (to quantized lookups too, so that `quantize("int8")` covers E as well).
    `E` starts from N(0, d_model^-0.5), so that the scaled embeddings have unit
    variance, as in tensor2tensor.

    Args:
        input_dim: vocabulary size.
        output_dim: `d_model`.

    Example:
    >>> import numpy as np
    >>> layer = ScaledSharedEmbedding(input_dim=10, output_dim=4)
    >>> x = layer(np.array([[1, 2, 3]]))
    >>> tuple(x.shape), tuple(layer(x, reverse=True).shape)
    ((1, 3, 4), (1, 3, 10))
    """

    def __init__(self, input_dim: int, output_dim: int, **kwargs):
        kwargs.setdefault(
            "embeddings_initializer",
            keras.initializers.RandomNormal(stddev=output_dim**-0.5),
        )
        kwargs.setdefault("tie_weights", True)
        super().__init__(input_dim=input_dim, output_dim=output_dim, **kwargs)
        self.scale = math.sqrt(output_dim)

    def call(self, inputs, reverse: bool = False):
        if reverse and self.reverse_dtype is None and self.logit_soft_cap is None:
            # Keras' embeddings do not autocast their weights, so under a mixed
            # policy its `h @ E^T` would promote the bfloat16 `h` to float32:
            # the model's largest product, run in float32. In the compute dtype
            # it reaches the CPU's bfloat16 units, as every other product does.
            kernel = ops.transpose(self.embeddings) if self.tie_weights else self.reverse_embeddings
            return ops.matmul(ops.cast(inputs, self.compute_dtype), ops.cast(kernel, self.compute_dtype))
        if reverse:
            return super().call(inputs, reverse=True)
        return self._scaled(inputs, super().call(inputs))

    def quantized_call(self, inputs, reverse: bool = False):
        if reverse:
            return super().quantized_call(inputs, reverse=True)
        return self._scaled(inputs, super().quantized_call(inputs))

    def quantize(self, mode=None, type_check=True, config=None):
        # Keras refuses to quantize a subclass of `ReversibleEmbedding`, whose
        # `call` it cannot vouch for; this one only scales the lookup, which
        # `quantized_call` does too. Unquantized, the output projection
        # (`d_model x vocabulary`, the largest weight) streamed 4 bytes a
        # weight from memory at every decoding step.
        super().quantize(mode, type_check=False, config=config)

    def compute_mask(self, inputs, mask=None):
        # `ReversibleEmbedding` computes none (it attaches the ids' mask in
        # `call`, to the unscaled lookup): the ids' padding mask, and none for
        # the output projection's float inputs.
        if not self.mask_zero or keras.backend.is_float_dtype(keras.backend.standardize_dtype(inputs.dtype)):
            return None
        return ops.not_equal(inputs, 0)

    def _scaled(self, ids, embeddings):
        """The looked-up `embeddings` times sqrt(d_model), with the ids' mask."""
        scaled = embeddings * ops.cast(self.scale, embeddings.dtype)
        mask = self.compute_mask(ids)
        if mask is not None:
            library_internals.set_keras_mask(scaled, mask)
        return scaled
