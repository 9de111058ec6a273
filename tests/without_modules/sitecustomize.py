"""Makes the packages named in `BLOCKED_MODULES` (comma-separated) unimportable.

Put this folder first on `PYTHONPATH` of a subprocess to run it as on a
machine without them (the GPU machine has neither TensorFlow nor
CTranslate2): importing one raises `ModuleNotFoundError`, and
`importlib.util.find_spec` finds none, as when they are not installed.
"""

import importlib.abc
import importlib.util
import os
import sys

BLOCKED = {name for name in os.environ.get("BLOCKED_MODULES", "").split(",") if name}


def _blocked(name: str) -> bool:
    return name.split(".")[0] in BLOCKED


class _Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if _blocked(name):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by tests/without_modules)")
        return None


_find_spec = importlib.util.find_spec


def _find_spec_unless_blocked(name, *args, **kwargs):
    return None if _blocked(name) else _find_spec(name, *args, **kwargs)


if BLOCKED:
    sys.meta_path.insert(0, _Blocker())
    importlib.util.find_spec = _find_spec_unless_blocked
