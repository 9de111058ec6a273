"""The SavedModel export: strings in, the same translations out, without this package.

The exported model is loaded in a fresh Python that imports only TensorFlow
and tensorflow_text, as TensorFlow Serving or any TensorFlow program would.
"""

import json
import os
import subprocess
import sys

import keras
import pytest

import keras_transformer as kt
from helpers import make_model
from keras_transformer.generation.saved_model import export_saved_model

pytestmark = [
    pytest.mark.slow,  # an export and a fresh TensorFlow process: ~40 s
    pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="a SavedModel is exported on TensorFlow"),
]

# The fifth has 15 tokens, more than the tiny model's 14: the graph truncates
# it, as translate(too_long="truncate", split_sentences=False) does.
SOURCES = ["a dog runs .", "two cats play .", "", "a woman walks .", "two two dogs sleep sleep .", "a"]
# Opus-MT: the fourth has characters neither vocabulary has (<unk>), the fifth
# a language tag, the last more pieces than the model takes.
MARIAN_SOURCES = [
    "A dog runs across the green field.",
    "Two children are playing in the snow.",
    "",
    "The cat sleeps on the warm window sill, 日本語 😀.",
    ">>deu<< A little girl eats an ice cream.",
    " ".join(["Some people are waiting for the bus."] * 40),
]

LOADER = """
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

model = tf.saved_model.load(sys.argv[1])
sources = tf.constant(json.loads(sys.argv[2]))
default = model.signatures["serving_default"](inputs=sources)["outputs"]
greedy = model.signatures["translate_with_options"](
    inputs=sources, alpha=tf.constant(0.6), greedy=tf.constant(True))["outputs"]
long_penalty = model.signatures["translate_with_options"](
    inputs=sources, alpha=tf.constant(1.5), greedy=tf.constant(False))["outputs"]
empty = model.signatures["serving_default"](inputs=tf.constant([], tf.string))["outputs"]
assert "keras_transformer" not in sys.modules
print(json.dumps({
    "beam": [t.decode("utf-8") for t in default.numpy()],
    "greedy": [t.decode("utf-8") for t in greedy.numpy()],
    "alpha 1.5": [t.decode("utf-8") for t in long_penalty.numpy()],
    "empty": empty.numpy().tolist(),
}))
"""


def load_and_translate(directory, sources) -> dict:
    """Runs the SavedModel in a Python that never imports keras_transformer."""
    result = subprocess.run(
        [sys.executable, "-c", LOADER, str(directory), json.dumps(sources)],
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def assert_translates_as_translate(model, outputs: dict, sources: list[str]) -> None:
    """The SavedModel's outputs equal `model.translate`'s (one source of
    `sources` is too long, so each `translate` warns that it truncated)."""
    for key, options in (
        ("beam", dict(beam_size=4)),
        ("greedy", dict(beam_size=None)),
        ("alpha 1.5", dict(beam_size=4, alpha=1.5)),
    ):
        with pytest.warns(UserWarning, match="truncated"):
            assert outputs[key] == model.translate(sources, too_long="truncate", split_sentences=False, **options), key
    assert outputs["empty"] == []


@pytest.mark.parametrize("trained", [True, False], ids=["trained", "random"])
def test_saved_model_translates_as_translate_does(trained, trained_model, tokenizer, tmp_path):
    if trained:
        model = trained_model
    else:
        # Untrained: long, arbitrary outputs, where the search matters more.
        keras.utils.set_random_seed(11)
        model = make_model(tokenizer)
    directory = export_saved_model(model, tmp_path / "exported")
    outputs = load_and_translate(directory, SOURCES)
    assert_translates_as_translate(model, outputs, SOURCES)
    if trained:
        assert outputs["beam"][:2] == ["ein hund rennt .", "zwei katzen spielen ."]


# "big" (special ids mid-vocabulary) is slow here (about 3 minutes): an integration test.
@pytest.fixture(scope="module", params=["base", pytest.param("big", marks=pytest.mark.slow)])
def marian_model(request, tmp_path_factory):
    """A small Opus-MT checkpoint (tests/marian_fixtures.py) loaded from its
    folder: `</s>` and `<unk>` are ids 0 and 1 in "base", mid-vocabulary in "big"."""
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    from marian_fixtures import write_marian_repo

    folder = write_marian_repo(tmp_path_factory.mktemp("marian") / request.param, request.param)["folder"]
    return kt.Transformer.from_preset(str(folder))


def test_marian_saved_model_translates_as_translate_does(marian_model, tmp_path):
    tokenizer = marian_model.preprocessor.tokenizer
    # Not vacuous: the vocabulary lacks pieces of the fourth; the last is cut.
    assert tokenizer.unk_token_id in list(map(int, tokenizer(MARIAN_SOURCES[3])))
    assert len(tokenizer(MARIAN_SOURCES[-1])) > marian_model.max_source_tokens
    directory = export_saved_model(marian_model, tmp_path / "exported")
    outputs = load_and_translate(directory, MARIAN_SOURCES)
    assert_translates_as_translate(marian_model, outputs, MARIAN_SOURCES)
    assert outputs["beam"][2] == "" and all(outputs["beam"][:2])


def test_export_refuses_a_folder_with_files_unless_overwrite(tiny_model, tmp_path):
    directory = tmp_path / "exported"
    directory.mkdir()
    (directory / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        export_saved_model(tiny_model, directory)
    assert (directory / "keep.txt").read_text() == "mine"
    export_saved_model(tiny_model, directory, overwrite=True)
    assert (directory / "saved_model.pb").exists() and not (directory / "keep.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["exported"]  # no temporary folder left


def test_export_checks_its_arguments(tiny_model, tmp_path):
    with pytest.raises(ValueError, match="beam_size"):
        export_saved_model(tiny_model, tmp_path / "a", beam_size=0)
    with pytest.raises(ValueError, match="alpha"):
        export_saved_model(tiny_model, tmp_path / "a", alpha=-1.0)
    assert not (tmp_path / "a").exists()
