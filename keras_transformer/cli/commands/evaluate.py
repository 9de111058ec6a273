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
    from keras_transformer.evaluation.test_set import evaluate_files
    from keras_transformer.utils.files import write_text_atomically

    search = search_settings(args)
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1; got {args.batch_size}.")
    translations, result, reference_language = evaluate_files(
        args.preset,
        args.src,
        args.ref,
        tokenized_reference_file=args.ref_tok,
        reference_language=args.reference_language,
        lowercase_tokenized=args.lowercase_tokenized,
        translate_into=args.target_language,
        search=search,
        batch_size=args.batch_size,
        verbose=0 if args.quiet else 1,
    )
    print(result)
    if args.output:
        write_text_atomically(args.output, "".join(t + "\n" for t in translations))
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
        write_text_atomically(args.json, json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return 0
