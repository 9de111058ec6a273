"""`keras-transformer prepare` and `prepare_corpus` refuse shard and chunk
sizes that would write an empty corpus."""

import pytest

import keras_transformer.cli.main as cli
from helpers import PAIRS
from keras_transformer.training import shards_writing


@pytest.fixture
def twenty_pairs(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("".join(f"{s}\t{t}\n" for s, t in (PAIRS * 4)[:20]), encoding="utf-8")
    return path


@pytest.mark.parametrize("size", ["0", "-3"])
def test_the_command_refuses_fewer_than_one_pair_per_shard(tmp_path, twenty_pairs, tokenizer, capsys, size):
    vocabulary, out = tmp_path / "vocabulary.spm", tmp_path / "data"
    vocabulary.write_bytes(tokenizer.proto)
    command = ["prepare", "--src", str(twenty_pairs), "--vocabulary", str(vocabulary), "--out", str(out)]
    command += ["--pairs-per-shard", size]
    assert cli.main(command) == 1
    assert f"--pairs-per-shard must be at least 1; got {size}" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("sizes", [{"pairs_per_shard": 0}, {"chunk_size": 0}])
def test_the_library_refuses_fewer_than_one_pair_per_shard_or_chunk(tmp_path, twenty_pairs, tokenizer, sizes):
    name = next(iter(sizes))
    with pytest.raises(ValueError, match=f"{name} must be a whole number of pairs, at least 1; got 0"):
        shards_writing.prepare_corpus(twenty_pairs, None, tmp_path / "data", tokenizer, **sizes)
    assert not (tmp_path / "data").exists()
