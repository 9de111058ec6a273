"""Parallel corpora tokenized once into sharded files, streamed from disk while training.

`keras-transformer train --src --tgt` holds every pair in memory and
tokenizes the corpus at each start; at the paper's scale (WMT 2014, millions
of pairs) that takes more memory than a training host has. A corpus that
`keras_transformer.training.shards_writing.prepare_corpus` wrote is read here:

- `PreparedCorpus.open(folder)` reads the manifest; a folder without one (a
  preparation that did not finish) is refused.
- `prepared_pairs(corpus)` streams the `(source_ids, target_ids)` pairs
  (interleaved shards, a bounded shuffle buffer, optionally only the share
  of one of several processes), and `prepared_batches(corpus, tokens_per_batch)`
  batches them by tokens with the same code as `token_batches`.

Example:
>>> import pathlib, tempfile
>>> import keras_transformer as kt
>>> from keras_transformer.training.shards_writing import prepare_corpus
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> _ = (folder / "a.tsv").write_text("a dog runs .\\tein hund rennt .\\n" * 8)
>>> tokenizer = kt.train_tokenizer(["a dog runs .", "ein hund rennt ."] * 20, 40)
>>> corpus = prepare_corpus(folder / "a.tsv", None, folder / "data", tokenizer, max_length=16)
>>> x, y, w = next(iter(prepared_batches(corpus, tokens_per_batch=64, bucket_width=8)))
>>> tuple(x["encoder_token_ids"].shape)
(8, 8)
"""

from __future__ import annotations  # annotations name TensorFlow types, which may be absent

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import numpy as np

from keras_transformer.training.data import bucket_batches
from keras_transformer.training.parallel_text import ReadReport
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

    Shards are read `cycle_length` at a time, interleaved pair by pair, in
    an order shuffled each pass; pairs then go through a shuffle buffer of
    `shuffle_buffer` pairs, so memory does not grow with the corpus. Without
    shuffling, pairs come in corpus order. With `repeat`, each pass is one
    whole epoch (every pair once) before the next begins.

    Of several processes, each keeps every `num_processes`-th pair of the
    corpus from its `process_index` (by the pair's place in the corpus, so
    whatever order each process reads its shards in): every process gets the
    same number of pairs (give or take one), and together they read every
    pair once per pass, whatever the number of shards. Shards split among the
    processes would give them unequal shares, which a process of a
    step-based run would repeat more often than the others. Each process
    reads every shard: token ids stored as raw integers cost little to read
    next to a training step.

    Args:
        corpus: a `PreparedCorpus`.
        shuffle: shuffle the shard order and the pairs, anew each pass.
        seed: the shuffle seed (the same seed gives the same order).
        shuffle_buffer: pairs in the shuffle buffer.
        repeat: repeat forever, for step-based training.
        num_processes, process_index: keep only this process's share.
        cycle_length: shards read at the same time.

    Raises:
        ValueError: a bad `process_index`.
    """
    require_text_libraries("prepared_pairs")
    if not 0 <= process_index < num_processes:
        raise ValueError(f"process_index must be in [0, {num_processes}); got {process_index}.")
    files = [str(corpus.folder / shard["file"]) for shard in corpus.shards]
    first_pairs = np.cumsum([0] + [shard["pairs"] for shard in corpus.shards[:-1]], dtype="int64")
    parse = _record_parser(corpus.id_dtype)

    def pairs_of_shard(file, first_pair):
        records = tf.data.TFRecordDataset(file).map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        pairs = records.flat_map(lambda sources, targets: tf.data.Dataset.from_tensor_slices((sources, targets)))
        if num_processes == 1:
            return pairs
        ours = pairs.enumerate(first_pair).filter(lambda index, _: index % num_processes == process_index)
        return ours.map(lambda _, pair: pair)

    dataset = tf.data.Dataset.from_tensor_slices((files, first_pairs))
    if shuffle:
        dataset = dataset.shuffle(len(files), seed=seed)
    dataset = dataset.interleave(
        pairs_of_shard,
        cycle_length=cycle_length if shuffle else 1,
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
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
