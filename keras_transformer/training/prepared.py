"""Parallel corpora tokenized once into sharded files, then streamed from disk while training.

`keras-transformer train --src --tgt` holds every pair in memory and
tokenizes the corpus at each start; at the paper's scale (WMT 2014, millions
of pairs) that takes more memory than a training host has. Here:

- `prepare_corpus(source, target, out, tokenizer, max_length)` reads the pair
  files in one streaming pass (with `read_parallel`'s checks and counts: it
  is `stream_parallel`), tokenizes chunks of pairs in parallel with
  `tf.data`, drops (and counts) pairs too long for `max_length` as
  `tokenize_pairs` does, and writes the token ids into sharded TFRecord
  files, the vocabulary, and last a manifest (`manifest.json`). Memory is
  bounded by a few chunks, whatever the corpus size.
- `PreparedCorpus.open(folder)` reads the manifest; a folder without one (a
  preparation that did not finish) is refused.
- `prepared_pairs(corpus)` streams the `(source_ids, target_ids)` pairs
  (interleaved shards, a bounded shuffle buffer, optionally only the shards
  of one of several processes), and `prepared_batches(corpus, tokens_per_batch)`
  batches them by tokens with the same code as `token_batches`.

The folder is written under a hidden temporary name next to `out` and renamed
to `out` once complete, so a preparation interrupted at any point leaves no
folder that a reader accepts; running it again starts afresh.

Example:
>>> import pathlib, tempfile
>>> import keras_transformer as kt
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> _ = (folder / "a.tsv").write_text("a dog runs .\\tein hund rennt .\\n" * 8)
>>> tokenizer = kt.train_tokenizer(["a dog runs .", "ein hund rennt ."] * 20, 40)
>>> corpus = prepare_corpus(folder / "a.tsv", None, folder / "data", tokenizer, max_length=16)
>>> corpus.pairs, PreparedCorpus.open(folder / "data").pairs
(8, 8)
>>> x, y, w = next(iter(prepared_batches(corpus, tokens_per_batch=64, bucket_width=8)))
>>> tuple(x["encoder_token_ids"].shape)
(8, 8)
"""

from __future__ import annotations  # annotations name TensorFlow types, which may be absent

import dataclasses
import hashlib
import itertools
import json
import os
import random
from collections.abc import Iterator
from pathlib import Path

from keras_transformer.training.data import ReadReport, bucket_batches, stream_parallel
from keras_transformer.utils.files import folder_replaced_atomically
from keras_transformer.utils.text_libraries import require_text_libraries, tf

MANIFEST_FILE = "manifest.json"
VOCABULARY_FILE = "vocabulary.spm"
FORMAT_VERSION = 1
# TFRecord: tf.data reads it natively (TFRecordDataset, interleaved over files,
# no Python in the training input loop), and it is the format tensor2tensor
# and the paper's own code prepared WMT into. One record holds a chunk of
# pairs as raw little-endian integers, so reading costs little per pair.
SHARD_PATTERN = "shard-{:05d}.tfrecord"
FIELDS = ("source_ids", "source_lengths", "target_ids", "target_lengths")


@dataclasses.dataclass
class PreparedCorpus:
    """A prepared folder, as its manifest describes it.

    Attributes:
        folder: the folder.
        max_length: the longest sequence, special tokens included, that the
            kept pairs fit (as `tokenize_pairs`' `max_length`).
        pairs: pairs kept.
        dropped: pairs dropped for being longer than `max_length`.
        source_tokens, target_tokens: tokens of the kept pairs, without
            special tokens.
        read: what reading the text files kept and skipped.
        tokenizer_sha256: SHA-256 of the vocabulary's SentencePiece proto.
        id_dtype: how token ids are stored (`"uint16"` or `"int32"`).
        shards: `{"file": name, "pairs": count}` of each shard, in corpus order.
        inputs: the text files it was prepared from.
    """

    folder: Path
    max_length: int
    pairs: int
    dropped: int
    source_tokens: int
    target_tokens: int
    read: ReadReport
    tokenizer_sha256: str
    id_dtype: str
    shards: list[dict]
    inputs: list[str]

    @classmethod
    def open(cls, folder: str | os.PathLike) -> PreparedCorpus:
        """Reads the manifest of a prepared folder.

        Raises:
            ValueError: the folder has no manifest (not a prepared corpus,
                or a preparation that did not finish), or one of another format.
        """
        folder = Path(folder)
        path = folder / MANIFEST_FILE
        if not path.is_file():
            raise ValueError(
                f"{folder} holds no {MANIFEST_FILE}: it is not a prepared corpus, or its preparation did not "
                "finish; prepare it (again) with keras-transformer prepare."
            )
        manifest = json.loads(path.read_text(encoding="utf-8"))
        if manifest.get("format") != FORMAT_VERSION:
            raise ValueError(
                f"{path} is of format {manifest.get('format')!r}; this version reads format {FORMAT_VERSION}: "
                "prepare the corpus again."
            )
        fields = {f.name for f in dataclasses.fields(cls)} - {"folder", "read"}
        return cls(folder=folder, read=ReadReport(**manifest["read"]), **{k: manifest[k] for k in fields})

    def tokenizer(self):
        """The `TransformerTokenizer` the corpus was tokenized with (its vocabulary file)."""
        from keras_transformer.models.transformer_tokenizer import TransformerTokenizer

        return TransformerTokenizer(proto=str(self.folder / VOCABULARY_FILE))

    def manifest(self) -> dict:
        fields = dataclasses.asdict(self)
        fields.pop("folder")
        return {"format": FORMAT_VERSION, **fields}

    def __str__(self) -> str:
        return (
            f"{self.pairs} pairs in {len(self.shards)} shards, {self.source_tokens} source and "
            f"{self.target_tokens} target tokens; {self.dropped} pairs longer than {self.max_length} tokens "
            f"dropped; reading: {self.read}"
        )


def tokenizer_checksum(tokenizer) -> str:
    """SHA-256 of a `TransformerTokenizer`'s SentencePiece proto."""
    return hashlib.sha256(tokenizer.proto).hexdigest()


def prepare_corpus(
    source: str | os.PathLike,
    target: str | os.PathLike | None,
    out: str | os.PathLike,
    tokenizer,
    max_length: int = 256,
    *,
    skip_bad: bool = False,
    chunk_size: int = 2048,
    pairs_per_shard: int = 100_000,
    overwrite: bool = False,
) -> PreparedCorpus:
    """Tokenizes a parallel corpus into a prepared folder, in one streaming pass.

    Args:
        source, target: as for `read_parallel`: two line-aligned files, or a
            TSV file and `None`.
        out: the folder to write; it must not exist, be empty, or (with
            `overwrite`) hold a prepared corpus.
        tokenizer: the shared `TransformerTokenizer`.
        max_length: as for `tokenize_pairs`: longer pairs are dropped and counted.
        skip_bad: as for `read_parallel`.
        chunk_size: pairs tokenized together, and stored in one record (at
            most `pairs_per_shard`).
        pairs_per_shard: about this many pairs per shard file (whole chunks);
            processes of a multi-host run read whole shards.
        overwrite: replace a prepared corpus in `out`.

    Returns:
        The `PreparedCorpus` written.

    Raises:
        ValueError: as `read_parallel` on a bad line (then nothing is written),
            or when `out` is not a folder this may write.
    """
    require_text_libraries("prepare_corpus")
    out = Path(out)
    _check_writable(out, overwrite)
    report = ReadReport()
    pairs = stream_parallel(source, target, report, skip_bad=skip_bad)
    chunks, failure = _text_chunks(pairs, min(chunk_size, pairs_per_shard))
    id_dtype = "uint16" if tokenizer.vocabulary_size() <= 2**16 else "int32"
    tokenized = (
        tf.data.Dataset.from_generator(chunks, output_signature=(tf.TensorSpec([None], tf.string),) * 2)
        .map(_chunk_tokenizer(tokenizer, max_length), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        .prefetch(2)
        .with_options(_all_cores())
    )
    with folder_replaced_atomically(out) as folder:
        shards, counts = _write_shards(tokenized.as_numpy_iterator(), folder, pairs_per_shard, id_dtype)
        if failure:
            raise failure[0]
        (folder / VOCABULARY_FILE).write_bytes(tokenizer.proto)
        corpus = PreparedCorpus(
            folder=out,
            max_length=max_length,
            read=report,
            tokenizer_sha256=tokenizer_checksum(tokenizer),
            id_dtype=id_dtype,
            shards=shards,
            inputs=[str(path) for path in (source, target) if path is not None],
            **counts,
        )
        # Last: a folder is a prepared corpus once its manifest exists.
        (folder / MANIFEST_FILE).write_text(json.dumps(corpus.manifest(), indent=2) + "\n", encoding="utf-8")
    return corpus


def _all_cores() -> tf.data.Options:
    """tf.data runs each op of a map on one thread by default; the tokenizer
    op splits a chunk over threads of its own when allowed to."""
    options = tf.data.Options()
    options.threading.max_intra_op_parallelism = os.cpu_count() or 1
    return options


def _check_writable(out: Path, overwrite: bool) -> None:
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    if not (out / MANIFEST_FILE).is_file():
        raise ValueError(f"{out} exists and is not a prepared corpus; choose another output folder.")
    if not overwrite:
        raise ValueError(f"{out} already holds a prepared corpus; pass overwrite=True (--overwrite) to replace it.")


def _text_chunks(pairs: Iterator[tuple[str, str]], chunk_size: int):
    """A generator function of `(sources, targets)` lists, and a list that receives its error.

    tf.data turns an exception inside a generator into its own error type;
    keeping it lets `prepare_corpus` raise `read_parallel`'s `ValueError` (or the `OSError`) itself.
    """
    failure = []

    def chunks():
        try:
            while chunk := list(itertools.islice(pairs, chunk_size)):
                sources, targets = zip(*chunk)
                yield list(sources), list(targets)
        except Exception as error:  # a bad line, an unreadable file
            failure.append(error)

    return chunks, failure


def _chunk_tokenizer(tokenizer, max_length: int):
    """Token ids of a chunk's kept pairs as flat values and lengths, and the count dropped."""

    def tokenize(sources, targets):
        source_ids, target_ids = (tf.cast(tokenizer(texts), "int32") for texts in (sources, targets))
        fits = tf.logical_and(source_ids.row_lengths() + 2 <= max_length, target_ids.row_lengths() + 1 <= max_length)
        source_ids, target_ids = (tf.ragged.boolean_mask(ids, fits) for ids in (source_ids, target_ids))
        dropped = tf.size(fits) - tf.reduce_sum(tf.cast(fits, "int32"))
        lengths = [tf.cast(ids.row_lengths(), "int32") for ids in (source_ids, target_ids)]
        return source_ids.flat_values, lengths[0], target_ids.flat_values, lengths[1], dropped

    return tokenize


def _write_shards(chunks, folder: Path, pairs_per_shard: int, id_dtype: str) -> tuple[list[dict], dict]:
    """Writes the tokenized chunks into shards; returns the shard list and the counts."""
    shards, counts = [], dict(pairs=0, dropped=0, source_tokens=0, target_tokens=0)
    writer = None
    try:
        for source_ids, source_lengths, target_ids, target_lengths, dropped in chunks:
            counts["dropped"] += int(dropped)
            if not len(source_lengths):
                continue
            if writer is None:
                shards.append({"file": SHARD_PATTERN.format(len(shards)), "pairs": 0})
                writer = tf.io.TFRecordWriter(str(folder / shards[-1]["file"]))
            writer.write(_record(source_ids, source_lengths, target_ids, target_lengths, id_dtype))
            shards[-1]["pairs"] += len(source_lengths)
            counts["pairs"] += len(source_lengths)
            counts["source_tokens"] += len(source_ids)
            counts["target_tokens"] += len(target_ids)
            if shards[-1]["pairs"] >= pairs_per_shard:
                writer.close()
                writer = None
    finally:
        if writer is not None:
            writer.close()
    return shards, counts


def _record(source_ids, source_lengths, target_ids, target_lengths, id_dtype: str) -> bytes:
    """One chunk as a serialized `tf.train.Example` of little-endian integer bytes."""
    arrays = (
        source_ids.astype(f"<{_NUMPY_DTYPES[id_dtype]}"),
        source_lengths.astype("<i4"),
        target_ids.astype(f"<{_NUMPY_DTYPES[id_dtype]}"),
        target_lengths.astype("<i4"),
    )
    feature = {
        name: tf.train.Feature(bytes_list=tf.train.BytesList(value=[array.tobytes()]))
        for name, array in zip(FIELDS, arrays)
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


_NUMPY_DTYPES = {"uint16": "u2", "int32": "i4"}


def sample_sentences(
    source: str | os.PathLike,
    target: str | os.PathLike | None,
    count: int,
    *,
    skip_bad: bool = False,
    seed: int = 0,
) -> list[str]:
    """At most `count` sentences of both sides drawn uniformly from the corpus, to train a vocabulary on.

    One streaming pass (reservoir sampling), holding only the sample; the
    lines are checked as `read_parallel` checks them.

    Raises:
        ValueError: as `read_parallel` on a bad line.
    """
    rng = random.Random(seed)
    sample = []
    pairs = stream_parallel(source, target, ReadReport(), skip_bad=skip_bad)
    for seen, sentence in enumerate(sentence for pair in pairs for sentence in pair):
        if seen < count:
            sample.append(sentence)
        elif (slot := rng.randrange(seen + 1)) < count:
            sample[slot] = sentence
    return sample


def prepared_pairs(
    corpus: PreparedCorpus,
    *,
    shuffle: bool = True,
    seed: int | None = None,
    shuffle_buffer: int = 100_000,
    repeat: bool = False,
    num_processes: int = 1,
    process_index: int = 0,
    cycle_length: int = 4,
) -> tf.data.Dataset:
    """The corpus's `(source_ids, target_ids)` pairs (int32, no special tokens), streamed.

    Shards are read `cycle_length` at a time, interleaved record by record,
    in an order shuffled each pass; pairs then go through a shuffle buffer
    of `shuffle_buffer` pairs, so memory does not grow with the corpus.
    Without shuffling, pairs come in corpus order. With `repeat`, each pass
    is one whole epoch (every pair once) before the next begins.

    Args:
        corpus: a `PreparedCorpus`.
        shuffle: shuffle the shard order and the pairs, anew each pass.
        seed: the shuffle seed (the same seed gives the same order).
        shuffle_buffer: pairs in the shuffle buffer.
        repeat: repeat forever, for step-based training.
        num_processes, process_index: read only the shards of this process
            (every `num_processes`-th shard from `process_index`): the
            processes together read every pair once per pass.
        cycle_length: shards read at the same time.

    Raises:
        ValueError: more processes than shards, or a bad `process_index`.
    """
    require_text_libraries("prepared_pairs")
    if not 0 <= process_index < num_processes:
        raise ValueError(f"process_index must be in [0, {num_processes}); got {process_index}.")
    if num_processes > len(corpus.shards):
        raise ValueError(
            f"{corpus.folder} has {len(corpus.shards)} shards, fewer than the {num_processes} processes "
            "that each read their own; prepare it with fewer pairs per shard (--pairs-per-shard)."
        )
    files = [str(corpus.folder / shard["file"]) for shard in corpus.shards]
    dataset = tf.data.Dataset.from_tensor_slices(files).shard(num_processes, process_index)
    if shuffle:
        dataset = dataset.shuffle(len(files), seed=seed)
    dataset = dataset.interleave(
        tf.data.TFRecordDataset,
        cycle_length=cycle_length if shuffle else 1,
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    dataset = dataset.map(_record_parser(corpus.id_dtype), num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.flat_map(lambda sources, targets: tf.data.Dataset.from_tensor_slices((sources, targets)))
    if shuffle:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed)
    return dataset.repeat() if repeat else dataset


def _record_parser(id_dtype: str):
    features = {name: tf.io.FixedLenFeature([], tf.string) for name in FIELDS}

    def parse(record):
        parsed = tf.io.parse_single_example(record, features)

        def side(name):
            ids = tf.cast(tf.io.decode_raw(parsed[f"{name}_ids"], id_dtype, little_endian=True), "int32")
            lengths = tf.io.decode_raw(parsed[f"{name}_lengths"], "int32", little_endian=True)
            return tf.RaggedTensor.from_row_lengths(ids, tf.cast(lengths, "int64"), validate=False)

        return side("source"), side("target")

    return parse


def prepared_batches(
    corpus: PreparedCorpus,
    tokens_per_batch: int,
    *,
    bucket_width: int = 8,
    shuffle: bool = True,
    repeat: bool = False,
    seed: int | None = None,
    shuffle_buffer: int = 100_000,
    batch_multiple: int = 1,
    drop_remainder: bool = False,
    num_processes: int = 1,
    process_index: int = 0,
) -> tf.data.Dataset:
    """`token_batches` of a prepared corpus, streamed from its shards.

    The arguments are `token_batches`' and `prepared_pairs`'; the batches
    are laid out as `token_batches` lays them out.
    """
    pairs = prepared_pairs(
        corpus,
        shuffle=shuffle,
        seed=seed,
        shuffle_buffer=shuffle_buffer,
        repeat=repeat,
        num_processes=num_processes,
        process_index=process_index,
    )
    return bucket_batches(
        pairs,
        corpus.max_length,
        tokens_per_batch,
        bucket_width=bucket_width,
        batch_multiple=batch_multiple,
        drop_remainder=drop_remainder,
    )
