"""`ops.slice_update` that an eager TensorFlow search need not compile, that
a torch search may write in place, and that `torch.compile` traces."""

import contextlib
import contextvars
from collections.abc import Iterator

import keras
from keras import ops

_IN_PLACE = contextvars.ContextVar("slice_update_in_place", default=False)


@contextlib.contextmanager
def writing_in_place() -> Iterator[None]:
    """Within it, `slice_update` on torch writes into `inputs` and returns it.

    Keras' torch `slice_update` clones the whole tensor to write one slice,
    and with tensor start indices (a search's loop index) also builds index
    grids for `index_put_`: at every step, for every layer's cache. A search
    that owns its buffers and never reads one after updating it (as the
    searches of `generation` do) loses nothing by writing in place; torch
    tensors only, without gradients (the other backends' tensors are
    immutable, so there it changes nothing).
    """
    token = _IN_PLACE.set(True)
    try:
        yield
    finally:
        _IN_PLACE.reset(token)


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
    backend = keras.config.backend()
    if backend == "torch" and _torch_compiling():
        return _index_copied(inputs, start_indices, updates)
    if backend == "torch" and _IN_PLACE.get():
        # A broadcast view shares memory between its elements: write into a copy, which the search then owns.
        inputs = inputs.contiguous()
        starts = [int(start) for start in start_indices]
        target = inputs[tuple(slice(start, start + size) for start, size in zip(starts, updates.shape, strict=True))]
        target.copy_(updates)
        return inputs
    if backend == "tensorflow":
        import tensorflow as tf

        if tf.executing_eagerly():
            begin = [int(start) for start in start_indices]
            end = [start + size for start, size in zip(begin, updates.shape, strict=True)]
            return tf.raw_ops.TensorStridedSliceUpdate(
                input=inputs, begin=begin, end=end, strides=[1] * len(begin), value=ops.cast(updates, inputs.dtype)
            )
    return ops.slice_update(inputs, start_indices, updates)


def _torch_compiling() -> bool:
    import torch

    return torch.compiler.is_compiling()


def _index_copied(inputs, start_indices, updates):
    """The update as `torch.index_copy` along its one partial axis, for
    `torch.compile` (a compiled decoding step, `generation.decoding`): Keras'
    torch `slice_update` turns a tensor start index into Python numbers,
    which `torch.compile` cannot trace, and a context variable (the in-place
    switch) is beyond it too. The searches' updates span every axis but one."""
    import torch

    partial = [axis for axis, size in enumerate(updates.shape) if size != inputs.shape[axis]]
    if len(partial) != 1:
        return ops.slice_update(inputs, start_indices, updates)
    axis = partial[0]
    index = torch.as_tensor(start_indices[axis], dtype=torch.long, device=inputs.device).reshape(1)
    positions = index + torch.arange(updates.shape[axis], device=inputs.device)
    return inputs.index_copy(axis, positions, updates.to(inputs.dtype))
