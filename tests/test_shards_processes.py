"""The processes of a multi-host run share a prepared corpus's pairs evenly
(`training.shards_reading.prepared_pairs`), whatever its number of shards."""

import collections
import itertools
import warnings

from helpers import PAIRS
from keras_transformer.training import shards_reading, shards_writing

SHARDS, PAIRS_PER_SHARD, PROCESSES = 3, 10, 2


def distinct_pairs(count):
    """`count` different pairs of the tokenizer's words."""
    sources = sorted({word for source, _ in PAIRS for word in source.split()})
    targets = sorted({word for _, target in PAIRS for word in target.split()})
    words = itertools.product(itertools.permutations(sources, 2), itertools.permutations(targets, 2))
    return [(" ".join(source), " ".join(target)) for source, target in itertools.islice(words, count)]


def three_shards(tmp_path, tokenizer):
    path = tmp_path / "pairs.tsv"
    path.write_text("".join(f"{s}\t{t}\n" for s, t in distinct_pairs(SHARDS * PAIRS_PER_SHARD)), encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        corpus = shards_writing.prepare_corpus(
            path, None, tmp_path / "data", tokenizer, chunk_size=PAIRS_PER_SHARD, pairs_per_shard=PAIRS_PER_SHARD
        )
    assert [shard["pairs"] for shard in corpus.shards] == [PAIRS_PER_SHARD] * SHARDS
    return corpus


def ids(dataset):
    return [(tuple(s.numpy()), tuple(t.numpy())) for s, t in dataset]


def test_processes_read_disjoint_equal_shares_of_every_pair_whatever_the_shard_count(tmp_path, tokenizer):
    corpus = three_shards(tmp_path, tokenizer)
    every = ids(shards_reading.prepared_pairs(corpus, shuffle=False))
    assert len(set(every)) == corpus.pairs
    shares = [
        ids(shards_reading.prepared_pairs(corpus, seed=index, num_processes=PROCESSES, process_index=index))
        for index in range(PROCESSES)
    ]
    assert [len(share) for share in shares] == [corpus.pairs // PROCESSES] * PROCESSES
    assert sorted(shares[0] + shares[1]) == sorted(every)


def test_processes_of_a_step_based_run_see_every_pair_equally_often(tmp_path, tokenizer):
    corpus = three_shards(tmp_path, tokenizer)
    steps = 2 * corpus.pairs  # pairs each process reads: four of its passes
    seen = collections.Counter()
    for index in range(PROCESSES):
        stream = shards_reading.prepared_pairs(
            corpus, seed=index, repeat=True, num_processes=PROCESSES, process_index=index
        )
        seen.update(ids(stream.take(steps)))
    assert collections.Counter(seen.values()) == {PROCESSES * steps // corpus.pairs: corpus.pairs}
