"""Speed path `in_place_cache_writes`: a torch search writes its caches in place.

Keras' torch `slice_update` clones the whole tensor to write one slice,
and with tensor start indices (a search's loop index) also builds index
grids for `index_put_`: at every step, for every layer's cache. A search
owns its buffers and never reads one after updating it, so under
`torch.inference_mode` (where `compiled_search` runs it, and no gradient is
recorded) it loses nothing by writing in place. Traced by `torch.compile`
(the compiled torch step), the write is an `index_copy`, which it can trace
where Keras' turns a tensor index into Python numbers.

Attached to an eager torch search, `slice_update` stands for
`keras.ops.slice_update` in the paper's layers' methods
(`attachment.rebound`); a compiled step keeps Keras' (traceable) one. The
searches of `generation` call it directly for their token buffers.
"""

import keras
from keras import ops

from keras_transformer.speed_paths import eager_ops
from keras_transformer.speed_paths.registry import SpeedPath, register


def slice_update(inputs, start_indices, updates):
    """`ops.slice_update(inputs, start_indices, updates)`, the same values;
    on torch in place under `torch.inference_mode`, an `index_copy` under
    `torch.compile`; elsewhere `eager_ops.slice_update`.

    Example:
    >>> from keras import ops
    >>> ops.convert_to_numpy(slice_update(ops.zeros((1, 4)), (0, 2), ops.ones((1, 1)))).tolist()
    [[0.0, 0.0, 1.0, 0.0]]
    """
    torch = _torch_of(inputs)
    if torch is not None and torch.compiler.is_compiling():
        return _index_copied(inputs, start_indices, updates)
    if torch is not None and torch.is_inference_mode_enabled():
        # A broadcast view shares memory between its elements: write into a copy, which the search then owns.
        inputs = inputs.contiguous()
        starts = [int(start) for start in start_indices]
        target = inputs[tuple(slice(start, start + size) for start, size in zip(starts, updates.shape, strict=True))]
        target.copy_(updates)
        return inputs
    return eager_ops.slice_update(inputs, start_indices, updates)


def _torch_of(inputs):
    """The torch module on torch (whose searches' buffers are torch tensors), else None."""
    if keras.config.backend() != "torch":
        return None
    import torch

    return torch


def _index_copied(inputs, start_indices, updates):
    """The update as `torch.index_copy` along its one partial axis: the
    searches' updates span every axis but one."""
    import torch

    partial = [axis for axis, size in enumerate(updates.shape) if size != inputs.shape[axis]]
    if len(partial) != 1:
        return ops.slice_update(inputs, start_indices, updates)
    axis = partial[0]
    index = torch.as_tensor(start_indices[axis], dtype=torch.long, device=inputs.device).reshape(1)
    positions = index + torch.arange(updates.shape[axis], device=inputs.device)
    return inputs.index_copy(axis, positions, updates.to(inputs.dtype))


register(
    SpeedPath(
        "in_place_cache_writes",
        "Keras' torch slice_update copies a whole cache to write one position",
        lambda runtime: runtime.backend == "torch" and not runtime.compiled,
        operations=lambda runtime: {"slice_update": slice_update},
    )
)
