"""`compiled_torch_step`: each step of a torch search through `torch.compile`.

Opt-in with `compile(jit_compile=True)` on torch: compiling takes seconds
per batch shape, which pays off only after many sentences of that shape.
The loop itself stays Python (`ops.while_loop` on torch), which
`torch.compile` would unroll; its body, one step of decoding and choosing,
is compiled.

Example:
>>> from keras_transformer.speed_paths.runtime import Runtime
>>> PATH.applies_to(Runtime("torch", "cpu")), PATH.applies_to(Runtime("jax", "cpu"))
(True, False)
"""

import warnings
from collections.abc import Callable

from keras_transformer.speed_paths.registry import SpeedPath, register

PATH = register(
    SpeedPath(
        "compiled_torch_step",
        "torch.compile fuses the many small operators of a search step, which eager torch runs one by one",
        lambda runtime: runtime.backend == "torch",
    )
)


def compiled_step(body: Callable) -> Callable:
    """`body` through `torch.compile`, for one batch shape at a time."""
    import torch

    compiled = torch.compile(body, dynamic=False)

    def run(*state):
        with warnings.catch_warnings():
            # Dynamo traces through `functools.lru_cache` and says so: here,
            # Keras' dtype rules, which are pure functions.
            warnings.filterwarnings("ignore", "Dynamo detected a call to a `functools.lru_cache`", UserWarning)
            return compiled(*state)

    return run
