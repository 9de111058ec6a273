"""Tokenize a parallel corpus once into sharded files that `train --data` streams.

One pass over the text files (with train's checks of bad lines) writes the
token ids into TFRecord shards, the vocabulary and a manifest (manifest.json:
the vocabulary's checksum, pairs kept, too-long pairs dropped, bad lines
skipped). Memory stays bounded whatever the corpus size. The vocabulary is
given (--vocabulary) or trained first on a sample of the corpus
(--vocab-size; --vocab-sentences sentences drawn uniformly from both sides). The
folder appears only once complete: an interrupted preparation leaves nothing
that train would read; run the command again.

Example:

    keras-transformer prepare --src train.en.gz --tgt train.de.gz \\
        --vocab-size 37000 --out data/wmt14_en_de
    keras-transformer train --data data/wmt14_en_de --preset transformer_base --out runs/en_de
"""

import argparse

from keras_transformer.utils.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--src", required=True, help="source sentences, one a line (plain or .gz); a TSV file without --tgt"
    )
    parser.add_argument("--tgt", help="target sentences, line-aligned with --src")
    vocabulary = parser.add_mutually_exclusive_group(required=True)
    vocabulary.add_argument("--vocabulary", help="an existing SentencePiece .spm vocabulary")
    vocabulary.add_argument("--vocab-size", type=int, help="train a shared vocabulary of this many subwords")
    parser.add_argument(
        "--vocab-sentences",
        type=int,
        default=2_000_000,
        help="sentences drawn from the corpus to train the vocabulary on (default %(default)s)",
    )
    parser.add_argument(
        "--max-length",
        type=int,
        default=256,
        help="longest sequence in tokens; longer pairs are dropped and counted (default %(default)s)",
    )
    parser.add_argument(
        "--skip-bad",
        action="store_true",
        help="skip and count empty or undecodable lines and unpaired lines, instead of stopping",
    )
    parser.add_argument(
        "--pairs-per-shard",
        type=int,
        default=100_000,
        help="about this many pairs per shard, at least 1 (default %(default)s)",
    )
    parser.add_argument("--out", required=True, help="the folder to write")
    parser.add_argument("--overwrite", action="store_true", help="replace a prepared corpus in --out")


def run(args: argparse.Namespace) -> int:
    from keras_transformer.training import shards_writing

    if args.pairs_per_shard < 1:  # before the vocabulary's training, which takes a while
        raise UserError(
            f"--pairs-per-shard must be at least 1; got {args.pairs_per_shard}. "
            "Leave it out for 100,000 pairs per shard."
        )
    tokenizer = _vocabulary(args)
    corpus = shards_writing.prepare_corpus(
        args.src,
        args.tgt,
        args.out,
        tokenizer,
        args.max_length,
        skip_bad=args.skip_bad,
        pairs_per_shard=args.pairs_per_shard,
        overwrite=args.overwrite,
    )
    print(f"{args.out}: {corpus}.")
    return 0


def _vocabulary(args):
    from keras_transformer import TransformerTokenizer, train_tokenizer
    from keras_transformer.training.shards_writing import sample_sentences

    if args.vocabulary:
        return TransformerTokenizer(proto=args.vocabulary)
    print(f"training a shared vocabulary of {args.vocab_size} subwords on a sample of the corpus.")
    sentences = sample_sentences(args.src, args.tgt, args.vocab_sentences, skip_bad=args.skip_bad)
    return train_tokenizer(sentences, args.vocab_size, max_sentences=len(sentences))
