"""How fast SentencePiece itself tokenizes here: the ceiling of preparing a corpus.

Preparation (`keras_transformer.training.shards_writing`) reads, tokenizes and
writes; tokenizing is most of its work. This times the tokenizer alone on
the benchmark's synthetic corpus lines (two Multi30k training sentences
joined, about 30 tokens, as `benchmarks.data_pipeline` generates them), with
the `multi30k_en_de` vocabulary, in one process:

- tensorflow_text's SentencePiece op, as `tf.data` preprocessing runs it,
  in chunks of 2,048 lines;
- the `sentencepiece` package's batch `encode` (keras-hub's dependency), on
  1 thread and on every core;
- `TransformerTokenizer.tokenize` on Python lists of 2,048 lines, as
  preparation calls it (KerasHub's Python path: that package, every core).

A pair is two sentences, so pairs/s is half the sentences/s printed.

    python -m benchmarks.tokenizer_speed --lines 100000
"""

import argparse
import os
import time

from benchmarks.data_pipeline import VOCABULARY, generate

CHUNK = 2048


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--workdir", default="/tmp/keras_transformer_data_bench")
    args = parser.parse_args(argv)
    os.makedirs(args.workdir, exist_ok=True)

    import sentencepiece
    import tensorflow as tf
    import tensorflow_text

    source, _ = generate(args.lines, os.path.join(args.workdir, f"corpus-{args.lines}"))
    lines = open(source, encoding="utf-8").read().splitlines()
    proto = VOCABULARY.read_bytes()
    results = {}

    op = tensorflow_text.SentencepieceTokenizer(proto)
    op.tokenize(tf.constant(lines[:CHUNK]))  # warm up
    start = time.perf_counter()
    for i in range(0, len(lines), CHUNK):
        op.tokenize(tf.constant(lines[i : i + CHUNK]))
    results["tensorflow_text op, chunks of 2,048"] = len(lines) / (time.perf_counter() - start)

    processor = sentencepiece.SentencePieceProcessor(model_proto=proto)
    same = processor.encode(lines[:CHUNK]) == op.tokenize(tf.constant(lines[:CHUNK])).to_list()
    for threads in sorted({1, os.cpu_count() or 1}):
        start = time.perf_counter()
        processor.encode(lines, num_threads=threads)
        results[f"sentencepiece encode, {threads} thread(s)"] = len(lines) / (time.perf_counter() - start)

    from keras_transformer import TransformerTokenizer

    tokenizer = TransformerTokenizer(proto=proto)
    same = same and tokenizer.tokenize(lines[:CHUNK]) == processor.encode(lines[:CHUNK])
    start = time.perf_counter()
    for i in range(0, len(lines), CHUNK):
        tokenizer.tokenize(lines[i : i + CHUNK])
    results["TransformerTokenizer.tokenize, lists of 2,048 (preparation)"] = len(lines) / (time.perf_counter() - start)

    print(f"{len(lines):,} lines; the same ids from all: {same}")
    print("| tokenizer | sentences/s | pairs/s |")
    print("| --- | --- | --- |")
    for name, rate in results.items():
        print(f"| {name} | {rate:,.0f} | {rate / 2:,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
