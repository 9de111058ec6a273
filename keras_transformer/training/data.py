"""Batching parallel text by tokens for training.

The pieces, from files to model-ready batches:

- `keras_transformer.training.parallel_text.read_parallel` reads the files.
- `tokenize_pairs(sources, targets, tokenizer, max_length)` tokenizes both
  sides with the shared `TransformerTokenizer` in a `tf.data` pipeline and
  drops (and counts) pairs too long for the model, never cutting them.
- `token_batches(pairs, tokens_per_batch)` is the `tf.data` pipeline of
  section 5.1: pairs grouped by length into buckets, batches of about
  `tokens_per_batch` source and as many target tokens, shuffled, repeated and
  prefetched, as `(x, y, sample_weight)` laid out like
  `TransformerPreprocessor`'s output.
- `bucket_batches` is the same bucketing
  one pair at a time, for corpora prepared on disk
  (`keras_transformer.training.shards_reading`).

Example:
>>> import keras_transformer as kt
>>> tokenizer = kt.train_tokenizer(["a dog runs .", "ein hund rennt ."] * 20, 40)
>>> pairs = tokenize_pairs(["a dog runs ."] * 8, ["ein hund rennt ."] * 8, tokenizer, max_length=16)
>>> x, y, w = next(iter(token_batches(pairs, tokens_per_batch=64, bucket_width=8)))
>>> tuple(x["encoder_token_ids"].shape)
(8, 8)
"""

from __future__ import annotations  # annotations name TensorFlow types, which may be absent

import dataclasses
import warnings

from keras_transformer.utils.special_tokens import END_ID, PAD_ID, START_ID
from keras_transformer.utils.text_libraries import require_text_libraries, tf


@dataclasses.dataclass
class TokenizedPairs:
    """Token ids of sentence pairs (no special tokens) and what was dropped.

    Attributes:
        sources, targets: `tf.RaggedTensor`s of shape `(pairs, None)`.
        max_length: the longest padded sequence allowed, special tokens
            included.
        dropped: pairs dropped because one side was longer than that.
    """

    sources: tf.RaggedTensor
    targets: tf.RaggedTensor
    max_length: int
    dropped: int

    def __len__(self) -> int:
        return int(self.sources.nrows())

    def num_tokens(self) -> tuple[int, int]:
        """Source and target tokens, with `<s>`/`</s>` as the model sees them."""
        return (
            int(tf.size(self.sources.flat_values)) + 2 * len(self),
            int(tf.size(self.targets.flat_values)) + len(self),
        )


def fits_max_length(source_lengths, target_lengths, max_length: int):
    """Which pairs of these token counts (NumPy arrays or tensors) fit
    `max_length` with the special tokens packing adds: <s> and </s> around a
    source, one of them before or after a target."""
    return (source_lengths + 2 <= max_length) & (target_lengths + 1 <= max_length)


def tokenize_pairs(
    sources: list[str],
    targets: list[str],
    tokenizer,
    max_length: int = 256,
    *,
    chunk_size: int = 4096,
) -> TokenizedPairs:
    """Tokenizes sentence pairs and drops, and counts, the too long ones.

    A pair is kept when the source with `<s>` and `</s>` and the target with
    one of them (decoder inputs and labels are shifted by one) both fit in
    `max_length`. Cutting a sentence would teach the model to stop
    translating early, so long pairs are dropped, with a warning that says how
    many.

    Args:
        sources, targets: line-aligned sentences.
        tokenizer: the shared `TransformerTokenizer`.
        max_length: the longest sequence, special tokens included; at most the
            backbone's `max_sequence_length`.
        chunk_size: sentences tokenized together.

    Returns:
        A `TokenizedPairs`.
    """
    require_text_libraries("tokenize_pairs")
    if len(sources) != len(targets):
        raise ValueError(f"Got {len(sources)} source and {len(targets)} target sentences.")

    def tokenize(texts):
        if not texts:
            return tf.ragged.constant([], dtype="int32", ragged_rank=1)
        chunks = (
            tf.data.Dataset.from_tensor_slices(texts)
            .batch(chunk_size)
            .map(tokenizer, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        )
        return tf.concat([tf.cast(c, "int32") for c in chunks], axis=0)

    source_ids, target_ids = tokenize(list(sources)), tokenize(list(targets))
    fits = fits_max_length(source_ids.row_lengths(), target_ids.row_lengths(), max_length)
    dropped = len(sources) - int(tf.reduce_sum(tf.cast(fits, "int32")))
    if dropped:
        warnings.warn(
            f"Dropped {dropped} of {len(sources)} sentence pairs longer than "
            f"{max_length} tokens (special tokens included).",
            stacklevel=2,
        )
    return TokenizedPairs(
        tf.ragged.boolean_mask(source_ids, fits),
        tf.ragged.boolean_mask(target_ids, fits),
        max_length,
        dropped,
    )


def bucket_lengths(max_length: int, bucket_width: int) -> list[int]:
    """The padded lengths of the buckets: multiples of `bucket_width`."""
    return list(range(bucket_width, max_length + bucket_width, bucket_width))


def token_batches(
    pairs: TokenizedPairs,
    tokens_per_batch: int,
    *,
    bucket_width: int = 8,
    shuffle: bool = True,
    repeat: bool = False,
    seed: int | None = None,
    shuffle_buffer: int = 100_000,
    batch_multiple: int = 1,
    drop_remainder: bool = False,
) -> tf.data.Dataset:
    """Batches of about `tokens_per_batch` source and target tokens each.

    Section 5.1: "Sentence pairs were batched together by approximate sequence
    length. Each training batch contained a set of sentence pairs containing
    approximately 25000 source tokens and 25000 target tokens." Pairs go into
    buckets by their longer side; a bucket padded to length `L` is batched
    `tokens_per_batch // L` pairs at a time, so a batch holds at most
    `tokens_per_batch` source and as many target positions, little of it
    padding. Every batch is padded to its bucket's length (a multiple of
    `bucket_width`), so there are only `max_length / bucket_width` sequence
    shapes and compiled training steps are reused.

    Args:
        pairs: from `tokenize_pairs`.
        tokens_per_batch: N, the source (and target) positions per batch.
        bucket_width: the step between bucket lengths.
        shuffle: shuffle pairs (and so batches) each pass.
        repeat: repeat forever, for step-based training.
        seed: shuffle seed.
        shuffle_buffer: pairs in the shuffle buffer.
        batch_multiple: make every batch size a multiple of this, e.g. the
            number of devices that split each batch.
        drop_remainder: drop each bucket's last, smaller batch of a pass, so
            that every batch size is a multiple of `batch_multiple`.

    Returns:
        A `tf.data.Dataset` of `(x, y, sample_weight)`: `x` has
        `encoder_token_ids` (`<s> source </s>`), `encoder_padding_mask`,
        `decoder_token_ids` (`<s> target`) and `decoder_padding_mask`; `y` is
        `target </s>`; `sample_weight` is 1 on real target tokens, 0 on padding.
    """
    require_text_libraries("token_batches")
    dataset = tf.data.Dataset.from_tensor_slices((pairs.sources, pairs.targets))
    if shuffle:
        dataset = dataset.shuffle(min(len(pairs), shuffle_buffer) or 1, seed=seed)
    if repeat:
        dataset = dataset.repeat()
    return bucket_batches(
        dataset,
        pairs.max_length,
        tokens_per_batch,
        bucket_width=bucket_width,
        batch_multiple=batch_multiple,
        drop_remainder=drop_remainder,
    )


def check_tokens_per_batch(tokens_per_batch: int, max_length: int, bucket_width: int, batch_multiple: int) -> None:
    """Raises a `ValueError` if the longest bucket cannot hold `batch_multiple` pairs."""
    longest = bucket_lengths(max_length, bucket_width)[-1]
    if tokens_per_batch < longest * batch_multiple:
        raise ValueError(
            f"tokens_per_batch={tokens_per_batch} cannot hold even {batch_multiple} pair(s) "
            f"of the longest bucket ({longest} tokens); raise it or lower max_length."
        )


def bucket_batches(
    dataset: tf.data.Dataset,
    max_length: int,
    tokens_per_batch: int,
    *,
    bucket_width: int = 8,
    batch_multiple: int = 1,
    drop_remainder: bool = False,
) -> tf.data.Dataset:
    """`token_batches`' bucketing of a dataset of `(source_ids, target_ids)` pairs.

    The pairs (int32 token ids without special tokens, each fitting
    `max_length` as `tokenize_pairs` keeps them) come in the order they will
    be batched: shuffling and repeating are the caller's, so that pairs held
    in memory and pairs streamed from disk are batched by the same code.
    The arguments and the batches are those of `token_batches`.
    """
    check_tokens_per_batch(tokens_per_batch, max_length, bucket_width, batch_multiple)
    lengths = bucket_lengths(max_length, bucket_width)
    batch_sizes = [tokens_per_batch // length // batch_multiple * batch_multiple for length in lengths]

    def pack(source, target):
        start, end = tf.constant([START_ID]), tf.constant([END_ID])
        return {
            "encoder_token_ids": tf.concat([start, source, end], 0),
            "decoder_token_ids": tf.concat([start, target], 0),
            "labels": tf.concat([target, end], 0),
        }

    dataset = dataset.map(pack, num_parallel_calls=tf.data.AUTOTUNE)
    # bucket_by_sequence_length puts length l in bucket i when
    # boundaries[i-1] <= l < boundaries[i] and pads every sequence of the
    # batch to boundaries[i] - 1, one of `lengths`.
    dataset = dataset.bucket_by_sequence_length(
        element_length_func=lambda e: tf.maximum(tf.shape(e["encoder_token_ids"])[0], tf.shape(e["labels"])[0]),
        bucket_boundaries=[length + 1 for length in lengths],
        bucket_batch_sizes=batch_sizes + [batch_multiple],
        padding_values=PAD_ID,
        pad_to_bucket_boundary=True,
        drop_remainder=drop_remainder,
    )
    dataset = dataset.map(_to_model_inputs, num_parallel_calls=tf.data.AUTOTUNE)
    return without_autotuning(dataset.prefetch(2))


def without_autotuning(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset` with tf.data's autotuner off.

    The autotuner's background thread competes with the training step for
    the CPU, which slows training on a machine with few cores.
    Padding a few hundred short rows per batch needs no tuning.
    """
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def weight_by_update(dataset: tf.data.Dataset, micro_batches: int) -> tf.data.Dataset:
    """Token weights for gradient accumulation over `micro_batches` batches.

    With `gradient_accumulation_steps=K`, Keras averages the gradients of K
    micro-batches, each of its own token mean: an update is then the mean of
    K means, which over-weights the tokens of short micro-batches. Here each
    group of K consecutive batches gets the sample weights `K / T` on its
    real target tokens (T: real target tokens in the whole group), and a loss
    with `reduction="sum"` then gives micro-batch gradients whose average is
    exactly the gradient of the token mean over all K batches, as one batch
    of all their tokens would. (`keras_transformer.training.distribution.GlobalTokenMean`
    does the same across replicas.) A last incomplete group is dropped.

    The sample weights may be boolean or integer, as the preprocessors' padding
    masks are: the new weights are float32.
    """

    def reweight(x, y, weights):
        weights = weights.map(lambda w: tf.cast(w, "float32"))
        total = weights.reduce(0.0, lambda sum_, w: sum_ + tf.reduce_sum(w))
        scale = micro_batches / total
        return tf.data.Dataset.zip((x, y, weights)).map(lambda x, y, w: (x, y, w * scale))

    return dataset.window(micro_batches, drop_remainder=True).flat_map(reweight)


def with_batch_count(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset` with its number of batches known, counted in one pass.

    Bucketing hides the number of batches from Keras, which then warns that a
    finite dataset (e.g. validation batches) "ran out of data".
    """
    batches = int(dataset.reduce(0, lambda count, _: count + 1))
    return dataset.apply(tf.data.experimental.assert_cardinality(batches))


def _to_model_inputs(batch):
    encoder, decoder, labels = (batch[k] for k in ("encoder_token_ids", "decoder_token_ids", "labels"))
    x = {
        "encoder_token_ids": encoder,
        "encoder_padding_mask": encoder != PAD_ID,
        "decoder_token_ids": decoder,
        "decoder_padding_mask": decoder != PAD_ID,
    }
    return x, labels, tf.cast(labels != PAD_ID, "float32")
