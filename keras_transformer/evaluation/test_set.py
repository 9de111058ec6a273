"""A test set in line-aligned files, translated and scored: what `keras-transformer evaluate` runs.

Example:
>>> import tempfile
>>> from pathlib import Path
>>> folder = Path(tempfile.mkdtemp())
>>> _ = (folder / "test.en").write_text("a dog runs .\\n")
>>> _ = (folder / "test.de").write_text("ein hund rennt .\\nzwei katzen .\\n")
>>> evaluate_files("multi30k_en_de", folder / "test.en", folder / "test.de")
Traceback (most recent call last):
ValueError: ...test.en has 1 lines but ...test.de has 2: source and reference files must be line-aligned.
"""

import os
import re

from keras_transformer.evaluation.bleu import EvaluationResult, evaluate_model
from keras_transformer.models.transformer import Transformer
from keras_transformer.utils.files import read_lines


def evaluate_files(
    model_or_preset,
    source_file: str | os.PathLike,
    reference_file: str | os.PathLike,
    *,
    tokenized_reference_file: str | os.PathLike | None = None,
    reference_language: str | None = None,
    lowercase_tokenized: bool = False,
    **options,
) -> tuple[list[str], EvaluationResult, str]:
    """`evaluate_model` on line-aligned files (plain or `.gz`), as `keras-transformer evaluate` runs it.

    The files are read and checked before a preset is loaded.

    Args:
        model_or_preset: a `Transformer` with a preprocessor, or what
            `Transformer.from_preset` takes.
        source_file, reference_file: sources and cased, detokenized references.
        tokenized_reference_file: lower-cased, Moses-tokenized references
            (e.g. Multi30k's `*.lc.norm.tok.de`); implies `lowercase_tokenized`.
        reference_language: the references' language code for Moses' rules;
            by default from `reference_file`'s suffix (`test.de.gz`: `"de"`).
        lowercase_tokenized: also score lower-cased, Moses-tokenized BLEU.
        **options: `evaluate_model`'s search, batch size and verbosity.

    Returns:
        `(translations, result, reference_language)`.

    Raises:
        ValueError: files that are not line-aligned, or no language to
            tokenize by.
    """
    sources = list(read_lines(source_file))
    references = _lines_aligned_with(reference_file, source_file, len(sources))
    tokenized_references = None
    if tokenized_reference_file is not None:
        tokenized_references = _lines_aligned_with(tokenized_reference_file, source_file, len(sources))
    lowercase_tokenized = lowercase_tokenized or tokenized_references is not None
    reference_language = reference_language or language_from_suffix(reference_file)
    if reference_language is None:
        if lowercase_tokenized:
            raise ValueError(f"Cannot tell the language of {reference_file} from its name: give its language code.")
        reference_language = "en"  # unused: only the Moses tokenizer needs a language
    model = model_or_preset if isinstance(model_or_preset, Transformer) else Transformer.from_preset(model_or_preset)
    translations, result = evaluate_model(
        model,
        sources,
        references,
        lowercase_tokenized=lowercase_tokenized,
        target_language=reference_language,
        tokenized_references=tokenized_references,
        **options,
    )
    return translations, result, reference_language


def _lines_aligned_with(path, source_file, count: int) -> list[str]:
    lines = list(read_lines(path))
    if len(lines) != count:
        raise ValueError(
            f"{source_file} has {count} lines but {path} has {len(lines)}: "
            "source and reference files must be line-aligned."
        )
    return lines


def language_from_suffix(path: str | os.PathLike) -> str | None:
    """'de' for 'test.de', 'test.de.gz' or 'test.lc.norm.tok.de.gz'; otherwise None.

    Example:
    >>> language_from_suffix("test_2016_flickr.de.gz"), language_from_suffix("test.txt")
    ('de', None)
    """
    match = re.search(r"\.([a-z]{2,3})(\.gz)?$", str(path))
    if match is None or match.group(1) in {"txt", "tsv", "gz"}:
        return None
    return match.group(1)
