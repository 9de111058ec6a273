import gzip
import json

import pytest
import sacrebleu

from keras_transformer.cli.main import main
from keras_transformer.evaluation.bleu import evaluate_model, evaluate_translations, lowercase_tokenize

HYPOTHESES = ["The cat sat on the mat.", "A dog is running in the park!", "Two men, talking."]
REFERENCES = ["The cat is sitting on the mat.", "A dog runs in the park!", "Two men are talking."]


def test_identical_text_scores_100():
    result = evaluate_translations(REFERENCES, REFERENCES, lowercase_tokenized=True, target_language="en")
    assert result.bleu == pytest.approx(100.0)
    assert result.chrf == pytest.approx(100.0)
    assert result.lc_tok_bleu == pytest.approx(100.0)
    assert result.num_sentences == 3


def test_scores_equal_sacrebleus_own_corpus_functions():
    result = evaluate_translations(HYPOTHESES, REFERENCES)
    expected_bleu = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES])
    expected_chrf = sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES])
    assert 0 < result.bleu < 100
    assert result.bleu == pytest.approx(expected_bleu.score)
    assert result.chrf == pytest.approx(expected_chrf.score)
    assert "tok:13a" in result.bleu_signature and "case:mixed" in result.bleu_signature
    assert "nc:6" in result.chrf_signature
    assert result.lc_tok_bleu is None and "lc_tok_bleu" not in result.to_dict()
    assert str(result).startswith(f"BLEU = {result.bleu:.2f}")


def test_lowercase_tokenize_follows_the_moses_scripts():
    assert lowercase_tokenize(['Ein Mann sagt "Hallo", dann geht er.'], "de") == [
        "ein mann sagt &quot; hallo &quot; , dann geht er ."
    ]
    # Punctuation normalization (curly quotes) and French elision rules.
    assert lowercase_tokenize(["L'homme dit «Bonjour»."], "fr") == ["l&apos; homme dit &quot; bonjour &quot; ."]
    assert lowercase_tokenize(["Don't stop!"], "en") == ["don &apos;t stop !"]


def test_lowercase_tokenized_bleu_ignores_case_and_punctuation_spacing():
    hypotheses = ["EIN HUND rennt, schnell."]
    references = ["Ein Hund rennt , schnell ."]
    result = evaluate_translations(hypotheses, references, lowercase_tokenized=True)
    assert result.lc_tok_bleu == pytest.approx(100.0)
    assert result.bleu < 100  # the cased score sees the difference
    assert "tok:none" in result.lc_tok_bleu_signature
    assert result.lc_tok_preprocessing == "lowercase+moses-norm+moses-tok(de)"
    # Given tokenized references are used as they are.
    given = evaluate_translations(hypotheses, references, tokenized_references=["ein katze rennt , schnell ."])
    assert given.lc_tok_bleu < 100


def test_mismatched_lengths_are_an_error():
    with pytest.raises(ValueError, match="2 hypotheses but 3 references"):
        evaluate_translations(HYPOTHESES[:2], REFERENCES)
    with pytest.raises(ValueError, match="No hypotheses"):
        evaluate_translations([], [])


def test_evaluate_model_keeps_the_order_of_sources(trained_model, pairs):
    # Reversed so that the length-sorted decoding order differs from the input order.
    sources = [p[0] for p in reversed(pairs)]
    references = [p[1] for p in reversed(pairs)]
    translations, result = evaluate_model(trained_model, sources, references, beam_size=2, batch_size=4, verbose=0)
    assert translations == trained_model.translate(sources, beam_size=2)
    assert result.bleu == pytest.approx(sacrebleu.corpus_bleu(translations, [references]).score)


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_evaluate_command_end_to_end(trained_model, pairs, tmp_path, capsys):
    trained_model.save_to_preset(str(tmp_path / "p"))
    src = _write(tmp_path / "test.en", [p[0] for p in pairs])
    references = [p[1].capitalize() for p in pairs]
    ref = _write(tmp_path / "test.de", references)
    code = main(
        [
            "evaluate",
            str(tmp_path / "p"),
            "--src",
            src,
            "--ref",
            ref,
            "--lowercase-tokenized",
            "--beam-size",
            "2",
            "--output",
            str(tmp_path / "hyps.de"),
            "--json",
            str(tmp_path / "s.json"),
            "--quiet",
        ]
    )
    assert code == 0
    hypotheses = (tmp_path / "hyps.de").read_text(encoding="utf-8").splitlines()
    assert len(hypotheses) == len(pairs)
    scores = json.loads((tmp_path / "s.json").read_text(encoding="utf-8"))
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
    # The model reproduces PAIRS; the references differ from them in case only.
    assert scores["bleu"] < 100 and 0 <= scores["chrf"] < 100
    assert scores["lc_tok_bleu"] == pytest.approx(100)
    assert scores["reference_language"] == "de" and scores["target_language"] is None and scores["beam_size"] == 2
    out = capsys.readouterr().out
    assert "signature: nrefs:1|case:mixed|eff:no|tok:13a" in out
    assert "BLEU (lower-cased, Moses-tokenized)" in out


def test_evaluate_command_rejects_mismatched_files(tmp_path, capsys):
    src = _write(tmp_path / "test.en", ["a dog runs .", "a cat ."])
    ref = _write(tmp_path / "test.de", ["ein hund rennt ."])
    # The line counts are checked before the preset is loaded.
    code = main(["evaluate", str(tmp_path / "missing"), "--src", src, "--ref", ref])
    assert code == 1
    assert "has 2 lines but" in capsys.readouterr().err


@pytest.mark.slow
def test_lowercase_tokenize_reproduces_multi30k_tokenized_test_set(multi30k):
    def read(path):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f]

    raw = read(multi30k / "raw" / "test_2016_flickr.de.gz")
    tokenized = read(multi30k / "tok" / "test_2016_flickr.lc.norm.tok.de.gz")
    ours = lowercase_tokenize(raw, "de")
    matches = sum(a == b for a, b in zip(ours, tokenized))
    assert len(ours) == len(tokenized) == 1000
    assert matches / len(tokenized) >= 0.99  # measured: 1000 of 1000
    result = evaluate_translations(raw, raw, tokenized_references=tokenized)
    assert result.lc_tok_bleu == pytest.approx(100.0)


@pytest.mark.parametrize(
    "path, language",
    [("test.de", "de"), ("test_2016_flickr.fr.gz", "fr"), ("x/test.lc.norm.tok.en.gz", "en"), ("refs.txt", None)],
)
def test_target_language_comes_from_the_reference_suffix(path, language):
    from keras_transformer.evaluation.test_set import language_from_suffix

    assert language_from_suffix(path) == language
