"""Translate a test set with beam search and report sacreBLEU.

Prints BLEU and chrF on cased, detokenized text with sacreBLEU's signatures
and, with --lowercase-tokenized or --ref-tok, BLEU on lower-cased,
Moses-tokenized text (the form of most published Multi30k results).
A multilingual model takes the language to translate into with
--target-language, as `translate` does; --reference-language (by default
from --ref's suffix) is the references' language code for Moses' rules.

Example:
    keras-transformer evaluate presets/my_ende --src test_2016_flickr.en.gz \\
        --ref test_2016_flickr.de.gz --ref-tok test_2016_flickr.lc.norm.tok.de.gz \\
        --output hyps.de --json scores.json
    keras-transformer evaluate hf://Helsinki-NLP/opus-mt-tc-big-gmw-gmw --target-language nld \\
        --src flores.en --ref flores.nl --lowercase-tokenized
"""

# User mistakes raise ValueError, which `keras_transformer.cli.main` reports in
# one line.
import argparse
import json
import re
from pathlib import Path

from keras_transformer.cli.search_options import add_search_arguments, search_settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("preset", help="a preset name, a preset directory, or an hf:// handle")
    parser.add_argument("--src", required=True, help="source sentences, one a line (plain or .gz)")
    parser.add_argument("--ref", required=True, help="cased, detokenized references, line-aligned with --src")
    parser.add_argument(
        "--ref-tok",
        help="lower-cased, Moses-tokenized references (e.g. Multi30k's *.lc.norm.tok.de) to use "
        "instead of tokenizing --ref; implies --lowercase-tokenized",
    )
    parser.add_argument(
        "--lowercase-tokenized",
        action="store_true",
        help="also report BLEU on lower-cased, Moses-tokenized text",
    )
    parser.add_argument(
        "--target-language",
        metavar="LANG",
        help="for a multilingual model, the language to translate into (e.g. deu): its token (>>deu<<) starts "
        "each sentence that has none; an unknown language lists the model's",
    )
    parser.add_argument(
        "--reference-language",
        metavar="CODE",
        help="language code of the references, for Moses' rules (default: from --ref's "
        "suffix, e.g. 'de' for test.de or test.de.gz)",
    )
    add_search_arguments(parser)
    parser.add_argument("--batch-size", type=int, default=32, help="sentences decoded together (default 32)")
    parser.add_argument("--output", help="write the translations here, one a line")
    parser.add_argument("--json", help="write the scores and settings here as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from keras_transformer import Transformer
    from keras_transformer.training.evaluation import evaluate_model
    from keras_transformer.utils.files import read_lines

    search = search_settings(args)
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1; got {args.batch_size}.")
    sources = list(read_lines(args.src))
    references = list(read_lines(args.ref))
    if len(sources) != len(references):
        raise ValueError(
            f"{args.src} has {len(sources)} lines but {args.ref} has {len(references)}: "
            "source and reference files must be line-aligned."
        )
    tokenized_references = None
    if args.ref_tok:
        tokenized_references = list(read_lines(args.ref_tok))
        if len(tokenized_references) != len(sources):
            raise ValueError(
                f"{args.src} has {len(sources)} lines but {args.ref_tok} has "
                f"{len(tokenized_references)}: they must be line-aligned."
            )
    lowercase_tokenized = args.lowercase_tokenized or tokenized_references is not None
    reference_language = args.reference_language or _language_from_suffix(args.ref)
    if reference_language is None:
        if lowercase_tokenized:
            raise ValueError(f"Cannot tell the language of {args.ref} from its name: pass --reference-language.")
        reference_language = "en"  # unused: only the Moses tokenizer needs a language.

    model = Transformer.from_preset(args.preset)
    if args.target_language is not None:
        _set_target_language(model, args.target_language)
    translations, result = evaluate_model(
        model,
        sources,
        references,
        search=search,
        batch_size=args.batch_size,
        lowercase_tokenized=lowercase_tokenized,
        target_language=reference_language,
        tokenized_references=tokenized_references,
        verbose=0 if args.quiet else 1,
    )
    print(result)
    if args.output:
        Path(args.output).write_text("".join(t + "\n" for t in translations), encoding="utf-8")
    if args.json:
        report = {
            **result.to_dict(),
            "preset": str(args.preset),
            "src": str(args.src),
            "ref": str(args.ref),
            "ref_tok": args.ref_tok,
            "beam_size": args.beam_size,
            "alpha": args.alpha,
            "max_extra_length": args.max_extra_length,
            "target_language": args.target_language,
            "reference_language": reference_language,
        }
        Path(args.json).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


def _set_target_language(model, language: str) -> None:
    """Makes a multilingual model translate into `language`.

    Raises:
        ValueError: the model has no such language, or no target-language
            tokens at all; the message says which it has.
    """
    tokenizer = model.preprocessor.tokenizer
    if not hasattr(tokenizer, "set_target_language"):
        raise ValueError(
            f"This model has no target-language tokens (got --target-language {language}): it translates "
            "into one language. Leave --target-language out (--reference-language names the references' language)."
        )
    tokenizer.set_target_language(language)


def _language_from_suffix(path: str) -> str | None:
    """'de' for 'test.de', 'test.de.gz' or 'test.lc.norm.tok.de.gz'; otherwise None."""
    match = re.search(r"\.([a-z]{2,3})(\.gz)?$", str(path))
    if match is None or match.group(1) in {"txt", "tsv", "gz"}:
        return None
    return match.group(1)
