"""Each search-level speed path translates as the plain search does, token for
token, on every backend where it applies, and each can be switched off by name."""

import dataclasses

import keras
import numpy as np
import pytest

import keras_transformer as kt
from helpers import TINY_CONFIG
from keras_transformer.generation import search_runner
from keras_transformer.generation.decoding import resolve_jit_compile
from keras_transformer.generation.search import SearchKernels
from keras_transformer.generation.search_runner import SearchRunner
from keras_transformer.speed_paths import PATHS, Runtime, describe_runtime, is_chosen, output_projection
from keras_transformer.speed_paths.chunked_top_k import best_extensions_in_chunks
from keras_transformer.speed_paths.first_argmax_by_max import first_argmax_by_max
from keras_transformer.speed_paths.runtime import OFF_VARIABLE
from keras_transformer.speed_paths.search_kernels import search_kernels

SEARCH_PATHS = (
    "one_row_padding",
    "two_halves",
    "first_argmax_by_max",
    "chunked_top_k",
    "transposed_bf16_kernel",
    "vocabulary_parts",
    "torch_transposed_copy",
    "compiled_torch_step",
)
# A vocabulary large enough for chunks and for the projection in parts.
VOCABULARY = 16_000


@pytest.fixture(scope="module")
def model() -> kt.Transformer:
    """A tiny untrained model of a large vocabulary, without a preprocessor."""
    keras.utils.set_random_seed(11)
    return kt.Transformer(backbone=kt.TransformerBackbone(vocabulary_size=VOCABULARY, **TINY_CONFIG))


def token_ids(sentences: int, buffer_length: int = 8) -> dict:
    rng = np.random.default_rng(sentences)
    ids = rng.integers(4, VOCABULARY, size=(sentences, 9)).astype("int32")
    mask = np.arange(9)[None, :] < rng.integers(3, 10, size=(sentences, 1))
    return {
        "encoder_token_ids": np.where(mask, ids, 0).astype("int32"),
        "encoder_padding_mask": mask,
        "decoder_token_ids": np.zeros((sentences, buffer_length), "int32"),
    }


def on_two_cores(**changes) -> Runtime:
    """This process's runtime, as if it had (at least) two cores."""
    runtime = describe_runtime()
    return dataclasses.replace(runtime, cores=max(runtime.cores, 2), **changes)


def test_every_search_path_is_registered_and_switched_off_by_name():
    import keras_transformer.speed_paths.search_kernels  # noqa: F401 (registers the search's paths)

    everywhere = [
        Runtime(backend, "cpu", cpu_flags=frozenset({"avx512_bf16"}), cores=2)
        for backend in ("tensorflow", "jax", "torch")
    ]
    for name in SEARCH_PATHS:
        assert PATHS[name].reason, name
        applies = [runtime for runtime in everywhere if is_chosen(name, runtime)]
        assert applies, f"{name} applies to no runtime"
        for runtime in applies:
            assert not is_chosen(name, dataclasses.replace(runtime, paths_off=frozenset({name})))
            assert not is_chosen(name, dataclasses.replace(runtime, paths_off=frozenset({"all"})))
            others = frozenset(SEARCH_PATHS) - {name}
            assert is_chosen(name, dataclasses.replace(runtime, paths_off=others))


@pytest.fixture
def paths_off_by_variable(monkeypatch):
    """Sets the environment variable's names, which `describe_runtime` reads at each call."""

    def switch_off(names: str) -> None:
        monkeypatch.setenv(OFF_VARIABLE, names)

    return switch_off


def test_the_environment_variable_switches_paths_off(paths_off_by_variable):
    paths_off_by_variable(" one_row_padding,two_halves ")
    assert describe_runtime().paths_off == {"one_row_padding", "two_halves"}
    assert not is_chosen("one_row_padding") and not is_chosen("two_halves")
    paths_off_by_variable("all")
    assert not any(is_chosen(name) for name in SEARCH_PATHS)


@pytest.fixture
def runs(monkeypatch) -> list:
    """`(rows, parts)` of every search a runner runs."""
    recorded, search_in_parts = [], search_runner.search_in_parts

    def recording(function, inputs, parts, at_once=True):
        recorded.append((len(inputs["encoder_token_ids"]), parts))
        return search_in_parts(function, inputs, parts, at_once)

    monkeypatch.setattr(search_runner, "search_in_parts", recording)
    return recorded


def translations(model, runtime: Runtime, inputs: dict, beam_size) -> dict:
    """The token ids of a compiled search of `inputs` on `runtime`, run twice (halves run at once the second time)."""
    runner = SearchRunner(model, resolve_jit_compile(), eagerly=False, runtime=runtime)
    settings = kt.SearchSettings(beam_size=beam_size)
    first = runner.run(inputs, settings)
    again = runner.run(inputs, settings)
    for name in first:
        np.testing.assert_array_equal(again[name], first[name])
    return first


CASES = [  # (path, beam size, sentences)
    ("one_row_padding", None, 1),
    ("two_halves", None, 8),
    ("two_halves", 3, 6),
    ("first_argmax_by_max", None, 6),
    ("chunked_top_k", 4, 6),
    ("transposed_bf16_kernel", 4, 6),
    ("vocabulary_parts", 4, 32),  # 128 rows (in one piece): the projection in parts
    ("torch_transposed_copy", None, 6),
    ("torch_transposed_copy", 4, 6),
]


@pytest.mark.parametrize("path, beam_size, sentences", CASES)
def test_a_path_translates_as_the_plain_search(model, path, beam_size, sentences, runs, monkeypatch):
    # The projection is computed in parts for a whole batch of 128 rows, not for its halves.
    on = on_two_cores(paths_off=frozenset({"two_halves"} if path == "vocabulary_parts" else ()))
    if not is_chosen(path, on):
        pytest.skip(f"{path} does not apply to {on}")
    off = dataclasses.replace(on, paths_off=on.paths_off | {path})
    by_parts = []
    original = output_projection.logits_by_parts
    monkeypatch.setattr(
        output_projection, "logits_by_parts", lambda *args: by_parts.append(len(args[0])) or original(*args)
    )
    if path == "transposed_bf16_kernel":  # bfloat16 layers only
        keras.utils.set_random_seed(11)
        backbone = kt.TransformerBackbone(vocabulary_size=VOCABULARY, dtype="mixed_bfloat16", **TINY_CONFIG)
        model = kt.Transformer(backbone=backbone)
    inputs = token_ids(sentences)
    with_path = translations(model, on, inputs, beam_size)
    taken, runs[:] = list(runs), []
    parts_taken, by_parts[:] = list(by_parts), []
    without = translations(model, off, inputs, beam_size)
    for name in ("decoder_token_ids", "decoder_padding_mask"):
        np.testing.assert_array_equal(with_path[name], without[name])
    assert with_path["decoder_token_ids"].shape == (sentences, 8)
    # The path was taken with it on, and not with it off.
    if path == "one_row_padding":
        assert taken[0] == (2, 1) and runs[0] == (1, 1)
    if path == "two_halves":
        assert taken[0][1] == 2 and runs[0][1] == 1
    if path == "vocabulary_parts":
        assert parts_taken and set(parts_taken) == {4 * sentences} and not by_parts
    kernels_on = search_kernels(on, resolve_jit_compile(), traced=True)
    kernels_off = search_kernels(off, resolve_jit_compile(), traced=True)
    if path == "first_argmax_by_max":
        assert kernels_on.argmax is first_argmax_by_max and kernels_off.argmax is not first_argmax_by_max
    if path == "chunked_top_k":
        assert kernels_on.best_extensions is best_extensions_in_chunks
        assert kernels_off.best_extensions is not best_extensions_in_chunks
    if path == "torch_transposed_copy":
        backbone = model.backbone
        assert output_projection.step_logits(backbone, on) != backbone.logits
        assert output_projection.step_logits(backbone, off) == backbone.logits


def test_with_every_path_off_a_search_takes_the_plain_kernels_and_rows(model, runs):
    plain = dataclasses.replace(on_two_cores(), paths_off=frozenset({"all"}))
    kernels = search_kernels(plain, jit_compile=True, traced=True)
    plain_kernels = SearchKernels()
    assert kernels.argmax is plain_kernels.argmax and kernels.best_extensions is plain_kernels.best_extensions
    assert kernels.compile_body is None
    assert kernels.step_logits(model.backbone) == model.backbone.logits
    translations(model, plain, token_ids(1), beam_size=None)
    assert runs[0] == (1, 1)
