"""Every use of a private attribute of Keras, KerasHub, TensorFlow, JAX or torch, in one place.

Each function here exists because the installed library offers no public
route to something the paper needs. `tests/test_library_internals.py` checks
every name this module touches against the installed versions, so an
upgrade that moves one fails there, loudly, instead of somewhere deep in a
training run.
"""

import keras

# KerasHub's preset file names and preset machinery (its loaders, one per
# checkpoint format, are `PresetLoader`s): no public module of keras_hub
# exports them (`keras_hub.src.utils.preset_utils`).
from keras_hub.src.utils import preset_utils as _preset_utils
from keras_hub.src.utils.preset_utils import (
    ASSET_DIR,
    BUILTIN_PRESETS_FOR_BACKBONE,
    CONFIG_FILE,
    HF_PREFIX,
    METADATA_FILE,
    MODEL_WEIGHTS_FILE,
    README_FILE,
    PresetLoader,
    get_preset_saver,
    register_presets,
)

# KerasHub's helpers for tokenizers and preprocessors written outside it
# (`keras_hub.src.utils.tensor_utils`): `preprocessing_function` runs a
# method in TensorFlow and hands the caller backend tensors or lists;
# `convert_to_ragged_batch` batches any token-id input as a ragged tensor.
from keras_hub.src.utils.tensor_utils import convert_to_ragged_batch, preprocessing_function

# The module whose `TransformersPresetLoader` picks a converter for a
# `transformers` config by its `model_type`, from a fixed list: KerasHub has
# no registry for converters written outside it (see
# `register_transformers_loader`).
from keras_hub.src.utils.transformers import preset_loader as _transformers_preset_loader


def current_learning_rate(optimizer: keras.optimizers.Optimizer) -> float:
    """The learning rate the optimizer's next update uses (schedules included).

    Keras evaluates a schedule at its micro-batch counter (`_iterations`) and,
    under gradient accumulation over N micro-batches, updates at the N-th
    micro-batch of each group only: the next update's rate is the schedule's
    at that micro-batch, not at the counter's value now.
    """
    schedule = optimizer._learning_rate
    if isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
        micro_batches = optimizer.gradient_accumulation_steps or 1
        # `iterations` counts updates made; the next is the last micro-batch of the next group.
        next_update = (keras.ops.convert_to_numpy(optimizer.iterations) + 1) * micro_batches - 1
        return float(keras.ops.convert_to_numpy(schedule(next_update)))
    return float(keras.ops.convert_to_numpy(optimizer._get_current_learning_rate()))


def micro_batches_since_update(optimizer: keras.optimizers.Optimizer) -> int:
    """The micro-batches whose gradients the optimizer holds, accumulated for
    its next update (0 without gradient accumulation, and at the end of each
    group). Keras counts micro-batches in `_iterations`; the public
    `iterations` counts updates."""
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # a LossScaleOptimizer's
    micro_batches = optimizer.gradient_accumulation_steps
    if not micro_batches:
        return 0
    return int(keras.ops.convert_to_numpy(optimizer._iterations)) % micro_batches


def autocast_scope():
    """The autocast scope Keras' `Layer.__call__` opened around the current
    call (mixed precision), or None (`keras.src.backend.get_autocast_scope`)."""
    return keras.src.backend.get_autocast_scope()


def keras_mask(tensor):
    """The mask Keras attached to a tensor, or None (`keras.src.backend.get_keras_mask`)."""
    return keras.src.backend.get_keras_mask(tensor)


def set_keras_mask(tensor, mask) -> None:
    """Attaches a mask to a tensor as Keras' layers do (`keras.src.backend.set_keras_mask`)."""
    keras.src.backend.set_keras_mask(tensor, mask)


def add_special_token(tokenizer, piece: str, name: str) -> None:
    """Declares `piece` as the tokenizer's `<name>` / `<name>_id` (KerasHub's
    own model tokenizers call this protected method the same way)."""
    tokenizer._add_special_token(piece, name)


def update_special_token_ids(tokenizer) -> None:
    """Sets the tokenizer's `<name>_id`s from its new vocabulary (KerasHub's
    tokenizers call this protected method when theirs is set)."""
    tokenizer._update_special_token_ids()


def sentence_piece_op(tokenizer):
    """The `tf_text.SentencepieceTokenizer` inside a KerasHub tokenizer, or None."""
    return getattr(tokenizer, "_sentence_piece", None)


# `transformers` model types this package loads, and their loaders. A reload
# of this module (Jupyter's autoreload) keeps the registrations made at import.
TRANSFORMERS_LOADERS: dict[str, type[PresetLoader]] = globals().get("TRANSFORMERS_LOADERS", {})

# KerasHub's own loader of `transformers` checkpoints. After a
# `register_transformers_loader`, KerasHub's module holds this module's
# subclass in its place; a reload subclasses KerasHub's class again, not that
# subclass (whose `__new__` takes arguments that `super().__new__(cls)` does
# not pass).
_KERAS_HUB_TRANSFORMERS_LOADER = getattr(
    _transformers_preset_loader.TransformersPresetLoader,
    "keras_hub_class",
    _transformers_preset_loader.TransformersPresetLoader,
)


class _TransformersPresetLoader(_KERAS_HUB_TRANSFORMERS_LOADER):
    """KerasHub's loader of `transformers` checkpoints, which hands the model
    types in `TRANSFORMERS_LOADERS` to their own loaders."""

    keras_hub_class = _KERAS_HUB_TRANSFORMERS_LOADER

    def __new__(cls, preset, config):
        loader_cls = TRANSFORMERS_LOADERS.get(config.get("model_type"))
        if loader_cls is None:
            return super().__new__(cls)
        # Not an instance of `cls`, so Python does not run `__init__` on it again.
        return loader_cls(preset, config)


# The one attribute of another library this package rebinds (see
# `register_transformers_loader`): KerasHub's module and the name in it.
TRANSFORMERS_LOADER_HOOK = (_transformers_preset_loader.__name__, "TransformersPresetLoader")


def register_transformers_loader(model_type: str, loader_cls: type[PresetLoader]) -> None:
    """Makes KerasHub load `transformers` checkpoints of `model_type` with `loader_cls`.

    KerasHub's `from_preset` (of `Backbone`, `Seq2SeqLM`, `Tokenizer`, ...)
    asks `get_preset_loader` for a loader; for a `config.json` with a
    `model_type` that is `TransformersPresetLoader(preset, config)`, looked
    up in its module at each call, which picks a converter from a fixed list:
    KerasHub has no registry of loaders or converters. So this is the one
    place the package rebinds another library's attribute
    (`TRANSFORMERS_LOADER_HOOK`, and only while registering): a subclass put
    there hands the registered model types to their loaders and keeps every
    KerasHub converter; the converter is chosen by the checkpoint's model
    type, whichever class `from_preset` is called on. Idempotent: the
    subclass is put there once, whatever the number of registrations.
    """
    if not issubclass(loader_cls, PresetLoader):
        raise TypeError(f"loader_cls must be a KerasHub PresetLoader subclass; got {loader_cls!r}.")
    TRANSFORMERS_LOADERS[model_type] = loader_cls
    if _transformers_preset_loader.TransformersPresetLoader is not _TransformersPresetLoader:
        _transformers_preset_loader.TransformersPresetLoader = _TransformersPresetLoader


def preset_config(preset: str) -> dict:
    """The `config.json` of `preset` (a folder or an `hf://` handle), fetched
    as KerasHub's `from_preset` fetches it to choose a loader.

    Raises:
        OSError: the file is missing or cannot be fetched.
        ValueError: the handle is malformed, or the file is not JSON.
    """
    return _preset_utils.load_json(preset, CONFIG_FILE)


def tensorflow_compiles_with_xla() -> bool:
    """Whether TensorFlow is tracing a function that XLA compiles
    (`tf.function(jit_compile=True)`, and everything traced inside one):
    TensorFlow marks such a graph with an XLA context, which only its private
    `control_flow_util` reads."""
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util

    return not tf.executing_eagerly() and control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def remat_mode(layer: keras.layers.Layer):
    """The layer's rematerialization mode, or None (`Layer._remat_mode`, read by Keras' `__call__`)."""
    return getattr(layer, "_remat_mode", None)


def sublayers(layer: keras.layers.Layer) -> list:
    """`layer` and every layer inside it, recursively (`Layer._flatten_layers`,
    the walk Keras' `Model.quantize` takes); Keras has no public one."""
    return list(layer._flatten_layers(include_self=True, recursive=True))


def kernel_transpose_axes(layer: keras.layers.EinsumDense):
    """How a quantized `EinsumDense` transposed its kernel to quantize it
    (`EinsumDense._kernel_transpose_axes`), or None."""
    return getattr(layer, "_kernel_transpose_axes", None)


def call_bypassing_keras(layer: keras.layers.Layer, inputs, kwargs: dict):
    """`layer.call(inputs, **kwargs)` (`quantized_call` for a quantized
    layer, as Keras would), without Keras' `Layer.__call__`: no argument
    binding, training flag, masks, name or autocast scope, input checks, and
    on torch no `torch.nn.Module.__call__`, so **torch forward hooks
    registered on `layer` do not run**. For the speed path `direct_calls`,
    which takes this route only where that work changes nothing."""
    if layer.quantization_mode is not None:
        return layer.quantized_call(inputs, **kwargs)
    return layer.call(inputs, **kwargs)


def torch_version_counter(tensor) -> int:
    """How many times a torch tensor was written in place (`Tensor._version`)."""
    return tensor._version


def torch_quantizes_per_channel() -> bool:
    """Whether torch still has `torch._make_per_channel_quantized_tensor`,
    the one way to build an int8 weight with one scale per output from int8
    values (`torch.quantize_per_channel` takes float weights)."""
    import torch

    return callable(getattr(torch, "_make_per_channel_quantized_tensor", None))


def torch_per_channel_quantized(values, scales, zero_points, axis: int):
    """A quantized torch tensor of int8 `values` with one scale per channel along `axis`."""
    import torch

    return torch._make_per_channel_quantized_tensor(values, scales, zero_points, axis)
