"""Importing and using `keras_transformer` rebinds no attribute of Keras', KerasHub's or TensorFlow's modules,
except the one documented hook (`library_internals.register_transformers_loader`). Registering presets in
KerasHub's registry fills its dictionaries in place, as KerasHub's own models do, and rebinds nothing.

Run in a fresh interpreter, so that what other tests imported or changed does not count."""

import json
import os
import subprocess
import sys

from helpers import REPO_ROOT

PROGRAM = r"""
import importlib, json, sys
import numpy as np
import keras, keras.ops, keras_hub

backend = keras.config.backend()
for name in ("core", "numpy", "math", "nn", "linalg", "random"):
    importlib.import_module(f"keras.src.backend.{backend}.{name}")
importlib.import_module("keras_hub.src.utils.transformers.preset_loader")  # where the loader hook goes
try:
    import tensorflow
except ImportError:
    pass
# Keras' own first calls (a layer, a product) set what they set before the snapshot.
keras.layers.Dense(4)(np.ones((2, 3), "float32"))
keras.ops.matmul(keras.ops.ones((2, 3), "bfloat16"), keras.ops.ones((3, 4), "bfloat16"))
if "tensorflow" in sys.modules:  # and TensorFlow's: its eager context, its flags
    tensorflow.function(tensorflow.math.negative)(tensorflow.constant(1.0))

WATCHED = ("keras", "keras_hub", "tensorflow")


def snapshot():
    modules = {name: module for name, module in list(sys.modules.items()) if module is not None}
    return {
        name: dict(vars(module))
        for name, module in modules.items()
        if name.split(".")[0] in WATCHED
    }


before = snapshot()

import keras_transformer as kt
from helpers import PAIRS, make_model
from keras_transformer.speed_paths.runtime import Runtime
from keras_transformer.utils import library_internals

tokenizer = kt.train_tokenizer([s for pair in PAIRS for s in pair] * 10, vocabulary_size=64)
# The float32-summed products run where the CPU has bfloat16 instructions; forced here on any CPU.
Runtime.has_bfloat16_units = property(lambda self: True)
inputs = {
    "encoder_token_ids": np.ones((2, 5), "int32"),
    "encoder_padding_mask": np.ones((2, 5), "int32"),
    "decoder_token_ids": np.ones((2, 4), "int32"),
    "decoder_padding_mask": np.ones((2, 4), "int32"),
}
for dtype in ("float32", "mixed_bfloat16"):
    model = make_model(tokenizer, dtype=dtype)
    model(inputs)
    model.compile(sampler="greedy")
    model.generate(["a dog runs ."], max_length=8)

MISSING, rebound = object(), []
for name, attributes in before.items():
    now = vars(sys.modules[name])
    for attribute, value in attributes.items():
        if now.get(attribute, MISSING) is not value:
            rebound.append([name, attribute])
print(json.dumps({"rebound": rebound, "hook": list(library_internals.TRANSFORMERS_LOADER_HOOK)}))
"""


def test_using_the_package_rebinds_only_the_loader_hook():
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(REPO_ROOT / "tests"), str(REPO_ROOT), os.environ.get("PYTHONPATH")])
        ),
    }
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=environment, timeout=600, cwd=REPO_ROOT
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["rebound"] == [report["hook"]]


def test_the_loader_hook_is_put_in_place_once():
    import keras_hub  # noqa: F401

    from keras_transformer.marian import MarianPresetLoader
    from keras_transformer.utils import library_internals

    module_name, attribute = library_internals.TRANSFORMERS_LOADER_HOOK
    module = sys.modules[module_name]
    library_internals.register_transformers_loader("marian", MarianPresetLoader)
    hook = getattr(module, attribute)
    library_internals.register_transformers_loader("marian", MarianPresetLoader)
    assert getattr(module, attribute) is hook
    # KerasHub's own class behind it, so its converters stay.
    assert issubclass(hook, hook.keras_hub_class) and hook is not hook.keras_hub_class
