"""Attaching the chosen speed paths to a model's layers, and taking them off again.

`attach(model, runtime, compiled)` runs where a search
(`generation.decoding.compiled_search`) or a training step
(`models.transformer_fitting`) is built. It asks every registered path
whether it applies (`registry.is_chosen`) and sets what the chosen ones
give (`SpeedPath.patch`) as instance attributes of the layers of
`model.backbone`: Python finds `layer.call` on the instance before its
class, so the layer files stay as they are, and so do `get_config` and the
saved weights. Paths that replace `keras.ops` functions
(`SpeedPath.operations`) reach the paper's layers' methods through
`rebound`. `detach(model)` restores the plain layers.

Attaching is idempotent and thread-safe: the same paths attached again
change nothing; other paths replace the ones attached before.

Example:
>>> import numpy as np
>>> from keras_transformer.layers import EncoderBlock
>>> block = EncoderBlock(intermediate_dim=16, num_heads=2)
>>> _ = block(np.ones((1, 3, 8), "float32"))
>>> _ = attach(block, compiled=False)
>>> detach(block)
"""

import dataclasses
import threading
import types
import weakref

import keras

from keras_transformer.speed_paths import (  # noqa: F401  (each registers its path)
    bfloat16_products,
    direct_calls,
    eager_ops,
    in_place_cache_writes,
    openblas_products,
    threefry_dropout,
    torch_int8,
    torch_linear,
)
from keras_transformer.speed_paths import runtime as runtimes
from keras_transformer.speed_paths.registry import PATHS
from keras_transformer.utils import library_internals

# The modules whose functions use `keras.ops` as `ops`: the paper's layers.
LAYER_MODULES = ("keras_transformer.layers.", "keras_transformer.models.transformer_backbone")
_MISSING = object()
_LOCK = threading.Lock()
# Root layer -> what is attached to it.
_ATTACHED: "weakref.WeakKeyDictionary[keras.layers.Layer, _Attachment]" = weakref.WeakKeyDictionary()


@dataclasses.dataclass
class _Attachment:
    paths: tuple[str, ...]
    # Per layer (held weakly, so that the entry goes with the model): each
    # attribute set, with what the instance had before (`_MISSING` for nothing).
    previous: list[tuple[weakref.ref, dict]]


def attach(
    model: keras.layers.Layer, runtime: runtimes.Runtime | None = None, compiled: bool = False, training: bool = False
) -> tuple:
    """Attaches the speed paths chosen for `runtime` to `model.backbone` (or `model`).

    Args:
        model: a task model with a `backbone`, or a layer.
        runtime: by default this process's (`describe_runtime()`).
        compiled: whether the step being built is compiled (XLA on
            TensorFlow and JAX, `torch.compile` on torch).
        training: whether it is a training step (else a search).

    Returns:
        The names of the paths attached.
    """
    root = getattr(model, "backbone", model)
    runtime = dataclasses.replace(runtime or runtimes.describe_runtime(), compiled=compiled, training=training)
    chosen = tuple(name for name, path in PATHS.items() if path.applies_to(runtime))
    with _LOCK:
        attached = _ATTACHED.get(root)
        if attached is not None and attached.paths == chosen:
            return chosen
        if attached is not None:
            _restore(attached)
        _ATTACHED[root] = _Attachment(chosen, _install(root, [PATHS[name] for name in chosen], runtime))
    return chosen


def detach(model: keras.layers.Layer) -> None:
    """Restores the plain layers of `model.backbone` (or `model`)."""
    root = getattr(model, "backbone", model)
    with _LOCK:
        attached = _ATTACHED.pop(root, None)
        if attached is not None:
            _restore(attached)


def attached_paths(model: keras.layers.Layer) -> tuple:
    """The names of the paths attached to `model.backbone` (or `model`)."""
    attached = _ATTACHED.get(getattr(model, "backbone", model))
    return () if attached is None else attached.paths


def _install(root, paths: list, runtime) -> list:
    replaced = {}
    for path in paths:
        replaced.update(path.operations(runtime))
    namespace, memo = (Operations(replaced) if replaced else None), {}
    previous = []
    for layer in library_internals.sublayers(root):
        attributes = rebound_methods(layer, namespace, memo) if namespace else {}
        for path in paths:
            patch = path.patch(layer, runtime)
            if attributes.keys() & patch.keys():
                raise ValueError(f"Speed path {path.name!r} sets {sorted(patch)} of {layer.name}, set already.")
            attributes.update(patch)
        if attributes:
            previous.append((weakref.ref(layer), _set(layer, attributes)))
    return previous


def _set(layer, attributes: dict) -> dict:
    previous = {}
    for name, value in attributes.items():
        previous[name] = layer.__class__ if name == "__class__" else vars(layer).get(name, _MISSING)
        object.__setattr__(layer, name, value)
    return previous


def _restore(attached: _Attachment) -> None:
    for reference, previous in attached.previous:
        layer = reference()
        for name, value in previous.items() if layer is not None else ():
            if value is _MISSING:
                object.__delattr__(layer, name)
            else:
                object.__setattr__(layer, name, value)


class Operations:
    """`keras.ops`, with some functions replaced (`replaced`, by name)."""

    def __init__(self, replaced: dict):
        self.__dict__.update(replaced)

    def __getattr__(self, name: str):
        return getattr(keras.ops, name)


def rebound_methods(layer: keras.layers.Layer, namespace: Operations, memo: dict | None = None) -> dict:
    """The methods of `layer`'s class, from the paper's layers, that compute
    with `keras.ops`, bound to `layer` and computing with `namespace`."""
    methods, memo = {}, {} if memo is None else memo
    for cls in reversed(type(layer).__mro__):
        if not cls.__module__.startswith(LAYER_MODULES):
            continue
        for name, function in vars(cls).items():
            if isinstance(function, types.FunctionType) and not name.startswith("__") and _uses_ops(function):
                methods[name] = types.MethodType(rebound(function, namespace, memo), layer)
    return methods


def rebound(function: types.FunctionType, namespace: Operations, memo: dict | None = None) -> types.FunctionType:
    """`function` (of the paper's layers) with `ops` standing for
    `namespace`, and so the functions of those layers that it calls: the
    same code, reading other globals. `memo` keeps the copies made."""
    memo = {} if memo is None else memo
    if function in memo:
        return memo[function]
    names = dict(function.__globals__)
    copy = types.FunctionType(function.__code__, names, function.__name__, function.__defaults__, function.__closure__)
    copy.__kwdefaults__, copy.__qualname__ = function.__kwdefaults__, function.__qualname__
    memo[function] = copy  # before the functions it calls, which may call it
    if names.get("ops") is keras.ops:
        names["ops"] = namespace
    for name, value in function.__globals__.items():
        if _is_layer_function(value) and _uses_ops(value):
            names[name] = rebound(value, namespace, memo)
    return copy


def _is_layer_function(value) -> bool:
    return isinstance(value, types.FunctionType) and value.__module__.startswith(LAYER_MODULES)


def _uses_ops(function: types.FunctionType, seen: frozenset = frozenset()) -> bool:
    """Whether `function` reads `keras.ops` as `ops`, or calls a function of the layers that does."""
    names = _names(function.__code__)
    if "ops" in names and function.__globals__.get("ops") is keras.ops:
        return True
    seen = seen | {function}
    called = (function.__globals__.get(name) for name in names)
    return any(_is_layer_function(value) and value not in seen and _uses_ops(value, seen) for value in called)


def _names(code: types.CodeType) -> set:
    """The global names `code` and the functions defined in it read."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _names(constant)
    return names
