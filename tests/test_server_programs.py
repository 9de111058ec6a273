"""The server's compiled searches (`server.programs`) and when its engine compiles them.

A server compiles one program per batch shape, each once, and after warming
up decodes only shapes it has compiled: these tests hold it to the
translations of `Transformer.generate`, on the backend under test.
"""

import threading

import pytest

pytest.importorskip("starlette", reason="the server's tests need the serve extra: pip install '.[serve]'")

import keras  # noqa: E402

from helpers import PAIRS  # noqa: E402
from keras_transformer.generation.settings import SearchSettings  # noqa: E402
from keras_transformer.server import ModelEngine  # noqa: E402
from keras_transformer.server import programs as programs_module  # noqa: E402
from keras_transformer.server.programs import SearchPrograms  # noqa: E402

SOURCES = [source for source, _ in PAIRS]
GREEDY = SearchSettings(beam_size=None)


@pytest.mark.parametrize(
    "search", [SearchSettings(beam_size=None), SearchSettings(beam_size=2)], ids=["greedy", "beam"]
)
def test_a_program_translates_as_generate_does(trained_model, search):
    rows = [segment.token_ids for segment in ModelEngine(trained_model).segments(SOURCES[:3])]
    token_ids = trained_model.preprocessor.pack_sources(rows)
    programs = SearchPrograms(trained_model, search)
    found = [str(text) for text in trained_model.preprocessor.generate_postprocess(programs.run(token_ids))]
    assert found == trained_model.generate(token_ids, search=search)
    assert programs.compiled(token_ids["encoder_token_ids"].shape[1]) == [3]


def test_after_warm_up_no_batch_waits_for_a_compiler(trained_model):
    engine = ModelEngine(trained_model, search=SearchSettings(beam_size=None), max_batch_size=8, max_source_bucket=32)
    assert engine.batch_sizes == (1, 4, 8)
    engine.warm_up()
    assert [engine.programs.compiled(width) for width in engine.length_buckets] == [[1]] * len(engine.length_buckets)
    assert engine.rows_per_batch(16) == 1  # what the batcher takes: only compiled sizes
    rows = [segment.token_ids for segment in engine.segments(SOURCES[:3])]
    assert engine.translate_rows(rows) == trained_model.translate(SOURCES[:3], search=engine.search)
    assert [engine.programs.compiled(width) for width in engine.length_buckets] == [[1]] * len(engine.length_buckets)

    engine.warm_up_later()
    assert engine.rows_per_batch(16) == 8 and engine.programs.compiled(16) == [1, 4, 8]
    assert engine.translate_rows(rows) == trained_model.translate(SOURCES[:3], search=engine.search)


def test_compiling_later_stops_between_shapes(trained_model):
    engine = ModelEngine(trained_model, search=SearchSettings(beam_size=None), max_batch_size=16, max_source_bucket=16)
    engine.warm_up()
    stop, seen = threading.Event(), []

    def on_shape(done, total):
        seen.append((done, total))
        stop.set()

    engine.warm_up_later(on_shape, stop=stop)
    assert seen == [(1, 2)] and engine.programs.compiled(16) == [1, 4]


def test_models_of_the_same_dimensions_share_one_program_on_jax(trained_model, tiny_model):
    if keras.config.backend() != "jax":
        pytest.skip("programs are shared by JAX's ahead-of-time executables only")
    before = len(set(map(id, programs_module._EXECUTABLES.values())))
    engines = [
        ModelEngine(model, search=GREEDY, max_batch_size=1, max_source_bucket=16)
        for model in (trained_model, tiny_model)
    ]
    for engine in engines:
        engine.warm_up()
    assert len(set(map(id, programs_module._EXECUTABLES.values()))) - before <= 1  # one, unless compiled before
    for engine in engines:  # each with its own weights
        rows = [segment.token_ids for segment in engine.segments(SOURCES[:1])]
        assert engine.translate_rows(rows) == engine.model.translate(SOURCES[:1], search=GREEDY)


def test_a_compiled_shape_runs_while_another_shape_compiles(trained_model, monkeypatch):
    programs = SearchPrograms(trained_model, GREEDY)
    programs.compile(1, 16)
    compiling, release = threading.Event(), threading.Event()
    make_program = SearchPrograms._program

    def slow_program(self, size, width):
        compiling.set()
        release.wait(60)
        return make_program(self, size, width)

    monkeypatch.setattr(SearchPrograms, "_program", slow_program)
    later = threading.Thread(target=programs.compile, args=(4, 16))
    later.start()
    try:
        assert compiling.wait(60)
        token_ids = trained_model.preprocessor.pack_sources([[5, 6, 7]], 16)
        answered = []
        runner = threading.Thread(target=lambda: answered.append(programs.run(token_ids)))
        runner.start()
        runner.join(60)
        assert answered, "a batch of a compiled shape waited for another shape's compilation"
    finally:
        release.set()
        later.join()
    assert programs.compiled(16) == [1, 4]
