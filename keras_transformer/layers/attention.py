"""Two fixes to the multi-head attention layers KerasHub's blocks build."""

import math

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


def initialize_attention_kernels(attention: keras.layers.MultiHeadAttention, initializer) -> None:
    """Re-draws the W^Q, W^K, W^V and W^O kernels as d_model x d_model matrices.

    Keras stores W^Q as a `(d_model, h, d_k)` kernel and W^O as `(h, d_k,
    d_model)`, and its Glorot initializer computes fans from those shapes as
    if the leading axes were a convolution window: fan_in + fan_out comes out
    as 4,608 instead of 256 for d_model 128 and 4 heads, so the kernels start
    about 4x too small. Attention logits then start near zero, every position
    attends uniformly, and in a Post-LN stack trained from scratch the
    encoder can collapse: measured here, after 800 updates on Multi30k,
    every source position's encoder output had cosine similarity 0.996 with
    every other, cross-attention query/key gradients were 1e-4 of the value
    gradients, and translations kept the topic but lost the details. Drawing
    each kernel as the matrix of section 3.2.2 (W^Q in R^{d_model x d_k} per
    head, i.e. d_model x h*d_k together) gives the usual Glorot scale.
    """
    for dense, matrix_rows in (
        (attention._query_dense, 1),
        (attention._key_dense, 1),
        (attention._value_dense, 1),
        (attention._output_dense, -1),
    ):
        shape = tuple(dense.kernel.shape)
        fan_in = math.prod(shape[:matrix_rows])
        values = keras.initializers.get(initializer)((fan_in, math.prod(shape) // fan_in))
        dense.kernel.assign(keras.ops.cast(keras.ops.reshape(values, shape), dense.kernel.dtype))
