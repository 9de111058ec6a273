"""Every private Keras/KerasHub/TensorFlow name `library_internals` touches still exists.

When an upgrade of Keras or KerasHub moves one of them, this fails first,
naming it, instead of a training run failing (or silently misbehaving) later.
"""

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow_text as tf_text

from keras_transformer.utils import library_internals


def test_optimizer_learning_rate_helper():
    optimizer = keras.optimizers.Adam(0.25)
    assert library_internals.current_learning_rate(optimizer) == 0.25


def test_learning_rate_helper_gives_the_next_updates_rate_under_accumulation():
    schedule = keras.optimizers.schedules.PolynomialDecay(1.0, decay_steps=100, end_learning_rate=0.0)
    optimizer = keras.optimizers.Adam(schedule, gradient_accumulation_steps=2)
    variable = keras.Variable(np.zeros(3, "float32"))
    optimizer.build([variable])
    rates = []
    for _ in range(3):  # micro-batches 0, 1 (the first update) and 2
        rates.append(library_internals.current_learning_rate(optimizer))
        optimizer.apply([keras.ops.ones((3,))], [variable])
    rates.append(library_internals.current_learning_rate(optimizer))
    # Updates happen at micro-batches 1 and 3, with the schedule's rate there.
    assert rates == pytest.approx([float(schedule(1))] * 2 + [float(schedule(3))] * 2)


def test_tokenizer_internals():
    assert callable(getattr(keras_hub.tokenizers.Tokenizer, "_add_special_token", None))
    assert callable(getattr(keras_hub.tokenizers.Tokenizer, "_update_special_token_ids", None))
    import io

    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(["a b c d e f g"] * 10), model_writer=model, vocab_size=12
    )
    tokenizer = keras_hub.tokenizers.SentencePieceTokenizer(proto=model.getvalue())
    assert isinstance(library_internals.sentence_piece_op(tokenizer), tf_text.SentencepieceTokenizer)


def test_keras_hub_preset_names():
    assert library_internals.CONFIG_FILE == "config.json"
    assert library_internals.HF_PREFIX == "hf://"
    assert (library_internals.ASSET_DIR, library_internals.METADATA_FILE) == ("assets", "metadata.json")
    assert (library_internals.MODEL_WEIGHTS_FILE, library_internals.README_FILE) == ("model.weights.h5", "README.md")
    assert isinstance(library_internals.BUILTIN_PRESETS_FOR_BACKBONE, dict)
    assert callable(library_internals.get_preset_saver) and callable(library_internals.register_presets)


def test_keras_hub_picks_registered_transformers_loaders_by_model_type(tmp_path, monkeypatch):
    """KerasHub's `get_preset_loader` still looks `TransformersPresetLoader` up at each call."""
    import json

    from keras_hub.src.utils.preset_utils import get_preset_loader
    from keras_hub.src.utils.transformers import preset_loader

    class Loader(library_internals.PresetLoader):
        pass

    monkeypatch.setitem(library_internals.TRANSFORMERS_LOADERS, "made_up", Loader)
    for model_type in ("made_up", "bert"):
        (tmp_path / model_type).mkdir()
        (tmp_path / model_type / "config.json").write_text(json.dumps({"model_type": model_type}))
    assert library_internals.preset_config(str(tmp_path / "bert")) == {"model_type": "bert"}
    loader = get_preset_loader(str(tmp_path / "made_up"))
    assert type(loader) is Loader
    assert (loader.preset, loader.config) == (str(tmp_path / "made_up"), {"model_type": "made_up"})
    # KerasHub's own converters are kept.
    bert = get_preset_loader(str(tmp_path / "bert"))
    assert isinstance(bert, preset_loader.TransformersPresetLoader) and bert.converter.__name__.endswith("convert_bert")


def test_reloading_the_module_keeps_keras_hubs_transformers_loaders(tmp_path, monkeypatch):
    """A reload (Jupyter's autoreload) registers once: KerasHub's converters and Marian's loader still load."""
    import importlib
    import json

    from keras_hub.src.utils.preset_utils import get_preset_loader
    from keras_hub.src.utils.transformers import preset_loader

    from keras_transformer import marian

    # The reloads install new classes in KerasHub's module; the test leaves it as it found it.
    monkeypatch.setattr(preset_loader, "TransformersPresetLoader", preset_loader.TransformersPresetLoader)
    for model_type in ("bert", "marian"):
        (tmp_path / model_type).mkdir()
        (tmp_path / model_type / "config.json").write_text(json.dumps({"model_type": model_type}))

    def keras_hub_classes(loader) -> list[type]:
        return [c for c in type(loader).__mro__ if c.__module__ == preset_loader.__name__]

    keras_hub_loader = keras_hub_classes(get_preset_loader(str(tmp_path / "bert")))
    assert len(keras_hub_loader) == 1
    # The module alone, as autoreload reloads an edited file; then with the
    # package that registers Marian's loader at import.
    for reloaded in ([library_internals] * 2, [library_internals, marian] * 2):
        for module in reloaded:
            importlib.reload(module)
        bert = get_preset_loader(str(tmp_path / "bert"))
        assert keras_hub_classes(bert) == keras_hub_loader and bert.converter.__name__.endswith("convert_bert")
        assert type(get_preset_loader(str(tmp_path / "marian"))) is marian.MarianPresetLoader


def test_optimizer_counts_the_micro_batches_of_its_next_update():
    optimizer = keras.optimizers.SGD(0.1, gradient_accumulation_steps=3)
    variable = keras.Variable(np.zeros(2, "float32"))
    optimizer.build([variable])
    pending = []
    for _ in range(4):
        pending.append(library_internals.micro_batches_since_update(optimizer))
        optimizer.apply([keras.ops.ones((2,))], [variable])
    assert pending == [0, 1, 2, 0]
    assert library_internals.micro_batches_since_update(keras.optimizers.SGD(0.1)) == 0


def test_keras_hub_preprocessing_helpers_exist():
    assert callable(library_internals.preprocessing_function) and callable(library_internals.convert_to_ragged_batch)


def test_tensorflow_xla_context_is_still_readable():
    if keras.config.backend() != "tensorflow":
        pytest.skip("TensorFlow's XLA context")
    import tensorflow as tf

    seen = []

    def record(x):
        seen.append(library_internals.tensorflow_compiles_with_xla())
        return x

    record(1.0)
    tf.function(record, jit_compile=False)(1.0)
    tf.function(record, jit_compile=True)(1.0)
    assert seen == [False, False, True]


def test_keras_masks_are_read_and_attached_as_keras_layers_do():
    tensor = keras.ops.ones((1, 3))
    assert library_internals.keras_mask(tensor) is None
    library_internals.set_keras_mask(tensor, keras.ops.convert_to_tensor([[True, False, True]]))
    assert keras.ops.convert_to_numpy(library_internals.keras_mask(tensor)).tolist() == [[True, False, True]]
    masked = keras.layers.Embedding(4, 2, mask_zero=True)(np.array([[1, 0]]))
    assert keras.ops.convert_to_numpy(library_internals.keras_mask(masked)).tolist() == [[True, False]]


def test_the_autocast_scope_is_the_one_layer_call_opens_under_mixed_precision():
    seen = []

    class Record(keras.layers.Layer):
        def call(self, x):
            seen.append(library_internals.autocast_scope())
            return x

    Record()(np.ones((1, 2), "float32"))
    Record(dtype="mixed_bfloat16")(np.ones((1, 2), "float32"))
    assert seen[0] is None and seen[1] is not None
    assert library_internals.autocast_scope() is None


def test_layer_internals_the_speed_paths_read():
    layer = keras.layers.EinsumDense("abc,cde->abde", output_shape=(None, 2, 3), bias_axes="de")
    layer.build((1, 4, 6))
    assert library_internals.remat_mode(layer) is None and hasattr(layer, "_remat_mode")
    assert library_internals.kernel_transpose_axes(layer) is None
    layer.quantize("int8")
    assert hasattr(layer, "_kernel_transpose_axes")
    block = keras.Sequential([keras.layers.Dense(2), keras.layers.Dense(3)])
    block.build((None, 4))
    found = library_internals.sublayers(block)
    assert found[0] is block and all(layer in found for layer in block.layers)


def test_calling_bypassing_keras_runs_call_or_quantized_call():
    layer = keras.layers.Dense(2, kernel_initializer="ones")
    layer.build((None, 3))
    x = keras.ops.ones((1, 3))
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(library_internals.call_bypassing_keras(layer, x, {})), [[3.0, 3.0]]
    )
    layer.quantize("int8")
    quantized = keras.ops.convert_to_numpy(library_internals.call_bypassing_keras(layer, x, {}))
    np.testing.assert_allclose(quantized, [[3.0, 3.0]], rtol=0.02)


def test_torch_internals_the_speed_paths_read():
    torch = pytest.importorskip("torch")
    tensor = torch.zeros(3)
    before = library_internals.torch_version_counter(tensor)
    tensor.add_(1)
    assert library_internals.torch_version_counter(tensor) == before + 1
    assert library_internals.torch_quantizes_per_channel()
    values = torch.tensor([[1, -2], [3, 4]], dtype=torch.int8)
    quantized = library_internals.torch_per_channel_quantized(
        values, torch.tensor([0.5, 0.25], dtype=torch.double), torch.zeros(2, dtype=torch.long), 0
    )
    assert quantized.dequantize().tolist() == [[0.5, -1.0], [0.75, 1.0]]
