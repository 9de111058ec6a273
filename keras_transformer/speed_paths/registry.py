"""The speed paths by name: what each is for, where it applies, and what it sets on a layer.

Each path module registers itself here with `register`; `is_chosen(name,
runtime)` is the one question asked of a path, and `attachment.attach`
asks it of every path where a search or a training step is built.

Example:
>>> from keras_transformer.speed_paths.runtime import Runtime
>>> path = SpeedPath("example", "faster on torch", lambda runtime: runtime.backend == "torch")
>>> path.applies_to(Runtime("torch", "cpu")), path.applies_to(Runtime("torch", "cpu", paths_off=frozenset({"all"})))
(True, False)
"""

import dataclasses
from collections.abc import Callable

from keras_transformer.speed_paths.runtime import Runtime, describe_runtime


def _nothing(*_) -> dict:
    return {}


@dataclasses.dataclass(frozen=True)
class SpeedPath:
    """A way to run the plain layers faster where `applies(runtime)`.

    Attributes:
        name: how it is switched off (`KERAS_TRANSFORMER_SPEED_PATHS_OFF`).
        reason: one line: why it is faster there.
        applies: whether the runtime gains from it.
        patch: `patch(layer, runtime)`, the attributes the path sets on one
            layer of the backbone (`"__class__"` swaps its class): `{}` for
            a layer it does not concern.
        operations: `operations(runtime)`, the `keras.ops` functions it
            replaces, by name, in the methods of the paper's layers
            (`attachment.rebound`).
    """

    name: str
    reason: str
    applies: Callable[[Runtime], bool]
    patch: Callable = _nothing
    operations: Callable = _nothing

    def applies_to(self, runtime: Runtime) -> bool:
        off = runtime.paths_off
        return "all" not in off and self.name not in off and self.applies(runtime)


PATHS: dict[str, SpeedPath] = {}


def register(path: SpeedPath) -> SpeedPath:
    """Adds `path` to `PATHS`; a name is registered once."""
    if path.name in PATHS:
        raise ValueError(f"A speed path named {path.name!r} is registered already.")
    PATHS[path.name] = path
    return path


def is_chosen(name: str, runtime: Runtime | None = None) -> bool:
    """Whether the path `name` runs on `runtime` (by default this process's)."""
    if name not in PATHS:
        raise KeyError(f"No speed path named {name!r}; the paths are {sorted(PATHS)}.")
    return PATHS[name].applies_to(runtime or describe_runtime())
