"""Attention-weight dropout apart from residual dropout (section 5.4)."""

import contextlib

import keras

from keras_transformer.layers.threefry_dropout import ThreefryDropout
from keras_transformer.utils import library_internals


@contextlib.contextmanager
def attention_dropout_while_building(block: keras.layers.Layer, residual_dropouts: tuple[str, ...]):
    """Builds a KerasHub block's attention layers with `block.attention_dropout`.

    KerasHub's blocks give their attention layers the block's `dropout`, so
    P_drop = 0.3 would also zero 30% of every softmax row. Section 5.4 puts
    dropout only on sublayer outputs and embedding sums (fairseq's
    `--attention-dropout` defaults to 0 for the same reason), and on a small
    model dropped cross-attention weights teach the decoder to guess from its
    own prefix instead of reading the source. KerasHub has no argument for
    it, so the block builds with `dropout` set to the attention dropout (the
    attention layers are then made with the rate `layers.attention` applies
    to their weights), and its residual dropouts are
    made again with P_drop afterwards (as `ThreefryDropout`s).
    """
    residual_rate = block.dropout
    block.dropout = block.attention_dropout
    try:
        yield
    finally:
        block.dropout = residual_rate
    library_internals.replace_residual_dropouts(
        block, residual_dropouts, lambda **kwargs: ThreefryDropout(residual_rate, **kwargs)
    )
