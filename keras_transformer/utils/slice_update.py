"""`ops.slice_update` that an eager TensorFlow search need not compile."""

import keras
from keras import ops


def slice_update(inputs, start_indices, updates):
    """`ops.slice_update(inputs, start_indices, updates)`, the same values.

    Keras writes it on TensorFlow with XLA's DynamicUpdateSlice, which suits
    a compiled search. Run eagerly (the command line decodes a few sentences
    without compiling), TensorFlow compiles that op with XLA for every new
    shape it meets, which costs a one-sentence beam search about a fifth of
    its time (`python -m benchmarks.first_sentence`, empty compile cache).
    Eagerly, TensorFlow's own strided-slice update writes the same slice
    with no compilation. The update must lie inside `inputs`.

    Example:
    >>> from keras import ops
    >>> ops.convert_to_numpy(slice_update(ops.zeros((1, 4)), (0, 2), ops.ones((1, 1)))).tolist()
    [[0.0, 0.0, 1.0, 0.0]]
    """
    if keras.config.backend() == "tensorflow":
        import tensorflow as tf

        if tf.executing_eagerly():
            begin = [int(start) for start in start_indices]
            end = [start + size for start, size in zip(begin, updates.shape, strict=True)]
            return tf.raw_ops.TensorStridedSliceUpdate(
                input=inputs, begin=begin, end=end, strides=[1] * len(begin), value=ops.cast(updates, inputs.dtype)
            )
    return ops.slice_update(inputs, start_indices, updates)
