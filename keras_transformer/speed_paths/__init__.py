"""Faster ways to run the paper's layers, all behind one door.

The layers (`keras_transformer.layers`) and the task model are plain Keras:
`keras.ops` and `keras.layers`, one code path on every backend. Everything
that runs them faster on a particular runtime lives here: each path has a
name, a one-line reason, and a test that its output equals the plain
layers'. Paths are chosen from one description of the runtime
(`runtime.describe_runtime()`) and attached (`attach`) where a search or a
training step is built, never inside a layer; `detach` takes them off.

Switch paths off by name with the environment variable
`KERAS_TRANSFORMER_SPEED_PATHS_OFF` (comma-separated names, or `all`);
`registry.PATHS` lists them.
"""

from keras_transformer.speed_paths.attachment import attach, attached_paths, detach
from keras_transformer.speed_paths.registry import PATHS, SpeedPath, is_chosen
from keras_transformer.speed_paths.runtime import Runtime, describe_runtime

__all__ = ["PATHS", "Runtime", "SpeedPath", "attach", "attached_paths", "describe_runtime", "detach", "is_chosen"]
