"""A text of several sentences is translated sentence by sentence and joined
back with its own spacing: through `Transformer.translate`, the command line
and the server's `/translate` (issue 56, item 0).

The fast tests use the tiny model that has memorised PAIRS and the shipped
`multi30k_en_de`; the slow ones measure BLEU on texts of two
test_2016_flickr sentences each.
"""

import gzip

import numpy as np
import pytest

import keras_transformer as kt
from helpers import PAIRS, record_batches
from keras_transformer.generation.sentences import join_sentences, split_sentences
from keras_transformer.generation.translation import source_segments, tokenize

SOURCES = [source for source, _ in PAIRS]
TARGETS = [target for _, target in PAIRS]
PRESET = "multi30k_en_de"
JOINED_TEXTS = 150  # texts of two test_2016_flickr sentences each
BLEU_TOLERANCE = 0.5


# --- Splitting and joining ------------------------------------------------


@pytest.mark.parametrize(
    "text, language, expected",
    [
        ("It rains. We stay.\n\nBye.", None, [("It rains.", " "), ("We stay.", "\n\n"), ("Bye.", "")]),
        ("Hi John\nThanks for the\nquick reply.", "en", [("Hi John", "\n"), ("Thanks for the\nquick reply.", "")]),
        ("  He came.   Did he?\tYes!  ", "en", [("He came.", "   "), ("Did he?", "\t"), ("Yes!", "")]),
        ("Dr. Smith paid 3.5 dollars. He left.", "en", [("Dr. Smith paid 3.5 dollars.", " "), ("He left.", "")]),
        ("Das ist z. B. gut. Noch einer.", "de", [("Das ist z. B. gut.", " "), ("Noch einer.", "")]),
        ("M. Dupont arrive. Il a faim.", "fr", [("M. Dupont arrive.", " "), ("Il a faim.", "")]),
        ("Il a dit non. A. Dupont est parti.", "fr", [("Il a dit non.", " "), ("A. Dupont est parti.", "")]),
        ("यह एक वाक्य है। यह दूसरा है।", "hi", [("यह एक वाक्य है।", " "), ("यह दूसरा है।", "")]),
        ("雨です。晴れ！", None, [("雨です。", ""), ("晴れ！", "")]),
        ("no end", None, [("no end", "")]),
        (" \n ", None, []),
    ],
)
def test_split_sentences_keeps_the_spacing_between_them(text, language, expected):
    assert split_sentences(text, language) == expected


def test_join_sentences_puts_the_spacing_back_and_leaves_out_empty_translations():
    assert join_sentences(["X.", "Y.", "Z."], [" ", "\n\n", ""]) == "X. Y.\n\nZ."
    assert join_sentences(["X.", "", "Z."], ["\n", " ", ""]) == "X.\nZ."
    assert join_sentences(["X.", ""], [" ", ""]) == "X."
    assert join_sentences([], []) == ""


def test_source_segments_are_the_sentences_with_their_spacing(tiny_model):
    text = f"{SOURCES[0]} {SOURCES[1]}\n\n{SOURCES[2]}"
    segments = source_segments(tiny_model, ["", text])
    assert [segment.text_index for segment in segments] == [1, 1, 1]
    assert [segment.spacing for segment in segments] == [" ", "\n\n", ""]
    assert [segment.token_ids for segment in segments] == tokenize(tiny_model.preprocessor.tokenizer, SOURCES[:3])
    short = f"{SOURCES[2]} {SOURCES[5]}"  # fits the model whole
    (whole,) = source_segments(tiny_model, [short], split_sentences=False)
    assert whole.token_ids == tokenize(tiny_model.preprocessor.tokenizer, [short])[0]


# --- Transformer.translate ------------------------------------------------


def test_translate_joins_each_sentence_translation_with_the_text_spacing(trained_model, monkeypatch):
    texts = [f"{SOURCES[0]} {SOURCES[1]}\n\n{SOURCES[2]}", SOURCES[3], f"{SOURCES[4]}\n{SOURCES[5]}"]
    batches = record_batches(trained_model, monkeypatch)
    translations = trained_model.translate(texts, beam_size=None)
    assert translations == [f"{TARGETS[0]} {TARGETS[1]}\n\n{TARGETS[2]}", TARGETS[3], f"{TARGETS[4]}\n{TARGETS[5]}"]
    assert [len(batch) for batch in batches] == [6]  # the sentences of all texts share a batch


def test_split_sentences_false_keeps_each_text_whole(trained_model, monkeypatch):
    text = f"{SOURCES[2]} {SOURCES[5]}"  # fits the model whole
    batches = record_batches(trained_model, monkeypatch)
    trained_model.translate(text, beam_size=None, split_sentences=False)
    assert [len(batch) for batch in batches] == [1]
    assert int(np.sum(batches[0][0] != 0)) == len(tokenize(trained_model.preprocessor.tokenizer, [text])[0]) + 2


def test_a_too_long_whole_text_is_still_cut_at_sentences_with_its_spacing(trained_model):
    text = f"{SOURCES[0]} {SOURCES[1]}\n{SOURCES[2]} {SOURCES[3]}"  # more than the model's 14 tokens
    assert len(tokenize(trained_model.preprocessor.tokenizer, [text])[0]) > trained_model.max_source_tokens
    translation = trained_model.translate(text, beam_size=None, split_sentences=False)
    assert translation == f"{TARGETS[0]} {TARGETS[1]}\n{TARGETS[2]} {TARGETS[3]}"


def test_too_long_error_applies_to_each_sentence(tiny_model):
    many_short = " ".join(SOURCES[:4])  # more than 14 tokens, but in short sentences
    assert isinstance(tiny_model.translate(many_short, too_long="error", beam_size=None, max_extra_length=2), str)
    with pytest.raises(ValueError, match=r"texts\[0\] has \d+ tokens, more than the 14"):
        tiny_model.translate(many_short, too_long="error", split_sentences=False)


def test_joined_texts_translate_as_their_sentences_one_by_one_with_the_shipped_preset():
    # Greedy: beam search ties could differ with the batch's padding.
    model = kt.Transformer.from_preset(PRESET)
    sentences = [
        "A little girl climbs into a wooden playhouse.",
        "Two men are fixing a bike.",
        "A man in an orange hat starring at something.",
        "A Boston Terrier is running on lush green grass in front of a white fence.",
        "A girl in karate uniform breaking a stick with a front kick.",
        "Five people in winter jackets and helmets stand in the snow.",
        "People are fixing the roof of a house.",
        "A man in light colored clothing photographs a group of men.",
        "A group of people standing in front of an igloo.",
        "A boy in a red uniform is attempting to avoid getting out at home plate.",
    ] * 2
    texts = [f"{sentences[i]} {sentences[i + 1]}" for i in range(0, len(sentences), 2)]
    one_by_one = model.translate(sentences, beam_size=None)
    assert model.translate(texts, beam_size=None) == [
        f"{one_by_one[i]} {one_by_one[i + 1]}" for i in range(0, len(sentences), 2)
    ]


# --- The server ----------------------------------------------------------


def _served(model, **engine_options):
    from keras_transformer.generation.settings import SearchSettings
    from keras_transformer.server import ModelEngine, ServiceSettings, TranslationService, app_of, served_model

    engine = ModelEngine(model, search=SearchSettings(beam_size=None), name="en_de", **engine_options)
    # Not warmed up: a request's deadline must leave room to compile its shapes.
    service = TranslationService([served_model("en_de", engine, (["en"], ["de"]))], ServiceSettings(timeout_s=600))
    return app_of(service, warm_up=False), engine


def _post_all(app, texts: list[str], per_request: int = 20) -> list[str]:
    """`/translate`'s answers to `texts`, `per_request` texts a request (within its 5,000 characters)."""
    from starlette.testclient import TestClient

    answers = []
    with TestClient(app) as client:
        for start in range(0, len(texts), per_request):
            body = {"q": texts[start : start + per_request], "source": "en", "target": "de"}
            response = client.post("/translate", json=body)
            assert response.status_code == 200, response.text
            answers += response.json()["translatedText"]
    return answers


def test_the_server_translates_each_sentence_and_keeps_the_spacing(trained_model):
    pytest.importorskip("starlette", reason="the server's tests need the serve extra")
    texts = [f"{SOURCES[0]} {SOURCES[1]}\n\n{SOURCES[2]}", SOURCES[3]]
    app, _ = _served(trained_model)
    assert _post_all(app, texts) == [f"{TARGETS[0]} {TARGETS[1]}\n\n{TARGETS[2]}", TARGETS[3]]
    _, whole = _served(trained_model, split_sentences=False)
    assert len(whole.segments([f"{SOURCES[2]} {SOURCES[5]}"], source_language="en")) == 1


# --- BLEU on joined test sentences (slow) --------------------------------


def _bleu(hypotheses: list[str], references: list[str]) -> float:
    import sacrebleu

    return sacrebleu.corpus_bleu(hypotheses, [references]).score


@pytest.fixture(scope="module")
def flickr(multi30k) -> dict:
    """test_2016_flickr's first 300 sentences joined two by two into 150 texts,
    their references, and the BLEU of the sentences translated one by one."""

    def read(language):
        with gzip.open(multi30k / "raw" / f"test_2016_flickr.{language}.gz", "rt", encoding="utf-8") as file:
            return [line.strip() for _, line in zip(range(2 * JOINED_TEXTS), file)]

    english, german = read("en"), read("de")
    # A sentence without a full stop ends its line, as a writer would break it:
    # after a space the next would read as the same sentence.
    texts = [
        english[i] + (" " if english[i][-1] in ".!?" else "\n") + english[i + 1] for i in range(0, len(english), 2)
    ]
    references = [f"{german[i]} {german[i + 1]}" for i in range(0, len(german), 2)]
    model = kt.Transformer.from_preset(PRESET)
    one_by_one = model.translate(english, beam_size=None)
    joined = [f"{one_by_one[i]} {one_by_one[i + 1]}" for i in range(0, len(one_by_one), 2)]
    return {"model": model, "texts": texts, "references": references, "bleu": _bleu(joined, references)}


@pytest.mark.slow
def test_joined_texts_through_translate_score_as_their_sentences_one_by_one(flickr):
    translations = flickr["model"].translate(flickr["texts"], beam_size=None, source_language="en")
    assert _bleu(translations, flickr["references"]) == pytest.approx(flickr["bleu"], abs=BLEU_TOLERANCE)


@pytest.mark.slow
def test_joined_texts_through_the_command_line_score_as_their_sentences_one_by_one(flickr, tmp_path):
    from test_cli import run_cli

    arguments = ["--preset", PRESET, "--greedy", "--source-language", "en", "--quiet", *flickr["texts"]]
    result = run_cli("translate", *arguments, KERAS_TRANSFORMER_COMPILE_CACHE=str(tmp_path))
    assert result.returncode == 0, result.stderr
    translations = result.stdout.splitlines()
    assert len(translations) == JOINED_TEXTS
    assert _bleu(translations, flickr["references"]) == pytest.approx(flickr["bleu"], abs=BLEU_TOLERANCE)


@pytest.mark.slow
def test_joined_texts_through_the_server_score_as_their_sentences_one_by_one(flickr):
    pytest.importorskip("starlette", reason="the server's tests need the serve extra")
    app, _ = _served(flickr["model"])
    translations = [text.replace("\n", " ") for text in _post_all(app, flickr["texts"])]
    assert _bleu(translations, flickr["references"]) == pytest.approx(flickr["bleu"], abs=BLEU_TOLERANCE)


def test_generate_translates_each_sentence_of_a_text_in_one_batch(trained_model, monkeypatch):
    rows = []
    search = trained_model._search

    def recording(token_ids, *args, **kwargs):
        rows.append(len(token_ids["encoder_token_ids"]))
        return search(token_ids, *args, **kwargs)

    monkeypatch.setattr(trained_model, "_search", recording)
    text = f"{SOURCES[0]} {SOURCES[1]}\n{SOURCES[2]}"
    assert trained_model.generate([text, ""], beam_size=None) == [f"{TARGETS[0]} {TARGETS[1]}\n{TARGETS[2]}", ""]
    assert set(rows) == {3}  # one batch of the three sentences
    rows.clear()
    trained_model.generate(text, beam_size=None, split_sentences=False)
    assert set(rows) == {1}


def test_each_sentence_of_a_multilingual_model_s_text_starts_with_its_language_token(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    from marian_fixtures import SOURCE_SENTENCES, write_multilingual_repo

    model = kt.Transformer.from_preset(str(write_multilingual_repo(tmp_path / "gmw")["folder"]))
    tokenizer = model.preprocessor.tokenizer
    text = f"{SOURCE_SENTENCES[0]} {SOURCE_SENTENCES[1]}"
    for texts, language, tag in (([text], "nld", ">>nld<<"), ([f">>deu<< {text}"], "nld", ">>deu<<")):
        segments = source_segments(model, texts, target_language=language)
        assert [segment.token_ids for segment in segments] == tokenize(
            tokenizer, [f"{tag} {sentence}" for sentence in SOURCE_SENTENCES[:2]]
        )
