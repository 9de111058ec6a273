"""The speed path `bfloat16_products`: traced for XLA, its products are bfloat16 x bfloat16 -> float32 dots on
the CPU (JAX, and TensorFlow with `jit_compile=True`), with the values and gradients of Keras' own products
within bfloat16's rounding (not bit for bit: the sums are rounded once instead of per Keras' kernels). The
path is chosen only on a CPU with bfloat16 units, which this test's machine may lack: tests marked with
`bfloat16_units` then skip, and the others exercise the primitives directly, which run on any CPU."""

import dataclasses
import re

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer import speed_paths
from keras_transformer.speed_paths import bfloat16_products as products
from keras_transformer.speed_paths.runtime import Runtime

PRODUCTS = {
    "dense": (products.summed_dense, ops.matmul, (2, 5, 8), (8, 6)),
    "einsum (attention projection in)": (
        lambda a, b: products.summed_einsum("abc,cde->abde", a, b),
        lambda a, b: ops.einsum("abc,cde->abde", a, b),
        (2, 5, 8),
        (8, 3, 4),
    ),
    "einsum (attention projection out)": (
        lambda a, b: products.summed_einsum("abcd,cde->abe", a, b),
        lambda a, b: ops.einsum("abcd,cde->abe", a, b),
        (2, 5, 3, 4),
        (3, 4, 6),
    ),
}
# A CPU with bfloat16 units, compiling with XLA.
WITH_UNITS = Runtime(keras.config.backend(), "cpu", frozenset({"avx512_bf16"}), compiled=True)


@pytest.fixture
def units_everywhere(monkeypatch):
    """This process's runtime as one with bfloat16 units, whatever this CPU has."""
    monkeypatch.setattr(Runtime, "has_bfloat16_units", property(lambda self: True))


def operands(shape_a, shape_b):
    rng = np.random.default_rng(0)
    return [ops.cast(rng.standard_normal(s).astype("float32"), "bfloat16") for s in (shape_a, shape_b)]


@pytest.fixture
def jax():
    import keras

    if keras.config.backend() != "jax":
        pytest.skip("the products are rerouted on JAX only")
    import jax

    return jax


@pytest.mark.parametrize("name", sorted(PRODUCTS))
def test_values_and_gradients_are_keras_own(jax, name):
    (summed, keras_own), (a, b) = _squared_sums(PRODUCTS[name])
    expected = jax.value_and_grad(keras_own, argnums=(0, 1))(a, b)
    routed = jax.jit(jax.value_and_grad(summed, argnums=(0, 1)))(a, b)
    _assert_close(routed, expected)


def _squared_sums(products_and_shapes):
    """Losses of the summed product's result and of Keras', and bfloat16 operands for them."""
    summed, keras_own, shape_a, shape_b = products_and_shapes

    def loss(product):
        return lambda a, b: ops.sum(ops.cast(product(a, b), "float32") ** 2)

    return (loss(summed), loss(keras_own)), operands(shape_a, shape_b)


def _assert_close(routed, expected):
    """`(value, gradients)` pairs: the same up to bfloat16 rounding, gradients in bfloat16."""
    np.testing.assert_allclose(float(routed[0]), float(expected[0]), rtol=2e-2)
    for gradient, keras_own in zip(routed[1], expected[1]):
        assert gradient.dtype == keras_own.dtype == "bfloat16"
        gradient, keras_own = (np.asarray(ops.cast(g, "float32")) for g in (gradient, keras_own))
        np.testing.assert_allclose(gradient, keras_own, rtol=5e-2, atol=0.1)


def test_bias_gradients_sum_in_float32_without_a_reduce_window(jax, bfloat16_units):
    # From JAX's own gradient XLA makes a reduce-window, many times slower on a CPU.
    x, bias = operands((64, 32, 16), (16,))

    def loss(add):
        return lambda x, bias: ops.sum(ops.cast(add(x, bias), "float32") ** 2)

    keras_own = jax.grad(loss(ops.add), argnums=(0, 1))(x, bias)
    gradient = jax.jit(jax.grad(loss(products.summed_add_bias), argnums=(0, 1)))
    (x_gradient, bias_gradient), program = gradient(x, bias), gradient.lower(x, bias).compile().as_text()
    assert "reduce-window" not in program
    assert bias_gradient.dtype == "bfloat16"
    np.testing.assert_array_equal(
        np.asarray(ops.cast(x_gradient, "float32")), np.asarray(ops.cast(keras_own[0], "float32"))
    )
    # Summed in float32 and rounded once: within bfloat16's rounding of the exact sum.
    exact = 2 * np.sum(np.asarray(ops.cast(x, "float32")) + np.asarray(ops.cast(bias, "float32")), axis=(0, 1))
    np.testing.assert_allclose(np.asarray(ops.cast(bias_gradient, "float32")), exact, rtol=1e-2, atol=2.0)
    # Numbers and same-shaped tensors are Keras' own adds (a Python float keeps bfloat16).
    assert products.summed_add_bias(x, 1.0).dtype == products.summed_add_bias(x, x).dtype == "bfloat16"


def test_the_logits_bias_gradient_sums_in_float32(jax, bfloat16_units):
    import keras

    from keras_transformer.layers.logits_bias import LogitsBias

    layer = LogitsBias(vocabulary_size=16, dtype="mixed_bfloat16")
    assert "bfloat16_products" in speed_paths.attach(layer, WITH_UNITS, compiled=True)
    logits, _ = operands((64, 32, 16), (16,))

    def loss(bias):
        return ops.sum(ops.cast(layer.stateless_call([bias], [], logits)[0], "float32") ** 2)

    gradient = jax.jit(jax.grad(loss))
    bias = keras.ops.zeros((16,))
    assert "reduce-window" not in gradient.lower(bias).compile().as_text()
    exact = 2 * np.sum(np.asarray(ops.cast(logits, "float32")), axis=(0, 1))
    np.testing.assert_allclose(np.asarray(gradient(bias)), exact, rtol=1e-2, atol=2.0)


def test_the_traced_dot_takes_bfloat16_and_sums_in_float32(jax, bfloat16_units):
    a, b = operands((32, 64), (64, 48))
    outside = jax.jit(lambda a, b: ops.matmul(a, b)).lower(a, b).compile().as_text()
    inside = jax.jit(lambda a, b: products.summed_dense(a, b)).lower(a, b).compile().as_text()
    assert _dot_operand_types(inside) == {"bf16"}
    assert _dot_operand_types(outside) == {"f32"}  # Keras' own product: XLA converts the operands first


def test_the_path_is_chosen_only_under_xla_on_a_cpu_with_bfloat16_units():
    assert speed_paths.is_chosen("bfloat16_products", WITH_UNITS) is (keras.config.backend() != "torch")
    without = (
        dataclasses.replace(WITH_UNITS, cpu_flags=frozenset({"avx2"})),
        dataclasses.replace(WITH_UNITS, compiled=False),
        dataclasses.replace(WITH_UNITS, device="gpu"),
        dataclasses.replace(WITH_UNITS, backend="torch"),
        dataclasses.replace(WITH_UNITS, paths_off=frozenset({"bfloat16_products"})),
    )
    assert not any(speed_paths.is_chosen("bfloat16_products", runtime) for runtime in without)


def test_a_search_s_own_products_stay_keras_without_the_path(monkeypatch):
    monkeypatch.setattr(Runtime, "has_bfloat16_units", property(lambda self: False))
    a, b = operands((32, 64), (64, 48))
    assert not products.layers_sum_in_float32()
    # Keras' own product, which XLA's CPU backend computes in float32.
    if keras.config.backend() == "jax":
        import jax

        if jax.default_backend() == "cpu":
            program = jax.jit(lambda a, b: products.dense(a, b)).lower(a, b).compile().as_text()
            assert _dot_operand_types(program) == {"f32"}


def _dense_block(summed: bool):
    """A small `mixed_bfloat16` computation of dense and attention-projection products and bias adds, as a
    function of its input and its (float32) weights, and values for both."""
    rng = np.random.default_rng(0)
    shapes = [(6, 8), (8,), (8, 2, 3), (2, 3)]

    def forward(x, weights):
        kernel, bias, projection, projection_bias = (ops.cast(w, "bfloat16") for w in weights)
        if not summed:
            hidden = ops.gelu(ops.matmul(ops.cast(x, "bfloat16"), kernel) + bias)
            return ops.cast(ops.einsum("abc,cde->abde", hidden, projection) + projection_bias, "float32")
        hidden = ops.gelu(products.summed_dense(ops.cast(x, "bfloat16"), kernel, bias))
        projected = products.summed_einsum("abc,cde->abde", hidden, projection)
        return ops.cast(products.summed_add_bias(projected, projection_bias), "float32")

    x = rng.standard_normal((2, 3, 6)).astype("float32")
    return forward, x, [rng.standard_normal(shape).astype("float32") for shape in shapes]


# A traced (not yet optimised) dot of two bfloat16 operands into float32.
_BFLOAT16_DOT_SUMMED_IN_FLOAT32 = re.compile(
    r"dot_general .* : \(tensor<\S*xbf16>, tensor<\S*xbf16>\) -> tensor<\S*xf32>"
)


def test_forward_mode_derivatives_are_keras_own(jax):
    # jax.jvp and jax.jacfwd (Hessians, forward-mode sensitivities) of the routed products.
    results = {}
    for routing in (True, False):
        block, x, weights = _dense_block(routing)
        tangents = (np.ones_like(x), [np.ones(w.shape, "float32") for w in weights])
        derivatives = jax.jit(
            lambda x, w, t, block=block: (jax.jvp(block, (x, w), t)[1], jax.jacfwd(block, argnums=(0, 1))(x, w))
        )
        program = derivatives.lower(x, weights, tangents).as_text()
        assert bool(_BFLOAT16_DOT_SUMMED_IN_FLOAT32.search(program)) is routing
        results[routing] = jax.tree.leaves(derivatives(x, weights, tangents))
    for routed_value, keras_own in zip(results[True], results[False]):
        np.testing.assert_allclose(np.asarray(routed_value), np.asarray(keras_own), rtol=5e-2, atol=5e-2)


def _dot_operand_types(program: str) -> set[str]:
    types = dict(re.findall(r"%(\S+) = (\w+)\[", program))
    operands = re.findall(r" dot\(%([^,\s)]+), %([^,\s)]+)\)", program)
    return {types[name] for pair in operands for name in pair}


@pytest.fixture
def tf():
    import keras

    if keras.config.backend() != "tensorflow":
        pytest.skip("TensorFlow's products are rerouted under XLA")
    import tensorflow as tf

    return tf


def _tf_value_and_gradients(tf, loss, a, b):
    with tf.GradientTape() as tape:
        tape.watch([a, b])
        value = loss(a, b)
    return value, tape.gradient(value, [a, b])


@pytest.mark.parametrize("name", sorted(PRODUCTS))
def test_tensorflow_values_and_gradients_under_xla_are_keras_own(tf, name):
    (summed, keras_own), (a, b) = _squared_sums(PRODUCTS[name])
    expected = _tf_value_and_gradients(tf, keras_own, a, b)
    compiled = tf.function(lambda a, b: _tf_value_and_gradients(tf, summed, a, b), jit_compile=True)
    routed = compiled(a, b)
    program = compiled.experimental_get_compiler_ir(a, b)(stage="optimized_hlo")
    if _cpu_has_bfloat16_units(tf):
        assert "bf16" in _dot_operand_types(program)  # the forward product at least
    _assert_close(routed, expected)


def test_a_search_s_own_tensorflow_products_route_only_what_xla_compiles(tf, units_everywhere):
    a, b = operands((32, 64), (64, 48))
    # Eagerly and in a function without XLA, TensorFlow's own kernels run:
    # it has none for a bfloat16 product summed into float32.
    eager = products.dense(a, b)
    plain = tf.function(lambda a, b: products.dense(a, b), jit_compile=False)(a, b)
    compiled = tf.function(lambda a, b: products.dense(a, b), jit_compile=True)
    np.testing.assert_array_equal(np.asarray(ops.cast(plain, "float32")), np.asarray(ops.cast(eager, "float32")))
    np.testing.assert_allclose(
        np.asarray(ops.cast(compiled(a, b), "float32")), np.asarray(ops.cast(eager, "float32")), rtol=2e-2, atol=0.1
    )
    if _cpu_has_bfloat16_units(tf):
        program = compiled.experimental_get_compiler_ir(a, b)(stage="optimized_hlo")
        assert _dot_operand_types(program) == {"bf16"}


def _cpu_has_bfloat16_units(tf) -> bool:
    return not tf.config.list_physical_devices("GPU") and speed_paths.describe_runtime().has_bfloat16_units


def test_other_products_and_dtypes_are_left_alone():
    a, b = (np.ones((2, 3, 4), "float32"), np.ones((2, 4, 5), "float32"))
    batched = products.summed_dense(ops.cast(a, "bfloat16"), ops.cast(b, "bfloat16"))  # batched: not a tensordot
    single = products.summed_dense(a[0], b[0])
    assert ops.convert_to_numpy(ops.cast(batched, "float32")).tolist() == np.full((2, 3, 5), 4.0).tolist()
    assert ops.convert_to_numpy(single).dtype == np.float32


@pytest.fixture
def bfloat16_units(jax):
    if jax.default_backend() != "cpu" or not speed_paths.describe_runtime().has_bfloat16_units:
        pytest.skip("the products are rerouted on CPUs with bfloat16 instructions only")


TASK_INPUTS = {
    "encoder_token_ids": np.ones((2, 5), "int32"),
    "encoder_padding_mask": np.ones((2, 5), "int32"),
    "decoder_token_ids": np.ones((2, 4), "int32"),
    "decoder_padding_mask": np.ones((2, 4), "int32"),
}


def _task_program(jax, tokenizer, enabled: bool) -> str:
    """The optimised XLA program of a tiny `mixed_bfloat16` Transformer's
    forward pass, as `fit` runs it (the functional graph of its layers)."""
    from helpers import make_model

    model = make_model(tokenizer, dtype="mixed_bfloat16")
    if enabled:
        speed_paths.attach(model, WITH_UNITS, compiled=True)
    inputs = TASK_INPUTS
    values = [v.value for v in model.trainable_variables + model.non_trainable_variables]

    def forward(values, inputs):
        trainable, non_trainable = values[: len(model.trainable_variables)], values[len(model.trainable_variables) :]
        return model.stateless_call(trainable, non_trainable, inputs)[0]

    return jax.jit(forward).lower(values, inputs).compile().as_text()


def _dots_by_output_width(program: str) -> dict[int, set[str]]:
    """The operand element types of the program's dots, by their output's last dimension."""
    types = dict(re.findall(r"%(\S+) = (\w+)\[", program))
    dots = re.findall(r"= \w+\[(?:\d+,)*(\d+)\]\S* dot\(%([^,\s)]+), %([^,\s)]+)\)", program)
    widths = {}
    for width, first, second in dots:
        widths.setdefault(int(width), set()).update((types[first], types[second]))
    return widths


def test_the_model_s_layers_trace_bfloat16_dots(jax, bfloat16_units, tokenizer):
    # The feed-forward layers (d_ff = 32 wide) and the pre-softmax projection
    # (64 tokens wide) multiply bfloat16 operands; without it XLA converts
    # them to float32 first.
    vocabulary, d_ff = tokenizer.vocabulary_size(), 32
    assert vocabulary == 64
    inside, outside = (
        _dots_by_output_width(_task_program(jax, tokenizer, True)),
        _dots_by_output_width(_task_program(jax, tokenizer, False)),
    )
    assert inside[vocabulary] == inside[d_ff] == {"bf16"}
    assert outside[vocabulary] == outside[d_ff] == {"f32"}


def test_tensorflow_model_layers_trace_bfloat16_dots_under_xla(tf, tokenizer):
    # As the compiled searches trace them: the feed-forward layers multiply
    # bfloat16 operands. (The pre-softmax projection, a product with the
    # transposed embedding, stays float32: see the module's docstring.)
    if not _cpu_has_bfloat16_units(tf):
        pytest.skip("the products are rerouted on CPUs with bfloat16 instructions only")
    from helpers import make_model

    model = make_model(tokenizer, dtype="mixed_bfloat16")
    inputs = TASK_INPUTS
    programs = {}
    for enabled in (True, False):
        if enabled:
            speed_paths.attach(model, WITH_UNITS, compiled=True)
        else:
            speed_paths.detach(model)
        forward = tf.function(lambda inputs: model(inputs, training=False), jit_compile=True)
        programs[enabled] = _dots_by_output_width(forward.experimental_get_compiler_ir(inputs)(stage="optimized_hlo"))
    d_ff = 32
    assert programs[True][d_ff] == {"bf16"}
    assert programs[False][d_ff] == {"f32"}


def test_tensorflow_trains_bfloat16_without_xla_and_decodes_with_it(monkeypatch, tokenizer):
    import keras

    if keras.config.backend() != "tensorflow":
        pytest.skip("XLA is chosen per dtype on TensorFlow only")
    from helpers import make_model
    from keras_transformer.generation import decoding, search_runner
    from keras_transformer.speed_paths import Runtime

    for flags, expected in ((frozenset(), True), (frozenset({"avx512_bf16"}), False)):  # ends with bfloat16 units
        runtime = Runtime("tensorflow", "cpu", cpu_flags=flags)
        monkeypatch.setattr(decoding, "describe_runtime", lambda runtime=runtime: runtime)
        assert decoding.resolve_jit_compile("auto", "bfloat16", runtime) is expected
        assert decoding.resolve_jit_compile("auto", "float32", runtime) is True
        assert decoding.resolve_jit_compile("auto", runtime=runtime) is True
        assert decoding.resolve_jit_compile(True, "bfloat16", runtime) is True

    # A compiled bfloat16 model: training steps without XLA, its searches with it.
    searches = []
    monkeypatch.setattr(search_runner, "compiled_search", lambda model, jit, *args: searches.append(jit) or (1 / 0))
    model = make_model(tokenizer, dtype="mixed_bfloat16")
    model.compile()
    assert model.jit_compile is False
    with pytest.raises(ZeroDivisionError):
        model.generate("a dog runs .")
    assert searches == [True]


def test_tensorflow_searches_project_onto_a_transposed_bfloat16_kernel(tf, tokenizer, monkeypatch):
    # XLA keeps `h E^T` in float32 (E transposed): a compiled search makes
    # E^T in bfloat16 once, and translates as with Keras' own products.
    if not _cpu_has_bfloat16_units(tf):
        pytest.skip("the products are rerouted on CPUs with bfloat16 instructions only")
    from helpers import make_model
    from keras_transformer.speed_paths import describe_runtime, output_projection

    model = make_model(tokenizer, dtype="mixed_bfloat16")
    backbone = model.backbone
    runtime = describe_runtime()
    assert output_projection.step_logits(backbone, runtime) == backbone.logits  # eagerly TensorFlow's own kernels run
    hidden = np.ones((2, 1, backbone.hidden_dim), "float32")
    logits_of = output_projection.step_logits
    logits = tf.function(lambda: logits_of(backbone, runtime)(ops.cast(hidden, "bfloat16")), jit_compile=True)()
    assert logits.dtype == "bfloat16" and tuple(logits.shape) == (2, 1, backbone.vocabulary_size)
    assert logits_of(make_model(tokenizer).backbone, runtime) == backbone.logits  # float32

    made, original = [], output_projection.step_logits

    def recorded(backbone, runtime):
        chosen = original(backbone, runtime)
        made.append(chosen != backbone.logits)
        return chosen

    monkeypatch.setattr(output_projection, "step_logits", recorded)
    sentences = ["a dog runs .", "two men play football in the park ."]
    model.compile(jit_compile=True)
    routed = model.generate(sentences)
    assert made and all(made)
    traced = len(made)
    monkeypatch.setenv("KERAS_TRANSFORMER_SPEED_PATHS_OFF", "bfloat16_products")
    model.compile(jit_compile=True)  # traced anew, with Keras' own products
    assert model.generate(sentences) == routed
    assert len(made) > traced and not any(made[traced:])
