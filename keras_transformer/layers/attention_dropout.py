"""Dropout on attention weights, separate from the paper's P_drop."""

import keras


def set_attention_dropout(attention: keras.layers.MultiHeadAttention, rate: float) -> None:
    """Sets the dropout rate a built `MultiHeadAttention` applies to its weights.

    KerasHub's encoder and decoder layers give their attention layers the
    block's `dropout`, so P_drop = 0.3 would also zero 30% of every softmax
    row. Section 5.4 puts dropout only on sublayer outputs and embedding sums
    (fairseq's `--attention-dropout` defaults to 0 for the same reason), and
    on a small model dropped cross-attention weights teach the decoder to
    guess from its own prefix instead of reading the source. KerasHub has no
    argument for it, so the built layer gets a new `Dropout` (one made with
    rate 0 has no random seed state to raise its rate later), added the way
    Keras' own `Dense.enable_lora` adds state to a built layer.
    """
    attention._dropout = rate
    attention._tracker.unlock()
    attention._dropout_layer = keras.layers.Dropout(
        rate, dtype=attention.dtype_policy, seed=attention.seed
    )
    attention._lock_state()
