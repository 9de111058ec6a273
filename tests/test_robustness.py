"""Bad, empty, huge and arbitrary input to the tokenizer and `translate`."""

import os
import random
import signal
import subprocess
import sys
import time
import unicodedata

import keras
import numpy as np
import pytest
import sentencepiece
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from keras import ops

from helpers import PAIRS, REPO_ROOT, TINY_TRAIN_ARGUMENTS, record_batches
from keras_transformer.generation.translation import tokenize
from keras_transformer.training import checkpoints
from keras_transformer.training.callbacks import CURVES_CSV, read_curves

LONG_TEXT = " ".join(p[0] for p in PAIRS[:4])  # four sentences, more than 14 tokens


# --- Checking the input -------------------------------------------------


def test_empty_and_blank_strings_translate_to_empty_without_the_model(tiny_model, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the model ran")

    monkeypatch.setattr(tiny_model, "generate", fail)
    assert tiny_model.translate(["", "   ", "\t\n", "\u3000"]) == ["", "", "", ""]
    assert tiny_model.translate("") == ""
    assert tiny_model.translate([]) == []


@pytest.mark.parametrize("texts", [None, 42, {"a": 1}])
def test_a_non_string_argument_is_a_type_error_naming_it(tiny_model, texts):
    with pytest.raises(TypeError, match="argument 'texts'"):
        tiny_model.translate(texts)


def test_a_bad_item_is_named_by_its_index(tiny_model):
    with pytest.raises(TypeError, match="'texts' item 2 must be a string; got NoneType"):
        tiny_model.translate(["a dog .", "a cat .", None])
    with pytest.raises(TypeError, match="item 1 must be a string; got int"):
        tiny_model.translate(["a dog .", 7])
    with pytest.raises(ValueError, match="item 1 is not valid UTF-8 .*byte 2"):
        tiny_model.translate([b"a dog", b"a \xff cat"])
    with pytest.raises(ValueError, match="item 0 cannot be encoded as UTF-8"):
        tiny_model.translate(["a \ud800 dog"])


def test_bytes_are_decoded_as_utf8(trained_model):
    assert trained_model.translate([b"a dog runs .", b"a cat sleeps ."], beam_size=None) == [
        "ein hund rennt .",
        "eine katze schläft .",
    ]
    assert trained_model.translate(b"a dog runs .", beam_size=None) == "ein hund rennt ."


def test_packed_sources_match_the_preprocessor(tiny_model):
    texts = ["a dog runs .", "two cats play ."]
    packed = tiny_model.preprocessor.pack_sources(tokenize(tiny_model.preprocessor.tokenizer, texts))
    length = packed["encoder_token_ids"].shape[1]
    expected = tiny_model.preprocessor.generate_preprocess(texts, encoder_sequence_length=length)
    for key in ("encoder_token_ids", "encoder_padding_mask"):
        expected_values = ops.convert_to_numpy(expected[key])
        np.testing.assert_array_equal(packed[key], expected_values.astype(packed[key].dtype))


# --- Too long -----------------------------------------------------------


def test_too_long_input_is_split_at_sentences_and_joined(trained_model, monkeypatch):
    room = trained_model.max_source_tokens
    assert room == 14  # preprocessor length 16 minus <s> </s>
    assert len(tokenize(trained_model.preprocessor.tokenizer, [LONG_TEXT])[0]) > room
    batches = record_batches(trained_model, monkeypatch)
    translation = trained_model.translate(["two cats play .", LONG_TEXT], beam_size=None)
    assert translation == ["zwei katzen spielen .", " ".join(p[1] for p in PAIRS[:4])]
    assert sum(len(b) for b in batches) == 5  # one sentence, and four


def test_too_long_sentence_is_split_on_token_count_at_word_starts(tiny_model, monkeypatch):
    text = " ".join(["a dog runs"] * 8)  # no sentence end, 24+ tokens
    batches = record_batches(tiny_model, monkeypatch)
    assert isinstance(tiny_model.translate(text, beam_size=None, max_extra_length=2), str)
    tokenizer = tiny_model.preprocessor.tokenizer
    rows = [row[1 : int(np.sum(row != 0)) - 1] for batch in batches for row in batch]
    assert len(rows) >= 2 and all(len(r) <= tiny_model.max_source_tokens for r in rows)
    assert sum(len(r) for r in rows) == len(tokenize(tiny_model.preprocessor.tokenizer, [text])[0])  # nothing lost
    vocabulary = tokenizer.get_vocabulary()
    assert all(vocabulary[int(r[0])].startswith("\u2581") for r in rows)  # each piece starts a word


def test_too_long_error_and_truncate_policies(tiny_model, monkeypatch):
    with pytest.raises(ValueError, match=r"texts\[1\] has \d+ tokens, more than the 14 .*1 input"):
        tiny_model.translate(["a dog .", LONG_TEXT], too_long="error", split_sentences=False)
    batches = record_batches(tiny_model, monkeypatch)
    with pytest.warns(UserWarning, match="1 input.* truncated to 14 tokens"):
        tiny_model.translate(
            ["a dog .", LONG_TEXT], too_long="truncate", beam_size=None, max_extra_length=2, split_sentences=False
        )
    short = len(tokenize(tiny_model.preprocessor.tokenizer, ["a dog ."])[0])
    assert sorted(int(np.sum(row != 0)) - 2 for row in batches[0]) == [short, 14]
    with pytest.raises(ValueError, match="too_long must be one of"):
        tiny_model.translate("a dog .", too_long="ignore")


def test_many_sentences_are_decoded_in_bounded_batches_with_progress(tiny_model, monkeypatch, capsys):
    texts = [PAIRS[i % len(PAIRS)][0] for i in range(1000)]
    batches = record_batches(tiny_model, monkeypatch)
    translations = tiny_model.translate(texts, beam_size=None, max_extra_length=2, batch_size=100)
    assert len(translations) == 1000 and all(isinstance(t, str) for t in translations)
    assert [len(b) for b in batches] == [100] * 10  # never one 1000-row batch
    assert "1000/1000" in capsys.readouterr().out  # the progress bar
    # The same source always gets the same translation, wherever it was batched.
    assert len({(s, t) for s, t in zip(texts, translations)}) == len(PAIRS)


# --- Property-based -----------------------------------------------------


@pytest.fixture(scope="module")
def sentence_piece(tokenizer):
    return sentencepiece.SentencePieceProcessor(model_proto=tokenizer.proto)


def normalize(sentence_piece, text: str) -> str:
    """What SentencePiece makes of `text` before splitting it into pieces:
    NFKC, some control characters dropped, whitespace runs collapsed to one
    space, none at the ends. (Only " ": str.strip() would also drop "\\x85",
    which SentencePiece keeps.)"""
    return sentence_piece.normalize(text).replace("\u2581", " ").strip(" ")


def vocabulary_characters(tokenizer) -> str:
    pieces = [p for p in tokenizer.get_vocabulary() if not (p.startswith("<") and p.endswith(">"))]
    return "".join(sorted({c for p in pieces for c in p} - {"\u2581"}))


def texts_near_the_vocabulary(tokenizer):
    """Text from the vocabulary's characters, whitespace, characters that NFKC
    maps into the vocabulary (full-width letters), and anything else."""
    characters = vocabulary_characters(tokenizer)
    near = characters + " \t\n\u3000\u00a0" + "".join(chr(ord(c) + 0xFEE0) for c in "adgnos")
    return st.one_of(st.text(alphabet=near), st.text())


def test_tokenizer_round_trips_what_it_can_represent(tokenizer, sentence_piece):
    characters = set(vocabulary_characters(tokenizer))

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(texts_near_the_vocabulary(tokenizer))
    @example("\x85")  # whitespace to Python, a character (<unk> here) to SentencePiece
    @example(" ａ  ｄｏｇ\t")
    def check(text):
        ids = keras.ops.convert_to_numpy(tokenizer(text)).tolist()
        normalized = normalize(sentence_piece, text)
        # "Can represent": every character left after normalisation is in the
        # vocabulary; exactly then no <unk> comes out.
        representable = set(normalized) - {" "} <= characters
        assert (tokenizer.token_to_id("<unk>") not in ids) == representable
        if representable:
            assert tokenizer.detokenize(ids) == normalized

    check()


def test_normalization_is_nfkc_and_whitespace_collapsing_for_printable_text(sentence_piece):
    printable = st.characters(exclude_categories=("Cc", "Cf", "Cs", "Co", "Cn"))

    @settings(max_examples=300, deadline=None)
    @given(st.text(alphabet=printable))
    @example("a\u2581 b")
    def check(text):
        # SentencePiece's normaliser is a precompiled character map, not a
        # full NFKC: it composes combining marks in the order given, where
        # NFKC first decomposes and sorts them ("\u00c0\u0323", A grave + dot
        # below, stays so in SentencePiece; NFKC gives "\u1ea0\u0300"). Checked
        # on text already in NFC, as keyboards and most files write it
        # (compatibility characters such as full-width letters included),
        # and whose marks need no sorting once decomposed ("\u00af\u0ec8",
        # macron then a Lao tone mark: the macron's decomposition, space +
        # U+0304, puts a mark before one NFKC sorts ahead of it).
        assume(unicodedata.normalize("NFC", text) == text)
        decomposed_in_order = "".join(unicodedata.normalize("NFKD", c) for c in text)
        assume(decomposed_in_order == unicodedata.normalize("NFKD", text))
        # SentencePiece's own word marker "\u2581" counts as a space too.
        expected = " ".join(unicodedata.normalize("NFKC", text).replace("\u2581", " ").split())
        assert normalize(sentence_piece, text) == expected

    check()


def test_translate_never_crashes_on_any_string(tiny_model):
    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.text(max_size=60))
    def check(text):
        # batch_size 1: every part is one (1, 16) batch, so one compiled graph.
        translation = tiny_model.translate(text, beam_size=None, max_extra_length=3, batch_size=1)
        assert isinstance(translation, str)
        if not text.strip():
            assert translation == ""

    check()


# --- Training killed with SIGKILL ----------------------------------------


def start_training(folder, max_steps: int, every: int):
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        PYTHONUNBUFFERED="1",  # what was printed before a kill is not lost in a buffer
    )
    args = [
        "train",
        "--src",
        folder / "train.en",
        "--tgt",
        folder / "train.de",
        "--out",
        folder / "run",
        *TINY_TRAIN_ARGUMENTS,
        "--checkpoint-every-steps",
        str(every),
        "--checkpoint-every-minutes",
        "0",
        # One "epoch" per step: curves.csv (rewritten atomically) then records
        # every step reached, which measures the work a kill loses.
        "--valid-every",
        "1",
        "--max-steps",
        str(max_steps),
    ]
    return subprocess.Popen(
        [sys.executable, "-m", "keras_transformer.cli", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def checkpoint_steps(run) -> list[int]:
    steps = []
    for path in checkpoints.list_checkpoints(str(run / "checkpoints")):
        with np.load(path) as data:  # every checkpoint left is complete
            assert all(np.isfinite(data[k]).all() for k in data.files if k.startswith("model/"))
            steps.append(int(data["step"]))
    return steps


@pytest.mark.slow
def test_training_killed_at_random_moments_resumes_losing_at_most_one_interval(tmp_path):
    seed = random.Random().randrange(1 << 30)  # not the seeded global generator
    print(f"kill moments drawn with random.Random({seed})")
    draw = random.Random(seed)
    for name, side in (("train.en", 0), ("train.de", 1)):
        (tmp_path / name).write_text("".join(p[side] + "\n" for p in PAIRS * 5))
    # Killed runs aim at many steps so they are still running when killed,
    # however fast this machine is; the last run then finishes a few steps on.
    run, every, endless = tmp_path / "run", 3, 100_000
    expected_resume = None
    for kill in range(3):
        process = start_training(tmp_path, endless, every)
        try:
            # Let it make progress past where it (re)started, then kill it at
            # a random moment: mid-step, mid-checkpoint, mid-curves.
            start = max(checkpoint_steps(run), default=0)
            deadline = time.monotonic() + 120
            while max(checkpoint_steps(run), default=0) <= start:
                assert process.poll() is None, process.stdout.read()
                assert time.monotonic() < deadline, "no checkpoint within 2 minutes"
                time.sleep(0.05)
            time.sleep(draw.uniform(0.0, 2.0))
            assert process.poll() is None, "finished before it could be killed"
        finally:
            process.send_signal(signal.SIGKILL)
            output = process.communicate()[0]
        if expected_resume is not None:
            assert f"at step {expected_resume}." in output, output
        steps = checkpoint_steps(run)
        assert steps == list(range(every, steps[-1] + 1, every))  # none lost, none damaged
        reached = int(read_curves(str(run / CURVES_CSV))[-1]["step"])
        # The step being trained at the kill is at most reached + 1, and the
        # newest checkpoint at most one interval behind it.
        print(f"kill {kill + 1}: trained to step {reached} or {reached + 1}, newest checkpoint {steps[-1]}")
        assert reached + 1 - steps[-1] <= every, (reached, steps)
        expected_resume = steps[-1]

    max_steps = expected_resume + 2 * every
    process = start_training(tmp_path, max_steps, every)
    output = process.communicate(timeout=300)[0]
    assert process.returncode == 0, output
    assert f"at step {expected_resume}." in output and f"trained to step {max_steps}" in output
    assert checkpoint_steps(run) == list(range(every, max_steps + 1, every))
    assert not [name for name in os.listdir(run / "checkpoints") if name.startswith(".")]


def test_a_resumed_run_removes_temporaries_of_a_killed_save(tmp_path):
    stale = tmp_path / ".ckpt-00000001.npz.partial-abc123"
    stale.write_bytes(b"half a checkpoint")
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    saver = checkpoints.PeriodicCheckpoint(str(tmp_path), every_steps=1)
    model.fit(np.ones((2, 2)), np.ones((2, 1)), batch_size=2, verbose=0, callbacks=[saver])
    assert sorted(os.listdir(tmp_path)) == ["ckpt-00000001.npz"]
