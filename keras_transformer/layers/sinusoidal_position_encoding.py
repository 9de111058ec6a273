"""Sinusoidal positional encoding (section 3.5)."""

import keras
import keras_hub


@keras.saving.register_keras_serializable(package="keras_transformer")
class SinusoidalPositionEncoding(keras_hub.layers.SinePositionEncoding):
    """The fixed positional encoding of section 3.5.

        PE(pos, 2i)     = sin(pos / 10000^(2i / d_model))
        PE(pos, 2i + 1) = cos(pos / 10000^(2i / d_model))

    KerasHub's `SinePositionEncoding` computes exactly this formula with sines
    and cosines interleaved (even channels sine, odd channels cosine), as the
    paper writes it. Note that tensor2tensor and Marian concatenate all sines
    then all cosines instead: weights trained with that layout do not load here.

    The layer has no weights; it returns encodings shaped like its input, to be
    added to the scaled token embeddings. `start_index` shifts the positions,
    which incremental decoding uses to encode one new position at a time.

    Example:
    >>> import numpy as np
    >>> layer = SinusoidalPositionEncoding()
    >>> pe = layer(np.zeros((1, 4, 8), "float32"))
    >>> [round(float(v), 4) for v in pe[0, 1, :2]]  # sin(1), cos(1)
    [0.8415, 0.5403]
    """
