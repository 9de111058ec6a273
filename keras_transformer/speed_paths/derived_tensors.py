"""Values computed from a torch tensor, kept while it lives and computed again after it changes.

The speed paths' helper for the values they derive from weights. torch
counts the in-place writes to a tensor (its version counter); Keras' torch
variables are updated in place (training, `assign`, loading weights). A value
derived from a weight (a packed int8 copy, a transposed copy) stays right for
as long as the weight's version, and whatever else it was made from, is the
same. The entry goes when the tensor is freed.

A tensor made under `torch.inference_mode()` (a model loaded there, as many
torch servers do) has no counter: it can only be written in place under that
mode too, and such a write is not seen here. Its value is made once per
tensor (and per `state`).

Example:
>>> import torch
>>> cache, weight = {}, torch.ones(2, 3)
>>> first = derived(cache, weight, (), lambda: weight.t().contiguous())
>>> derived(cache, weight, (), lambda: weight.t().contiguous()) is first
True
>>> _ = weight.mul_(2)  # an in-place write: made again
>>> derived(cache, weight, (), lambda: weight.t().contiguous()).tolist()
[[2.0, 2.0], [2.0, 2.0], [2.0, 2.0]]
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

from keras_transformer.utils import library_internals


def derived(cache: dict, tensor, state: tuple, make: Callable):
    """`make()`, kept in `cache` for `tensor` until `tensor` is written in
    place, `state` (what else the value was made from) changes, or `tensor`
    is freed."""
    key, state = id(tensor), (version(tensor), *state)
    cached = cache.get(key)
    if cached is not None and cached[0]() is tensor and cached[1] == state:
        return cached[2]
    value = make()
    cache[key] = (weakref.ref(tensor, lambda _: cache.pop(key, None)), state, value)
    return value


def version(tensor) -> int | None:
    """How many times `tensor` was written in place; None for an inference
    tensor, which does not count them."""
    return None if tensor.is_inference() else library_internals.torch_version_counter(tensor)
