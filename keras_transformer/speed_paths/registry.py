"""The speed paths by name: what each is for, and where it applies.

Each path module registers itself here with `register`; `is_chosen(name,
runtime)` is the one question the places that build a search or a training
step ask.

Example:
>>> from keras_transformer.speed_paths.runtime import Runtime
>>> path = SpeedPath("example", "faster on torch", lambda runtime: runtime.backend == "torch")
>>> path.applies_to(Runtime("torch", "cpu")), path.applies_to(Runtime("torch", "cpu", paths_off=frozenset({"all"})))
(True, False)
"""

import dataclasses
from collections.abc import Callable

from keras_transformer.speed_paths.runtime import Runtime, describe_runtime


@dataclasses.dataclass(frozen=True)
class SpeedPath:
    """A way to run the plain layers faster where `applies(runtime)`.

    Attributes:
        name: how it is switched off (`KERAS_TRANSFORMER_SPEED_PATHS_OFF`).
        reason: one line: why it is faster there.
        applies: whether the runtime gains from it.
    """

    name: str
    reason: str
    applies: Callable[[Runtime], bool]

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
