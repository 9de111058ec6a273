"""Tokenizing a parallel corpus once into sharded files (`keras-transformer prepare`).

`prepare_corpus(source, target, out, tokenizer, max_length)` reads the pair
files in one streaming pass (with `read_parallel`'s checks and counts: it is
`stream_parallel`), tokenizes them a chunk at a time, drops (and counts)
pairs too long for `max_length` as `tokenize_pairs` does, and writes the
token ids into sharded TFRecord files, the vocabulary, and last a manifest
(`manifest.json`). Memory is bounded by a chunk, whatever the corpus size.
`keras_transformer.training.shards_reading` reads the folder back.

A chunk is tokenized by the tokenizer's own `tokenize` on a Python list,
outside TensorFlow: KerasHub then encodes it with the `sentencepiece`
package, a batch on every core: the same model and the same ids as the
TensorFlow op that `tf.data` pipelines run, and faster.

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
"""

from __future__ import annotations  # annotations name TensorFlow types, which may be absent

import itertools
import json
import os
import random
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from keras_transformer.training.data import fits_max_length
from keras_transformer.training.parallel_text import ReadReport, stream_parallel
from keras_transformer.training.shards_reading import (
    FIELDS,
    MANIFEST_FILE,
    SHARD_PATTERN,
    VOCABULARY_FILE,
    PreparedCorpus,
    tokenizer_checksum,
)
from keras_transformer.utils.files import folder_replaced_atomically
from keras_transformer.utils.text_libraries import require_text_libraries, tf


def prepare_corpus(
    source: str | os.PathLike | Iterable[dict],
    target: str | os.PathLike | None,
    out: str | os.PathLike,
    tokenizer,
    max_length: int = 256,
    *,
    skip_bad: bool = False,
    chunk_size: int = 2048,
    pairs_per_shard: int = 100_000,
    overwrite: bool = False,
    languages: tuple[str, str] | None = None,
) -> PreparedCorpus:
    """Tokenizes a parallel corpus into a prepared folder, in one streaming pass.

    Args:
        source, target: as for `read_parallel`: two line-aligned files, or a
            TSV file and `None`; or a Hugging Face `datasets.Dataset` of
            translation pairs (rows `{"translation": {"en": ..., "de": ...}}`,
            as WMT14 is published) and `None`, with `languages`.
        out: the folder to write; it must not exist, be empty, or (with
            `overwrite`) hold a prepared corpus.
        tokenizer: the shared `TransformerTokenizer`.
        max_length: as for `tokenize_pairs`: longer pairs are dropped and counted.
        skip_bad: as for `read_parallel`.
        chunk_size: pairs tokenized together, and stored in one record (at
            most `pairs_per_shard`).
        pairs_per_shard: about this many pairs per shard file (whole chunks).
        overwrite: replace a prepared corpus in `out`.
        languages: `(source, target)` language codes of a `datasets.Dataset`
            source, e.g. `("en", "de")`.

    Returns:
        The `PreparedCorpus` written.

    Raises:
        ValueError: as `read_parallel` on a bad line (then nothing is written),
            when `out` is not a folder this may write, or when `chunk_size`
            or `pairs_per_shard` is below 1.
    """
    require_text_libraries("prepare_corpus")
    for name, value in (("chunk_size", chunk_size), ("pairs_per_shard", pairs_per_shard)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number of pairs, at least 1; got {value!r}.")
    out = Path(out)
    _check_writable(out, overwrite)
    report = ReadReport()
    if languages is None:
        pairs = stream_parallel(source, target, report, skip_bad=skip_bad)
        inputs = [str(path) for path in (source, target) if path is not None]
    else:
        pairs = _translation_pairs(source, languages, report, skip_bad)
        inputs = [f"{getattr(source.info, 'dataset_name', None) or 'a datasets.Dataset'} ({'-'.join(languages)})"]
    chunk_size = min(chunk_size, pairs_per_shard)
    tokenized = (_tokenized_chunk(tokenizer, chunk, max_length) for chunk in _chunks(pairs, chunk_size))
    id_dtype = "uint16" if tokenizer.vocabulary_size() <= 2**16 else "int32"
    with folder_replaced_atomically(out) as folder:
        shards, counts = _write_shards(tokenized, folder, pairs_per_shard, id_dtype)
        (folder / VOCABULARY_FILE).write_bytes(tokenizer.proto)
        corpus = PreparedCorpus(
            folder=out,
            max_length=max_length,
            read=report,
            tokenizer_sha256=tokenizer_checksum(tokenizer),
            id_dtype=id_dtype,
            shards=shards,
            inputs=inputs,
            **counts,
        )
        # Last: a folder is a prepared corpus once its manifest exists.
        (folder / MANIFEST_FILE).write_text(json.dumps(corpus.manifest(), indent=2) + "\n", encoding="utf-8")
    return corpus


def _translation_pairs(dataset, languages: tuple[str, str], report: ReadReport, skip_bad: bool):
    """The `(source, target)` sentences of a Hugging Face dataset's `translation` rows, checked as lines are.

    The dataset is read row by row (Arrow files, memory-mapped): nothing here
    imports `datasets`, which the library does not depend on.
    """
    for number, row in enumerate(dataset, start=1):
        pair = tuple(row["translation"][language] for language in languages)
        if not all(side.strip() for side in pair):
            if not skip_bad:
                raise ValueError(
                    f"row {number}: empty sentence. Remove the pair, "
                    "or pass skip_bad=True (--skip-bad) to skip and count such rows."
                )
            report.empty += 1
            continue
        report.pairs += 1
        yield pair


def _check_writable(out: Path, overwrite: bool) -> None:
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    if not (out / MANIFEST_FILE).is_file():
        raise ValueError(f"{out} exists and is not a prepared corpus; choose another output folder.")
    if not overwrite:
        raise ValueError(f"{out} already holds a prepared corpus; pass overwrite=True (--overwrite) to replace it.")


def _chunks(pairs: Iterator[tuple[str, str]], chunk_size: int) -> Iterator[tuple[list[str], list[str]]]:
    """`(sources, targets)` lists of at most `chunk_size` pairs."""
    while chunk := list(itertools.islice(pairs, chunk_size)):
        sources, targets = zip(*chunk)
        yield list(sources), list(targets)


def _tokenized_chunk(tokenizer, chunk: tuple[list[str], list[str]], max_length: int) -> tuple:
    """Token ids of a chunk's kept pairs as flat values and lengths, and the count dropped."""
    (source_ids, source_lengths), (target_ids, target_lengths) = (_id_rows(tokenizer, texts) for texts in chunk)
    fits = fits_max_length(source_lengths, target_lengths, max_length)
    dropped = len(fits) - int(fits.sum())
    if dropped:
        source_ids = source_ids[np.repeat(fits, source_lengths)]
        target_ids = target_ids[np.repeat(fits, target_lengths)]
        source_lengths, target_lengths = source_lengths[fits], target_lengths[fits]
    return source_ids, source_lengths, target_ids, target_lengths, dropped


def _id_rows(tokenizer, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The token ids of `texts`, flat, and each text's count of them."""
    ids = tokenizer.tokenize(texts)
    if isinstance(ids, list):  # KerasHub's Python path: a list of id lists
        lengths = np.fromiter(map(len, ids), "int32", len(ids))
        return np.fromiter(itertools.chain.from_iterable(ids), "int32", int(lengths.sum())), lengths
    # A tokenizer that KerasHub keeps on its TensorFlow path: a `tf.RaggedTensor`.
    return ids.flat_values.numpy().astype("int32"), ids.row_lengths().numpy().astype("int32")


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
