"""Multilingual Opus-MT with separate source and target vocabularies, loaded exactly.

The checkpoint is written by `transformers` itself (`marian_fixtures.
write_multilingual_repo`: `save_pretrained` of a briefly trained
`MarianMTModel` with `share_encoder_decoder_embeddings: false` and its
`MarianTokenizer`), published in a huggingface_hub cache as
`Helsinki-NLP/opus-mt-tc-big-gmw-gmw`, the repository `big_en_de` and
`big_de_en` name, and loaded offline as a user would.
"""

import numpy as np
import pytest
from keras import ops

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import keras_transformer as kt  # noqa: E402
from helpers import make_model  # noqa: E402
from marian_fixtures import LANGUAGE_SENTENCES, SOURCE_SENTENCES, publish, write_multilingual_repo  # noqa: E402

REPO = "Helsinki-NLP/opus-mt-tc-big-gmw-gmw"
HANDLE = f"hf://{REPO}"
TOLERANCE = 1e-4
SOURCES = ["A dog runs across the green field.", "Two children are playing in the snow.", "Cats sleep."]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("multilingual")
    info = write_multilingual_repo(root / "folder")
    publish(info["folder"], root / "hub", REPO)
    return {**info, "cache": root / "hub"}


@pytest.fixture(autouse=True)
def offline_cache(checkpoint, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_CACHE", str(checkpoint["cache"]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(checkpoint["cache"]))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="module")
def model(checkpoint):
    from huggingface_hub import constants

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(constants, "HF_HUB_CACHE", str(checkpoint["cache"]))
        patch.setattr(constants, "HF_HUB_OFFLINE", True)
        return kt.Transformer.from_preset(HANDLE)


def tagged(texts, language):
    return [f">>{language}<< {text}" for text in texts]


def reference_logits(checkpoint, encoded, decoder_ids):
    with torch.no_grad():
        return checkpoint["model"](
            input_ids=torch.tensor(encoded["input_ids"]),
            attention_mask=torch.tensor(encoded["attention_mask"]),
            decoder_input_ids=torch.tensor(decoder_ids),
        ).logits.numpy()


def our_logits(model, encoded, decoder_ids):
    return ops.convert_to_numpy(
        model(
            {
                "encoder_token_ids": encoded["input_ids"].astype("int32"),
                "encoder_padding_mask": encoded["attention_mask"].astype("int32"),
                "decoder_token_ids": decoder_ids,
                "decoder_padding_mask": np.ones_like(decoder_ids),
            }
        )
    )


def test_separate_vocabularies_give_marian_mt_models_logits(checkpoint, model):
    config = checkpoint["model"].config
    backbone = model.backbone
    assert (backbone.vocabulary_size, backbone.target_vocabulary_size) == (config.vocab_size, config.decoder_vocab_size)
    assert config.vocab_size != config.decoder_vocab_size
    encoded = checkpoint["tokenizer"](tagged(SOURCES, "deu"), padding=True, return_tensors="np")
    rng = np.random.default_rng(0)
    decoder_ids = rng.integers(0, config.decoder_vocab_size - 1, size=(len(SOURCES), 7)).astype("int32")
    decoder_ids[:, 0] = config.decoder_start_token_id
    expected = reference_logits(checkpoint, encoded, decoder_ids)
    actual = our_logits(model, encoded, decoder_ids)
    assert actual.shape == expected.shape == (len(SOURCES), 7, config.decoder_vocab_size)
    np.testing.assert_allclose(actual, expected, atol=TOLERANCE, rtol=0)


def test_token_ids_equal_marian_tokenizer_with_two_vocabularies(checkpoint, model):
    reference, tokenizer = checkpoint["tokenizer"], model.preprocessor.tokenizer
    targets = [s for sentences in LANGUAGE_SENTENCES.values() for s in sentences]
    odd = [">>xyz<< Unknown tag.", ">>de\nu<< x", ">>nld<< two\nlines", "", "é ü"]
    sources = [*tagged(SOURCE_SENTENCES, "nld"), *SOURCE_SENTENCES, *odd]
    end = tokenizer.source_end_token_id
    assert [list(map(int, ids)) + [end] for ids in tokenizer(sources)] == reference(sources).input_ids
    target_ids = reference(text_target=targets).input_ids
    assert [list(map(int, ids)) + [tokenizer.end_token_id] for ids in tokenizer.tokenize_target(targets)] == target_ids
    # Target ids differ from the source ids of the same pieces: two vocabularies.
    assert reference(targets).input_ids != target_ids
    decoded = [t.decode() if isinstance(t, bytes) else t for t in tokenizer.detokenize(target_ids)]
    assert decoded == [reference.decode(ids, skip_special_tokens=True) for ids in target_ids]


def hf_greedy(checkpoint, texts, max_new_tokens):
    """transformers' greedy translations, and whether each ended with `</s>`."""
    encoded = checkpoint["tokenizer"](texts, padding=True, return_tensors="pt")
    config = checkpoint["model"].config
    with torch.no_grad():
        ids = checkpoint["model"].generate(
            **encoded,
            num_beams=1,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            bad_words_ids=[[config.pad_token_id]],
            forced_eos_token_id=None,
        )
    # transformers' decode keeps <pad>, a target id it does not know as special: cut the decoder
    # start and the padding after </s>.
    rows = [row[1:].tolist() for row in ids]
    ended = [config.eos_token_id in row for row in rows]
    rows = [row[: row.index(config.eos_token_id)] if end else row for row, end in zip(rows, ended)]
    return [checkpoint["tokenizer"].decode(row, skip_special_tokens=True) for row in rows], ended


@pytest.mark.parametrize("language", ["deu", "nld"])
def test_translate_into_a_target_language_equals_transformers(language, checkpoint, model):
    ours = model.translate(SOURCES, target_language=language, beam_size=None, max_extra_length=40)
    theirs, ended = hf_greedy(checkpoint, tagged(SOURCES, language), max_new_tokens=40)
    assert any(ended), "no sentence ended: the comparison would not test </s>"
    for our_text, their_text, their_end in zip(ours, theirs, ended):
        # transformers' limit counts new tokens, ours source length + 40: compare up to the shorter.
        assert our_text == their_text if their_end else our_text.startswith(their_text)
    generated = model.generate(SOURCES, target_language=language, beam_size=None, max_extra_length=40)
    assert generated == ours


def test_the_language_token_changes_the_translation_and_a_texts_own_token_wins(model):
    german = model.translate(SOURCES, target_language="deu", beam_size=None)
    dutch = model.translate(SOURCES, target_language="nld", beam_size=None)
    assert german != dutch
    assert model.translate(tagged(SOURCES, "nld"), target_language="deu", beam_size=None) == dutch
    assert model.translate(["", "   "], target_language="deu") == ["", ""]


def test_missing_or_unknown_language_lists_the_models_languages(model):
    for call in (
        lambda: model.translate(SOURCES),
        lambda: model.translate(SOURCES, target_language="fra"),
        lambda: model.translate([">>fra<< A dog."], target_language="deu"),
        lambda: model.generate(SOURCES),
    ):
        with pytest.raises(ValueError, match="deu, eng, nld"):
            call()


def test_a_model_of_one_target_language_refuses_a_language(tokenizer):
    with pytest.raises(ValueError, match="no target-language tokens"):
        make_model(tokenizer).translate(["a dog"], target_language="deu")


def test_big_en_de_and_big_de_en_fix_their_target_language(model):
    big_en_de = kt.Transformer.from_preset("big_en_de")
    assert big_en_de.preprocessor.tokenizer.target_language == "deu"
    assert big_en_de.translate(SOURCES, beam_size=None) == model.translate(
        SOURCES, target_language="deu", beam_size=None
    )
    assert kt.Transformer.from_preset("big_de_en").preprocessor.tokenizer.target_language == "eng"


def test_fine_tuning_and_save_to_preset_keep_both_vocabularies(checkpoint, tmp_path):
    model = kt.Transformer.from_preset(HANDLE)
    model.preprocessor.tokenizer.set_target_language("nld")
    model.compile(optimizer="adam", jit_compile=False)
    pairs = {"encoder_text": SOURCE_SENTENCES[:4], "decoder_text": LANGUAGE_SENTENCES["nld"][:4]}
    before = ops.convert_to_numpy(model.backbone.target_token_embedding.embeddings).copy()
    model.fit(pairs, batch_size=4, epochs=1, verbose=0)
    assert not np.allclose(ops.convert_to_numpy(model.backbone.target_token_embedding.embeddings), before)
    model.save_to_preset(tmp_path / "preset")
    again = kt.Transformer.from_preset(str(tmp_path / "preset"))
    assert again.backbone.target_vocabulary_size == model.backbone.target_vocabulary_size
    tokenizer = again.preprocessor.tokenizer
    assert tokenizer.target_language == "nld"
    assert tokenizer.target_vocabulary == model.preprocessor.tokenizer.target_vocabulary
    encoded = checkpoint["tokenizer"](tagged(SOURCES, "nld"), padding=True, return_tensors="np")
    decoder_ids = np.full((len(SOURCES), 3), checkpoint["model"].config.decoder_start_token_id, "int32")
    expected = our_logits(model, encoded, decoder_ids)
    np.testing.assert_allclose(our_logits(again, encoded, decoder_ids), expected, atol=1e-5)
    assert again.translate(SOURCES, beam_size=None) == model.translate(SOURCES, beam_size=None)


def test_command_line_takes_the_target_language(model, capsys):
    from keras_transformer.cli import main as cli

    assert cli.main(["translate", "--preset", HANDLE, "--target-language", "nld", "--greedy", SOURCES[1]]) == 0
    assert capsys.readouterr().out.strip() == model.translate(SOURCES[1], target_language="nld", beam_size=None)
    assert cli.main(["translate", "--preset", HANDLE, "--target-language", "fra", SOURCES[1]]) == 1
    assert "deu, eng, nld" in capsys.readouterr().err


def test_saved_model_translates_into_its_target_language(model, tmp_path):
    import keras

    if keras.config.backend() != "tensorflow":
        pytest.skip("the SavedModel export runs on TensorFlow")
    import tensorflow as tf

    from keras_transformer.generation.saved_model import export_saved_model

    with pytest.raises(ValueError, match="deu, eng, nld"):
        export_saved_model(model, tmp_path / "none")
    folder = export_saved_model(model, tmp_path / "nld", beam_size=2, max_extra_length=20, target_language="nld")
    translate = tf.saved_model.load(str(folder)).signatures["translate_with_options"]
    texts = [*SOURCES, ""]
    outputs = translate(inputs=tf.constant(texts), alpha=tf.constant(0.6), greedy=tf.constant(True))["outputs"]
    expected = model.translate(texts, target_language="nld", beam_size=None, max_extra_length=20)
    assert [t.decode() for t in outputs.numpy()] == expected
