"""One loaded model as the server runs it: texts to sentences, batches of sentences to translations.

A compiled search is specialised to its input shape, and compiling one takes
far longer than decoding a batch. So the server decodes only a fixed set of
shapes, all compiled before it reports ready (`warm_up`):

- source widths in `length_buckets` (multiples of `LENGTH_BUCKET`, the width
  `translate` pads to, up to `max_source_bucket`); a longer text is cut into sentences
  that fit, as `translate(too_long="split")` cuts;
- batch sizes in `batch_sizes` (powers of two up to `max_batch_size`, fewer
  rows for wide buckets so that no batch holds more than `max_batch_tokens`
  source positions); a batch is filled up to the next of these with copies of
  its longest row, as `translate` fills its last batch.

Example:
>>> import keras_transformer as kt
>>> engine = ModelEngine(kt.Transformer.from_preset("multi30k_en_de"), max_batch_size=8, max_source_bucket=32)
>>> engine.length_buckets, engine.batch_sizes
((16, 32), (1, 2, 4, 8))
>>> segments = engine.segments(["Two dogs play in the snow."])
>>> engine.translate_rows([ids for _, ids in segments])
['Zwei Hunde spielen im Schnee.']
"""

from collections.abc import Callable

import numpy as np

from keras_transformer.generation.settings import LENGTH_BUCKET, SearchSettings, bucketed
from keras_transformer.generation.translation import source_segments
from keras_transformer.models.transformer_preprocessor import SOURCE_SPECIAL_ROOM


class ModelEngine:
    """A `Transformer` behind the server's batcher.

    Args:
        model: a `Transformer` with a preprocessor.
        search: the search every request gets (default: the model's own,
            section 6.1's beam search).
        max_batch_size: the most sentences decoded together.
        max_batch_tokens: the most source positions (padding included) in one batch.
        max_source_bucket: the widest source the server compiles a search
            for; longer texts are cut into sentences that fit.
        name: the name `/languages` and the logs give the model.
    """

    def __init__(
        self,
        model,
        *,
        search: SearchSettings | None = None,
        max_batch_size: int = 32,
        max_batch_tokens: int = 2048,
        max_source_bucket: int = 64,
        name: str = "model",
    ):
        if model.preprocessor is None:
            raise ValueError("The server translates text: give it a model with a preprocessor.")
        if max_batch_size < 1 or max_batch_tokens < 1:
            raise ValueError(
                f"max_batch_size and max_batch_tokens must be positive; got {max_batch_size} and {max_batch_tokens}."
            )
        self.model = model
        self.name = name
        self.search = search or model.default_search
        widest = min(max_source_bucket, model.max_source_tokens + SOURCE_SPECIAL_ROOM)
        self.length_buckets = tuple(range(LENGTH_BUCKET, widest + 1, LENGTH_BUCKET))
        if not self.length_buckets:
            raise ValueError(
                f"max_source_bucket={max_source_bucket} leaves no source width: give at least {LENGTH_BUCKET}."
            )
        self.max_batch_tokens = max_batch_tokens
        self.batch_sizes = tuple(size for size in _powers_of_two(max_batch_size))
        self.max_sentence_tokens = self.length_buckets[-1] - SOURCE_SPECIAL_ROOM

    def target_languages(self) -> list[str]:
        """The ISO 639-3 names of a multilingual model's `>>xxx<<` tokens (none for others)."""
        return self.model.preprocessor.tokenizer.target_languages()

    def segments(self, texts: list[str], target_language: str | None = None) -> list[tuple[int, list[int]]]:
        """`(text index, token ids)` of each sentence to decode (see `source_segments`)."""
        return source_segments(self.model, texts, target_language=target_language, max_tokens=self.max_sentence_tokens)

    def bucket_of(self, row: list[int]) -> int:
        """The source width a sentence of these token ids is decoded at."""
        return bucketed(len(row) + SOURCE_SPECIAL_ROOM)

    def rows_per_batch(self, bucket: int) -> int:
        """The most sentences of `bucket`'s width decoded together."""
        fitting = [size for size in self.batch_sizes if size * bucket <= self.max_batch_tokens]
        return fitting[-1] if fitting else 1

    def shapes(self) -> list[tuple[int, int]]:
        """Every `(batch size, source width)` the server decodes."""
        return [
            (size, bucket)
            for bucket in self.length_buckets
            for size in self.batch_sizes
            if size <= self.rows_per_batch(bucket)
        ]

    @property
    def max_alternatives(self) -> int:
        """The most alternative translations of a sentence: the other hypotheses of its beam."""
        return (self.search.beam_size or 1) - 1

    def translate_rows(self, rows: list[list[int]], num_hypotheses: int = 1) -> list:
        """Translations of sentences of one bucket, at most `rows_per_batch` of
        them; with `num_hypotheses` > 1, each sentence's n best (a list, best
        first; see `Transformer.generate`)."""
        size = next(size for size in self.batch_sizes if size >= len(rows))
        longest = max(rows, key=len)
        packed = self.model.preprocessor.pack_sources(rows + [longest] * (size - len(rows)))
        return self.model.generate(packed, search=self.search, num_hypotheses=num_hypotheses)[: len(rows)]

    def warm_up(self, on_shape: Callable[[int, int], None] | None = None) -> None:
        """Compiles the search of every shape in `shapes()` (calling
        `on_shape(done, total)` after each), so that no request waits on a compiler."""
        shapes = self.shapes()
        for done, (size, bucket) in enumerate(shapes, 1):
            token_ids = np.ones((size, bucket), "int32")
            self.model.compile_searches(
                {"encoder_token_ids": token_ids, "encoder_padding_mask": np.ones_like(token_ids, bool)},
                search=self.search,
            )
            if on_shape is not None:
                on_shape(done, len(shapes))


def _powers_of_two(limit: int) -> list[int]:
    """1, 2, 4, ... up to `limit`, and `limit` itself."""
    sizes = [1 << power for power in range(limit.bit_length()) if 1 << power < limit]
    return sizes + [limit]
