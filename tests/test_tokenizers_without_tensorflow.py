"""Tokenizing and translating in a process without TensorFlow.

`keras-transformer serve` and `translate` keep TensorFlow out of a JAX or
torch process (`cli.startup`): KerasHub then tokenizes with `sentencepiece`,
and `MarianTokenizer` with `marian.python_tokenization`. Each must give what
the TensorFlow ops give: the same ids for the same texts, the same texts for
the same ids, and the same translations.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from marian_fixtures import LANGUAGE_SENTENCES, LANGUAGE_TAGS, SOURCE_SENTENCES, pieces_of, train_sentencepiece

REPO = Path(__file__).resolve().parent.parent
TEXTS = [
    "A dog runs across the green field.",
    "  Two  dogs\tplay in the snow. ",
    "",
    "Ünïcödé wörds, digits 1234 and émojis 🙂 the model never saw.",
    ">>deu<< A dog runs.",
    ">>nld<<A dog runs.",
    ">>xyz<< an unknown tag is still one piece.",
    "a >>deu<< tag not at the start",
    ">> no closing tag",
    "Line one.\nLine two.",
]
ROWS = [[5, 9, 12, 0], [1, 7, 7, 3], [], [2, 4, 6, 8, 10, 11, 13]]

# In the child process: TensorFlow refused as `cli.startup` refuses optional imports.
WITHOUT_TENSORFLOW = """
import sys
sys.modules["tensorflow"] = None
sys.modules["tensorflow_text"] = None
"""

EXERCISE = """
import json, sys
import keras_transformer as kt
from keras_transformer.marian import MarianTokenizer

texts, rows, folder = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]

def to_lists(values):
    values = values.tolist() if hasattr(values, "tolist") else values
    return [to_lists(v) if isinstance(v, (list, tuple)) or hasattr(v, "tolist") else v for v in values]

def text(value):
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)

def exercise(tokenizer, texts, rows, target):
    result = {"ids": [to_lists(tokenizer.tokenize(t)) for t in texts], "batch": to_lists(tokenizer.tokenize(texts))}
    result["texts"] = [text(tokenizer.detokenize(row)) for row in rows if row]
    result["batch_texts"] = [text(t) for t in tokenizer.detokenize(rows)]
    if target:
        result["target_ids"] = to_lists(tokenizer.tokenize_target(texts))
    return result

model = kt.Transformer.from_preset("multi30k_en_de")
shared = MarianTokenizer(f"{folder}/source.spm", f"{folder}/target.spm", f"{folder}/vocab.json", target_language="deu")
separate = MarianTokenizer(f"{folder}/source.spm", f"{folder}/target.spm", f"{folder}/vocab.json",
                           target_vocabulary=f"{folder}/target_vocab.json")
print(json.dumps({
    "tensorflow": "tensorflow" in sys.modules and sys.modules["tensorflow"] is not None,
    "transformer": exercise(model.preprocessor.tokenizer, texts, rows, False),
    "shared": exercise(shared, texts, rows, True),
    "separate": exercise(separate, [t for t in texts if not t.startswith(">>xyz")], rows, True),
    "translations": model.translate(["A man rides a bike.", "Two dogs play in the snow.", "Ünïcödé!"]),
}))
"""


@pytest.fixture(scope="module")
def marian_files(tmp_path_factory) -> Path:
    """A Marian tokenizer's files: both SentencePiece models, a shared and a target vocabulary."""
    folder = tmp_path_factory.mktemp("marian_tokenizer")
    targets = [s for sentences in LANGUAGE_SENTENCES.values() for s in sentences]
    source, target = train_sentencepiece(SOURCE_SENTENCES, 120), train_sentencepiece(targets, 50)
    (folder / "source.spm").write_bytes(source)
    (folder / "target.spm").write_bytes(target)
    special = ["</s>", "<unk>"]
    shared = special + LANGUAGE_TAGS + list(dict.fromkeys(pieces_of(source) + pieces_of(target))) + ["<pad>"]
    target_only = special + pieces_of(target) + ["<pad>"]
    for name, pieces in (("vocab.json", shared), ("target_vocab.json", target_only)):
        (folder / name).write_text(json.dumps({p: i for i, p in enumerate(pieces)}), encoding="utf-8")
    return folder


def _run(marian_files: Path, without_tensorflow: bool) -> dict:
    program = (WITHOUT_TENSORFLOW if without_tensorflow else "") + textwrap.dedent(EXERCISE)
    env = {**os.environ, "KERAS_BACKEND": "jax" if _installed("jax") else "torch", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", program, json.dumps(TEXTS), json.dumps(ROWS), str(marian_files)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


@pytest.mark.skipif(not (_installed("jax") or _installed("torch")), reason="needs JAX or torch as a Keras backend")
def test_without_tensorflow_texts_tokenize_detokenize_and_translate_as_with_it(marian_files):
    without = _run(marian_files, without_tensorflow=True)
    with_tensorflow = _run(marian_files, without_tensorflow=False)
    assert (without.pop("tensorflow"), with_tensorflow.pop("tensorflow")) == (False, True)
    for part in ("transformer", "shared", "separate"):
        assert without[part] == with_tensorflow[part], part
    assert without["translations"] == with_tensorflow["translations"]
