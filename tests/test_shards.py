"""Corpora prepared once into shards and streamed (keras_transformer.training.shards_reading),
against the in-memory path (read_parallel, tokenize_pairs, token_batches) on small corpora."""

import gzip
import json
import warnings

import numpy as np
import pytest

import keras_transformer as kt
import keras_transformer.cli.main as cli
import keras_transformer.training_run.run as run_module
from helpers import REPO_ROOT, TINY_TRAIN_ARGUMENTS
from keras_transformer.training import data, parallel_text, shards_reading, shards_writing

WORDS = "a dog cat man woman runs play sleeps two dogs . ein hund katze frau singt".split()  # the tokenizer's


def write_corpus(folder, count, seed=0, max_words=7):
    """`count` random pairs in two gzipped files; some are too long for max_length 16."""
    rng = np.random.default_rng(seed)
    paths = []
    for side in ("en", "de"):
        lines = [" ".join(rng.choice(WORDS, rng.integers(1, max_words))) for _ in range(count)]
        path = folder / f"train.{side}.gz"
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
        paths.append(path)
    return paths


def prepare(source, target, out, tokenizer, **options):
    options = {"max_length": 16, "chunk_size": 16, "pairs_per_shard": 24, **options}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return shards_writing.prepare_corpus(source, target, out, tokenizer, **options)


def in_memory(source, target, tokenizer, max_length=16):
    sources, targets, report = parallel_text.read_parallel(source, target)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the drop warning
        return data.tokenize_pairs(sources, targets, tokenizer, max_length), report


def ids(dataset):
    return [(tuple(s.numpy()), tuple(t.numpy())) for s, t in dataset]


def batch_pairs(batches):
    """The `(source, target)` ids of every row of `token_batches`-style batches."""
    seen = []
    for x, y, _ in batches:
        for encoder, labels in zip(x["encoder_token_ids"].numpy(), y.numpy()):
            seen.append((tuple(encoder[encoder != 0][1:-1]), tuple(labels[labels != 0][:-1])))
    return seen


@pytest.fixture
def corpus_files(tmp_path):
    return write_corpus(tmp_path, 150)


def test_prepared_pairs_are_the_in_memory_token_ids_in_corpus_order(tmp_path, corpus_files, tokenizer):
    corpus = prepare(*corpus_files, tmp_path / "data", tokenizer)
    pairs, report = in_memory(*corpus_files, tokenizer)
    assert 0 < pairs.dropped and len(corpus.shards) > 2  # the test covers drops and several shards
    assert (corpus.pairs, corpus.dropped, corpus.read) == (len(pairs), pairs.dropped, report)
    assert (corpus.source_tokens + 2 * corpus.pairs, corpus.target_tokens + corpus.pairs) == pairs.num_tokens()
    expected = list(zip(map(tuple, pairs.sources.to_list()), map(tuple, pairs.targets.to_list())))
    assert ids(shards_reading.prepared_pairs(corpus, shuffle=False)) == expected
    reopened = shards_reading.PreparedCorpus.open(tmp_path / "data")
    assert reopened == corpus
    assert reopened.tokenizer_sha256 == shards_reading.tokenizer_checksum(reopened.tokenizer())
    assert reopened.tokenizer().proto == tokenizer.proto


def test_streamed_batches_hold_every_kept_pair_once_per_epoch_as_in_memory_batches(tmp_path, corpus_files, tokenizer):
    corpus = prepare(*corpus_files, tmp_path / "data", tokenizer)
    pairs, _ = in_memory(*corpus_files, tokenizer)
    streamed = shards_reading.prepared_batches(corpus, 64, seed=3, shuffle_buffer=40)
    remembered = data.token_batches(pairs, 64, seed=3)
    assert streamed.element_spec == remembered.element_spec
    assert sorted(batch_pairs(streamed)) == sorted(batch_pairs(remembered))
    # Shuffled, not in corpus order; the same seed gives the same order.
    order = ids(shards_reading.prepared_pairs(corpus, seed=5, shuffle_buffer=40))
    assert order == ids(shards_reading.prepared_pairs(corpus, seed=5, shuffle_buffer=40))
    assert order != ids(shards_reading.prepared_pairs(corpus, shuffle=False))


def test_repeated_streaming_is_whole_epochs_each_reshuffled(tmp_path, corpus_files, tokenizer):
    corpus = prepare(*corpus_files, tmp_path / "data", tokenizer)
    one_epoch = sorted(ids(shards_reading.prepared_pairs(corpus, shuffle=False)))
    stream = ids(shards_reading.prepared_pairs(corpus, seed=1, shuffle_buffer=40, repeat=True).take(2 * corpus.pairs))
    first, second = stream[: corpus.pairs], stream[corpus.pairs :]
    assert sorted(first) == sorted(second) == one_epoch
    assert first != second


def test_processes_read_their_own_pairs_and_together_every_pair_once(tmp_path, corpus_files, tokenizer):
    corpus = prepare(*corpus_files, tmp_path / "data", tokenizer)
    every = ids(shards_reading.prepared_pairs(corpus, shuffle=False))
    per_process = [
        ids(shards_reading.prepared_pairs(corpus, seed=2, num_processes=2, process_index=index)) for index in (0, 1)
    ]
    assert sorted(map(len, per_process)) == [corpus.pairs // 2, -(-corpus.pairs // 2)]
    assert sorted(per_process[0] + per_process[1]) == sorted(every)
    more_processes_than_shards = len(corpus.shards) + 1
    shares = [
        ids(shards_reading.prepared_pairs(corpus, num_processes=more_processes_than_shards, process_index=index))
        for index in range(more_processes_than_shards)
    ]
    assert all(shares) and sorted(sum(shares, [])) == sorted(every)


def test_an_interrupted_preparation_leaves_nothing_readable(tmp_path, corpus_files, tokenizer, monkeypatch):
    records = shards_writing._record
    calls = []

    def fail_after_two_records(*args):
        calls.append(1)
        if len(calls) > 2:
            raise KeyboardInterrupt
        return records(*args)

    monkeypatch.setattr(shards_writing, "_record", fail_after_two_records)
    with pytest.raises(KeyboardInterrupt):
        prepare(*corpus_files, tmp_path / "data", tokenizer)
    assert len(calls) == 3  # it was writing shards when interrupted
    assert not (tmp_path / "data").exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".data")]
    with pytest.raises(ValueError, match="holds no manifest.json"):
        shards_reading.PreparedCorpus.open(tmp_path / "data")


def test_shards_without_their_manifest_are_refused(tmp_path, corpus_files, tokenizer):
    # What a process killed before the final rename would leave, had it written in place.
    corpus = prepare(*corpus_files, tmp_path / "data", tokenizer)
    (corpus.folder / shards_reading.MANIFEST_FILE).unlink()
    with pytest.raises(ValueError, match="its preparation did not finish"):
        shards_reading.PreparedCorpus.open(corpus.folder)


def test_an_existing_folder_is_replaced_only_when_asked(tmp_path, corpus_files, tokenizer):
    out = tmp_path / "data"
    prepare(*corpus_files, out, tokenizer)
    with pytest.raises(ValueError, match="already holds a prepared corpus"):
        prepare(*corpus_files, out, tokenizer)
    assert prepare(*corpus_files, out, tokenizer, max_length=32, overwrite=True).max_length == 32
    assert shards_reading.PreparedCorpus.open(out).max_length == 32
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("keep")
    with pytest.raises(ValueError, match="is not a prepared corpus"):
        prepare(*corpus_files, tmp_path / "notes", tokenizer, overwrite=True)
    assert (tmp_path / "notes" / "mine.txt").read_text() == "keep"


def write_bad_files(folder):
    (folder / "a.en").write_bytes(b"one\n\nthree\nfour\nfive\nsix\n")
    (folder / "a.de").write_bytes(b"eins\nzwei\ndrei\nvi\xffer\nfunf\n")
    (folder / "a.tsv").write_bytes(b"a dog .\tein hund .\nno tab\n\tleer\nx\ty\n")
    return folder / "a.en", folder / "a.de", folder / "a.tsv"


@pytest.mark.parametrize("tsv", [False, True], ids=["two files", "tsv"])
def test_bad_lines_are_refused_or_counted_as_read_parallel_does(tmp_path, tokenizer, tsv):
    source, target, table = write_bad_files(tmp_path)
    files = (table, None) if tsv else (source, target)
    with pytest.raises(ValueError) as expected:
        parallel_text.read_parallel(*files)
    with pytest.raises(ValueError) as raised:
        prepare(*files, tmp_path / "data", tokenizer)
    assert str(raised.value) == str(expected.value)
    assert not (tmp_path / "data").exists()

    sources, targets, report = parallel_text.read_parallel(*files, skip_bad=True)
    corpus = prepare(*files, tmp_path / "data", tokenizer, skip_bad=True)
    assert corpus.read == report and report.skipped > 0
    assert shards_reading.PreparedCorpus.open(tmp_path / "data").read == report
    assert ids(shards_reading.prepared_pairs(corpus, shuffle=False)) == [
        (tuple(np.asarray(tokenizer(s))), tuple(np.asarray(tokenizer(t)))) for s, t in zip(sources, targets)
    ]


def test_the_vocabulary_sample_is_bounded_and_drawn_from_both_sides(tmp_path, corpus_files):
    sources, targets, _ = parallel_text.read_parallel(*corpus_files)
    sample = shards_writing.sample_sentences(*corpus_files, 50)
    assert len(sample) == 50 and set(sample) <= set(sources + targets)
    assert set(sample) & set(sources) and set(sample) & set(targets)
    assert len(shards_writing.sample_sentences(*corpus_files, 10_000)) == 300


def test_prepare_and_train_commands(tmp_path, corpus_files, capsys):
    out = tmp_path / "data"
    source, target = map(str, corpus_files)
    prepare_command = ["prepare", "--src", source, "--tgt", target, "--max-length", "16", "--out", str(out)]
    assert cli.main(prepare_command + ["--vocab-size", "40", "--pairs-per-shard", "20"]) == 0
    manifest = json.loads((out / shards_reading.MANIFEST_FILE).read_text())
    assert manifest["read"]["pairs"] == 150 and len(manifest["shards"]) > 1
    assert cli.main(prepare_command + ["--vocab-size", "40"]) == 1
    assert "already holds a prepared corpus" in capsys.readouterr().err

    run = tmp_path / "run"
    train = ["train", "--data", str(out), "--preset", "no_such_preset", *TINY_TRAIN_ARGUMENTS, "--out", str(run)]
    train += ["--max-steps", "2", "--valid-every", "2", "--checkpoint-every-steps", "2"]
    assert cli.main(train) == 0
    assert (run / "vocabulary.spm").read_bytes() == (out / "vocabulary.spm").read_bytes()
    assert (run / "checkpoints" / "ckpt-00000002.npz").exists()
    assert f"{manifest['pairs']} pairs in {len(manifest['shards'])} shards" in capsys.readouterr().out

    assert cli.main(train + ["--src", source]) == 1
    assert "either as --src" in capsys.readouterr().err
    other = tmp_path / "other"
    assert cli.main(prepare_command[:-1] + [str(other), "--vocab-size", "48"]) == 0
    assert cli.main(train[:2] + [str(other)] + train[3:]) == 1
    assert "is not the vocabulary" in capsys.readouterr().err


def test_a_run_from_text_trains_the_vocabulary_and_batches_as_it_did_in_memory(tmp_path, corpus_files, tokenizer):
    # What train --src did before it prepared the text into the run folder.
    sources, targets, _ = parallel_text.read_parallel(*corpus_files)
    streamed_vocabulary = kt.train_tokenizer(run_module._sentences(*map(str, corpus_files), False), 40)
    assert streamed_vocabulary.proto == kt.train_tokenizer(sources + targets, 40).proto
    corpus = prepare(*corpus_files, tmp_path / "data", tokenizer, pairs_per_shard=100_000)
    pairs, _ = in_memory(*corpus_files, tokenizer)
    streamed = shards_reading.prepared_batches(corpus, 64, seed=3, repeat=True).take(60)  # over 2 epochs
    remembered = data.token_batches(pairs, 64, seed=3, repeat=True).take(60)
    assert batch_pairs(streamed) == batch_pairs(remembered)


def test_a_run_prepares_its_text_once_and_refuses_other_text(tmp_path, corpus_files, monkeypatch):
    source, target = map(str, corpus_files)
    options = dict(src=source, tgt=target, max_length=16, vocab_size=40)
    (tmp_path / "run").mkdir()
    folder = run_module.TrainingRun(str(tmp_path / "run"), "transformer_tiny", **options)._prepare_text()
    corpus = shards_reading.PreparedCorpus.open(folder)
    assert corpus.inputs == [source, target] and corpus.tokenizer_sha256 == shards_reading.tokenizer_checksum(
        kt.TransformerTokenizer(proto=str(tmp_path / "run" / "vocabulary.spm"))
    )

    def no_second_preparation(*args, **kwargs):
        raise AssertionError("prepared again")

    monkeypatch.setattr(shards_writing, "prepare_corpus", no_second_preparation)
    assert run_module.TrainingRun(str(tmp_path / "run"), "transformer_tiny", **options)._prepare_text() == folder
    other = run_module.TrainingRun(str(tmp_path / "run"), "transformer_tiny", **{**options, "tgt": source})
    with pytest.raises(ValueError, match="train in a new run folder"):
        other._prepare_text()


def test_a_datasets_dataset_of_translations_is_prepared_as_its_text_would_be(tmp_path, corpus_files, tokenizer):
    datasets = pytest.importorskip("datasets")
    sources, targets, report = parallel_text.read_parallel(*corpus_files)
    rows = [{"en": s, "de": t} for s, t in zip(sources, targets)]
    dataset = datasets.Dataset.from_dict({"translation": rows})
    corpus = prepare(dataset, None, tmp_path / "data", tokenizer, languages=("en", "de"))
    from_files = prepare(*corpus_files, tmp_path / "files", tokenizer)
    assert ids(shards_reading.prepared_pairs(corpus, shuffle=False)) == ids(
        shards_reading.prepared_pairs(from_files, shuffle=False)
    )
    assert (corpus.pairs, corpus.dropped, corpus.read) == (from_files.pairs, from_files.dropped, report)
    assert corpus.inputs == ["a datasets.Dataset (en-de)"]
    # The other direction, and a row with an empty side refused or counted as a line is.
    reverse = prepare(dataset, None, tmp_path / "reverse", tokenizer, languages=("de", "en"))
    assert ids(shards_reading.prepared_pairs(reverse, shuffle=False))[0][0] == tuple(np.asarray(tokenizer(targets[0])))
    empty = datasets.Dataset.from_dict({"translation": rows[:3] + [{"en": " ", "de": "ein hund ."}]})
    with pytest.raises(ValueError, match="row 4: empty sentence"):
        prepare(empty, None, tmp_path / "empty", tokenizer, languages=("en", "de"))
    counted = prepare(empty, None, tmp_path / "empty", tokenizer, languages=("en", "de"), skip_bad=True)
    assert (counted.read.pairs, counted.read.empty) == (3, 1)


def test_preparation_tokenizes_as_tensorflow_pipelines_do():
    """Preparation tokenizes outside TensorFlow (KerasHub's Python path); the ids
    are those of the TensorFlow op that preprocessing in `tf.data` runs."""
    import tensorflow as tf

    tokenizer = kt.TransformerTokenizer(proto=str(REPO_ROOT / "presets/multi30k_en_de/assets/tokenizer/vocabulary.spm"))
    sentences = [
        "Zwei Hunde spielen im Schnee.",
        "  Leading, trailing   and repeated spaces  ",
        "Ein naïver Café-Besitzer – „Anführungszeichen“ 🙂",
        "ÄÖÜ äöü ß ﬁ and 日本語",
        "x",
    ]
    flat, lengths = shards_writing._id_rows(tokenizer, sentences)
    in_tensorflow = tf.function(tokenizer)(tf.constant(sentences))
    assert lengths.tolist() == in_tensorflow.row_lengths().numpy().tolist()
    assert flat.tolist() == in_tensorflow.flat_values.numpy().tolist()
