import gzip

import numpy as np
import pytest

from keras_transformer.training import data, parallel_text
from keras_transformer.utils.files import read_lines


def write(path, lines, raw=False):
    content = b"".join(lines) if raw else "".join(line + "\n" for line in lines).encode("utf-8")
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(content)
    return path


def test_read_parallel_plain_and_gzip(tmp_path):
    source = write(tmp_path / "a.en.gz", ["a dog .", "a cat ."])
    target = write(tmp_path / "a.de", ["ein hund .", "eine katze ."])
    sources, targets, report = parallel_text.read_parallel(source, target)
    assert sources == ["a dog .", "a cat ."]
    assert targets == ["ein hund .", "eine katze ."]
    assert (report.pairs, report.skipped) == (2, 0)


def test_mismatched_line_counts_name_file_and_line(tmp_path):
    source = write(tmp_path / "a.en", ["one", "two", "three"])
    target = write(tmp_path / "a.de", ["eins", "zwei"])
    with pytest.raises(ValueError, match=r"a\.de has 2 lines but .*a\.en goes on at line 3"):
        parallel_text.read_parallel(source, target)
    sources, _, report = parallel_text.read_parallel(source, target, skip_bad=True)
    assert sources == ["one", "two"]
    assert report.unpaired == 1


def test_bad_utf8_names_file_and_line(tmp_path):
    source = write(tmp_path / "a.en", ["one", "two", "three"])
    target = write(tmp_path / "a.de", [b"eins\n", b"zw\xffei\n", b"drei\n"], raw=True)
    with pytest.raises(ValueError, match=r"a\.de, line 2: not valid UTF-8"):
        parallel_text.read_parallel(source, target)
    with pytest.raises(ValueError, match=r"a\.de, line 2"):
        list(read_lines(target))
    sources, targets, report = parallel_text.read_parallel(source, target, skip_bad=True)
    assert (sources, targets) == (["one", "three"], ["eins", "drei"])
    assert report.undecodable == 1


def test_empty_lines_raise_or_are_skipped_and_counted(tmp_path):
    source = write(tmp_path / "a.en", ["one", "", "three", "four"])
    target = write(tmp_path / "a.de", ["eins", "zwei", "  ", "vier"])
    with pytest.raises(ValueError, match=r"a\.en, line 2: empty sentence"):
        parallel_text.read_parallel(source, target)
    sources, _, report = parallel_text.read_parallel(source, target, skip_bad=True)
    assert sources == ["one", "four"]
    assert report.empty == 2
    assert "skipped 2 with an empty side" in str(report)


def test_tsv(tmp_path):
    path = write(tmp_path / "a.tsv", ["a dog .\tein hund .", "no tab here", "x\ty"])
    with pytest.raises(ValueError, match=r"a\.tsv, line 2: expected 'source<TAB>target'"):
        parallel_text.read_parallel(path)
    sources, targets, report = parallel_text.read_parallel(path, skip_bad=True)
    assert sources == ["a dog .", "x"] and targets == ["ein hund .", "y"]
    assert report.unpaired == 1


def random_corpus(count, seed=0):
    rng = np.random.default_rng(seed)
    words = "a dog cat man runs plays ball park green red on street".split()

    def sentence():
        return " ".join(rng.choice(words, rng.integers(1, 25)))

    return [sentence() for _ in range(count)], [sentence() for _ in range(count)]


@pytest.fixture(scope="module")
def corpus_tokenizer():
    import keras_transformer as kt

    sources, targets = random_corpus(200, seed=1)
    return kt.train_tokenizer(sources + targets, vocabulary_size=40)


def test_long_pairs_are_dropped_and_counted(corpus_tokenizer):
    sources, targets = random_corpus(200)
    with pytest.warns(UserWarning, match=r"Dropped \d+ of 200"):
        pairs = data.tokenize_pairs(sources, targets, corpus_tokenizer, max_length=20)
    lengths = [(len(corpus_tokenizer(s)) + 2, len(corpus_tokenizer(t)) + 1) for s, t in zip(sources, targets)]
    expected_kept = sum(s <= 20 and t <= 20 for s, t in lengths)
    assert 0 < expected_kept < 200
    assert len(pairs) == expected_kept
    assert pairs.dropped == 200 - expected_kept
    assert int(pairs.sources.row_lengths().numpy().max()) + 2 <= 20


def test_batches_are_bucketed_by_tokens(corpus_tokenizer):
    sources, targets = random_corpus(300)
    pairs = data.tokenize_pairs(sources, targets, corpus_tokenizer, max_length=64)
    tokens_per_batch = 256
    buckets = data.bucket_lengths(64, 8)
    shapes = set()
    for x, y, w in data.token_batches(pairs, tokens_per_batch, repeat=True, seed=3).take(60):
        batch, length = x["encoder_token_ids"].shape
        shapes.add((batch, length))
        assert length in buckets
        assert batch == tokens_per_batch // length  # about N tokens, never more
        for key in ("decoder_token_ids", "encoder_padding_mask", "decoder_padding_mask"):
            assert x[key].shape == (batch, length)
        assert y.shape == w.shape == (batch, length)
    assert len(shapes) <= len(buckets)


def test_batches_are_made_without_the_autotuner_after_every_step(corpus_tokenizer):
    # tf.data's autotuner competes with the training step for the CPU
    # (data.without_autotuning); the options must survive the steps that
    # the train command adds after token_batches.
    sources, targets = random_corpus(50)
    pairs = data.tokenize_pairs(sources, targets, corpus_tokenizer, max_length=64)
    batches = data.token_batches(pairs, 256, repeat=True, seed=3)
    assert batches.options().autotune.enabled is False
    assert data.weight_by_update(batches, 2).options().autotune.enabled is False


def test_batches_hold_every_pair_once_in_the_model_layout(corpus_tokenizer):
    sources, targets = random_corpus(100)
    pairs = data.tokenize_pairs(sources, targets, corpus_tokenizer, max_length=64)
    seen = []
    for x, y, w in data.token_batches(pairs, 256, shuffle=False):
        encoder = x["encoder_token_ids"].numpy()
        decoder = x["decoder_token_ids"].numpy()
        labels = y.numpy()
        np.testing.assert_array_equal(x["encoder_padding_mask"].numpy(), encoder != 0)
        np.testing.assert_array_equal(x["decoder_padding_mask"].numpy(), decoder != 0)
        np.testing.assert_array_equal(w.numpy(), (labels != 0).astype("float32"))
        for e, d, t in zip(encoder, decoder, labels):
            e, d, t = e[e != 0], d[d != 0], t[t != 0]
            assert e[0] == 2 and e[-1] == 3  # <s> source </s>
            assert d[0] == 2 and t[-1] == 3  # <s> target / target </s>
            np.testing.assert_array_equal(d[1:], t[:-1])
            seen.append((tuple(e[1:-1]), tuple(t[:-1])))
    expected = [(tuple(s), tuple(t)) for s, t in zip(pairs.sources.to_list(), pairs.targets.to_list())]
    assert sorted(seen) == sorted(expected)


def test_tokens_per_batch_too_small_is_an_error(corpus_tokenizer):
    pairs = data.tokenize_pairs(["a dog"], ["ein hund"], corpus_tokenizer, max_length=64)
    with pytest.raises(ValueError, match="cannot hold even 1 pair"):
        data.token_batches(pairs, 32)


def test_batch_sizes_divide_among_devices(corpus_tokenizer):
    sources, targets = random_corpus(100)
    pairs = data.tokenize_pairs(sources, targets, corpus_tokenizer, max_length=64)
    batches = data.token_batches(pairs, 256, shuffle=False, batch_multiple=4, drop_remainder=True)
    sizes = [int(x["encoder_token_ids"].shape[0]) for x, _, _ in batches]
    assert sizes and all(size % 4 == 0 and size > 0 for size in sizes)
