"""Sinusoidal positional encoding (section 3.5)."""

import keras
import keras_hub
from keras import ops

LAYOUTS = ("interleaved", "concatenated")


@keras.saving.register_keras_serializable(package="keras_transformer")
class SinusoidalPositionEncoding(keras_hub.layers.SinePositionEncoding):
    """The fixed positional encoding of section 3.5.

        PE(pos, 2i)     = sin(pos / 10000^(2i / d_model))
        PE(pos, 2i + 1) = cos(pos / 10000^(2i / d_model))

    `layout="interleaved"` (default) is the formula as the paper writes it,
    and KerasHub's `SinePositionEncoding`. tensor2tensor and Marian (the
    Opus-MT checkpoints) put all sines first and all cosines second, with the
    same frequencies: `layout="concatenated"`, so their weights load exactly.

    The table is computed in float32 whatever the compute dtype, then cast:
    KerasHub computes the angles in the compute dtype, and in bfloat16
    positions above 256 are no longer representable exactly (256 and 257 get
    the same encoding), in float16 the angles of long sentences are off by
    about 0.2 radian. Decoding runs to source length + 50, well past that.

    The layer has no weights; it returns encodings shaped like its input, to be
    added to the scaled token embeddings. `start_index` shifts the positions,
    which incremental decoding uses to encode one new position at a time.

    Args:
        layout: `"interleaved"` or `"concatenated"`, see above.
        max_wavelength: the 10000 of the formula.

    Example:
    >>> import numpy as np
    >>> layer = SinusoidalPositionEncoding()
    >>> pe = layer(np.zeros((1, 4, 8), "float32"))
    >>> [round(float(v), 4) for v in pe[0, 1, :2]]  # sin(1), cos(1)
    [0.8415, 0.5403]
    """

    def __init__(self, layout: str = "interleaved", max_wavelength: int = 10000, **kwargs):
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}; got {layout!r}.")
        super().__init__(max_wavelength=max_wavelength, **kwargs)
        self.layout = layout

    def call(self, inputs, start_index=0):
        shape = ops.shape(inputs)
        length, hidden_dim = shape[-2], shape[-1]
        positions = ops.cast(ops.arange(length) + start_index, "float32")
        # 1 / 10000^(2i / d_model) for i = 0 .. d_model/2 - 1, rounded as
        # KerasHub rounds it in float32 (the same table to the last bit).
        frequencies = ops.power(
            ops.cast(1 / self.max_wavelength, "float32"),
            ops.cast(ops.arange(0, hidden_dim, 2), "float32") / ops.cast(hidden_dim, "float32"),
        )
        angles = positions[:, None] * frequencies[None, :]  # (length, d_model / 2)
        sines, cosines = ops.sin(angles), ops.cos(angles)
        if self.layout == "interleaved":
            table = ops.reshape(ops.stack([sines, cosines], axis=-1), (length, hidden_dim))
        else:
            table = ops.concatenate([sines, cosines], axis=-1)
        return ops.broadcast_to(ops.cast(table, self.compute_dtype), shape)

    def get_config(self):
        return {**super().get_config(), "layout": self.layout}
