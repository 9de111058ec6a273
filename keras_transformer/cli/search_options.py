"""The search options of `translate`, `evaluate` and `export`: `SearchSettings` as flags."""

import argparse

from keras_transformer.generation.settings import SearchSettings


def add_search_arguments(parser: argparse.ArgumentParser, *, greedy: bool = False) -> None:
    """--beam-size, --alpha and --max-extra-length (and --greedy), with section 6.1's defaults."""
    paper = SearchSettings()
    beams = parser.add_mutually_exclusive_group() if greedy else parser
    beams.add_argument(
        "--beam-size", type=int, default=paper.beam_size, help="beams per sentence (default %(default)s, the paper's)"
    )
    if greedy:
        beams.add_argument("--greedy", action="store_true", help="greedy search instead of beam search")
    parser.add_argument(
        "--alpha", type=float, default=paper.alpha, help="length penalty exponent (default %(default)s, the paper's)"
    )
    parser.add_argument(
        "--max-extra-length",
        type=int,
        default=paper.max_extra_length,
        help="at most source length + this many tokens (default %(default)s, the paper's)",
    )


def search_settings(args: argparse.Namespace) -> SearchSettings:
    """The `SearchSettings` of the parsed flags; a bad value is a `ValueError` naming it."""
    beam_size = None if getattr(args, "greedy", False) else args.beam_size
    return SearchSettings(beam_size=beam_size, alpha=args.alpha, max_extra_length=args.max_extra_length)
