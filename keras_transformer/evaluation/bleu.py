"""Scoring translations with sacreBLEU, as papers and shared tasks report them.

Two forms of BLEU are in use for translation results:

- **sacreBLEU** on cased, detokenized text with its own `13a` tokenizer: the
  reproducible form (Post, 2018), reported with sacreBLEU's signature. chrF
  comes with it.
- **lower-cased, Moses-tokenized BLEU** (`multi-bleu.perl` on tokenized
  text): the form most published Multi30k results use. Both sides are
  lower-cased, punctuation-normalized and tokenized with the Moses scripts
  (here their `sacremoses` port) and then scored with no further tokenization.
  Applied to `raw/test_2016_flickr.de.gz` this reproduces the dataset's own
  `tok/test_2016_flickr.lc.norm.tok.de.gz` line for line.
"""

import dataclasses
from collections.abc import Sequence

from sacrebleu.metrics import BLEU, CHRF
from sacremoses import MosesPunctNormalizer, MosesTokenizer

from keras_transformer.generation.settings import SearchSettings


@dataclasses.dataclass
class EvaluationResult:
    """Corpus scores of a set of translations.

    Attributes:
        bleu: sacreBLEU on cased, detokenized text (13a tokenizer), 0-100.
        chrf: chrF2 (sacreBLEU's default chrF), 0-100.
        bleu_signature: sacreBLEU's signature of `bleu`, to report with it.
        chrf_signature: sacreBLEU's signature of `chrf`.
        bleu_details: n-gram precisions, brevity penalty and lengths.
        num_sentences: how many sentence pairs were scored.
        lc_tok_bleu: BLEU on lower-cased, Moses-tokenized text, when asked for.
        lc_tok_bleu_signature: its sacreBLEU signature (`tok:none`: the text
            was tokenized beforehand, see `lc_tok_preprocessing`).
        lc_tok_preprocessing: how that text was made, e.g.
            `"lowercase+moses-norm+moses-tok(de)"`.
        lc_tok_bleu_details: n-gram precisions etc. of `lc_tok_bleu`.
    """

    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str
    bleu_details: str
    num_sentences: int
    lc_tok_bleu: float | None = None
    lc_tok_bleu_signature: str | None = None
    lc_tok_preprocessing: str | None = None
    lc_tok_bleu_details: str | None = None

    def to_dict(self) -> dict:
        """The scores as a JSON-ready dict (fields that were not computed left out)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    def __str__(self) -> str:
        lines = [
            f"BLEU = {self.bleu:.2f} {self.bleu_details}",
            f"  signature: {self.bleu_signature}",
            f"chrF2 = {self.chrf:.2f}",
            f"  signature: {self.chrf_signature}",
        ]
        if self.lc_tok_bleu is not None:
            lines += [
                f"BLEU (lower-cased, Moses-tokenized) = {self.lc_tok_bleu:.2f} {self.lc_tok_bleu_details}",
                f"  signature: {self.lc_tok_bleu_signature}|pre:{self.lc_tok_preprocessing}",
            ]
        return "\n".join(lines)


def lowercase_tokenize(texts: Sequence[str], language: str) -> list[str]:
    """Lower-cases, punctuation-normalizes and Moses-tokenizes sentences.

    The pipeline of the Multi30k `*.lc.norm.tok.*` files (`lowercase.perl |
    normalize-punctuation.perl -l L | tokenizer.perl -l L`), in that order and
    with Moses' default XML escaping (`"` becomes `&quot;`), as those files have
    it: on the raw test 2016 German side the output equals the dataset's
    tokenized file on every line.

    Args:
        texts: detokenized sentences.
        language: ISO 639-1 code of their language, for the Moses rules
            (e.g. German decimal commas, French elisions).

    Example:
    >>> lowercase_tokenize(['Ein Mann sagt "Hallo", dann geht er.'], "de")
    ['ein mann sagt &quot; hallo &quot; , dann geht er .']
    """
    normalizer = MosesPunctNormalizer(lang=language)
    tokenizer = MosesTokenizer(lang=language)
    return [
        tokenizer.tokenize(normalizer.normalize(text.lower()), escape=True, return_str=True).strip() for text in texts
    ]


def evaluate_translations(
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    lowercase_tokenized: bool = False,
    target_language: str = "de",
    tokenized_references: Sequence[str] | None = None,
) -> EvaluationResult:
    """Scores translations against one reference each with sacreBLEU.

    Args:
        hypotheses: the system's translations, detokenized, one per sentence.
        references: the reference translations, cased and detokenized.
        lowercase_tokenized: also compute BLEU on lower-cased, Moses-tokenized
            text (the form of most published Multi30k results).
        target_language: language of the translations, for Moses' rules.
        tokenized_references: references already in lower-cased, tokenized
            form (e.g. Multi30k's `*.lc.norm.tok.de`), used instead of
            tokenizing `references`; implies `lowercase_tokenized`.

    Returns:
        An `EvaluationResult`.

    Raises:
        ValueError: when the number of hypotheses and references differ, or
            there are none.

    Example:
    >>> result = evaluate_translations(["Ein Hund rennt."], ["Ein Hund rennt."])
    >>> round(result.bleu, 2), round(result.chrf, 2)
    (100.0, 100.0)
    """
    hypotheses, references = list(hypotheses), list(references)
    _check_same_length(hypotheses, references, "references")
    bleu, chrf = BLEU(), CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    result = EvaluationResult(
        bleu=float(bleu_score.score),
        chrf=float(chrf_score.score),
        bleu_signature=str(bleu.get_signature()),
        chrf_signature=str(chrf.get_signature()),
        bleu_details=_details(bleu_score),
        num_sentences=len(hypotheses),
    )
    if lowercase_tokenized or tokenized_references is not None:
        if tokenized_references is None:
            tokenized_references = lowercase_tokenize(references, target_language)
        tokenized_references = list(tokenized_references)
        _check_same_length(hypotheses, tokenized_references, "tokenized references")
        # tokenize="none": the text is tokenized already, as multi-bleu.perl
        # expects; sacreBLEU would otherwise split the Moses escapes apart.
        lc_bleu = BLEU(tokenize="none", force=True)
        lc_score = lc_bleu.corpus_score(lowercase_tokenize(hypotheses, target_language), [tokenized_references])
        result.lc_tok_bleu = float(lc_score.score)
        result.lc_tok_bleu_signature = str(lc_bleu.get_signature())
        result.lc_tok_preprocessing = f"lowercase+moses-norm+moses-tok({target_language})"
        result.lc_tok_bleu_details = _details(lc_score)
    return result


def evaluate_model(
    model,
    sources: Sequence[str],
    references: Sequence[str],
    *,
    search: SearchSettings | None = None,
    beam_size: int | None | str = "auto",
    alpha: float | None = None,
    max_extra_length: int | None = None,
    batch_size: int = 32,
    lowercase_tokenized: bool = False,
    target_language: str = "de",
    tokenized_references: Sequence[str] | None = None,
    translate_into: str | None = None,
    verbose: int = 1,
) -> tuple[list[str], EvaluationResult]:
    """Translates a test set with a model and scores the translations.

    `model.translate` decodes in batches of similar length behind a Keras
    progress bar.

    Args:
        model: a `Transformer` with a preprocessor.
        sources: source sentences.
        references: one reference translation per source sentence.
        search: the `SearchSettings`; by default section 6.1's, `SearchSettings()`.
        beam_size, alpha, max_extra_length: instead of `search`'s (`"auto"`
            and `None` keep it), as in `Transformer.generate`.
        batch_size: sentences decoded together.
        lowercase_tokenized, target_language, tokenized_references: see
            `evaluate_translations`.
        translate_into: for a multilingual model, the language to translate
            into (e.g. `"deu"`), as `translate`'s `target_language`.
        verbose: 1 shows a progress bar, 0 is silent.

    Returns:
        `(translations, result)`: the translations in the order of `sources`
        and their `EvaluationResult`.

    Example:
    >>> import keras_transformer as kt
    >>> tokenizer = kt.train_tokenizer(["a dog runs .", "ein hund rennt ."] * 20, 30)
    >>> model = kt.Transformer(
    ...     backbone=kt.TransformerBackbone(
    ...         vocabulary_size=tokenizer.vocabulary_size(), num_encoder_layers=1,
    ...         num_decoder_layers=1, num_heads=2, hidden_dim=16, intermediate_dim=32),
    ...     preprocessor=kt.TransformerPreprocessor(tokenizer, 16, 16))
    >>> translations, result = evaluate_model(
    ...     model, ["a dog runs ."], ["ein hund rennt ."], beam_size=2, verbose=0)
    >>> len(translations), 0 <= result.bleu <= 100
    (1, True)
    """
    sources, references = list(sources), list(references)
    _check_same_length(sources, references, "references", first_name="source sentences")
    if tokenized_references is not None:
        tokenized_references = list(tokenized_references)
        _check_same_length(sources, tokenized_references, "tokenized references", first_name="source sentences")
    translations = model.translate(
        sources,
        search=(search or SearchSettings()).overridden(
            beam_size=beam_size, alpha=alpha, max_extra_length=max_extra_length
        ),
        batch_size=batch_size,
        verbose=verbose,
        target_language=translate_into,
    )
    result = evaluate_translations(
        translations,
        references,
        lowercase_tokenized=lowercase_tokenized,
        target_language=target_language,
        tokenized_references=tokenized_references,
    )
    return translations, result


def _check_same_length(first: list, second: list, second_name: str, first_name: str = "hypotheses") -> None:
    if len(first) != len(second):
        raise ValueError(
            f"{len(first)} {first_name} but {len(second)} {second_name}: they must be line-aligned, "
            "one sentence a line."
        )
    if not first:
        raise ValueError(f"No {first_name} to score.")


def _details(score) -> str:
    # sacreBLEU's own rendering: "p1/p2/p3/p4 (BP = .. ratio = .. hyp_len = .. ref_len = ..)".
    return score.format().split(" ", 3)[3]
