"""One loaded model as the server runs it: texts to sentences, batches of sentences to translations.

Compiling a search of one shape takes far longer than decoding a batch, so
the server decodes a fixed set of shapes, each compiled once
(`keras_transformer.server.programs`):

- source widths `length_buckets`: `LENGTH_BUCKET`, then twice the last, up to
  `max_source_bucket`. Texts are cut into sentences as `translate` cuts them,
  and a longer sentence into pieces that fit.
- batch sizes `batch_sizes`: 1, 4, 16, ... up to `max_batch_size`, fewer rows
  for wide buckets (at most `max_batch_tokens` source positions). A batch is
  filled up to the next size with copies of its longest row.

`warm_up` compiles one batch size per width, enough to translate anything;
`warm_up_later` the larger sizes, after the server reports ready. Once
warming up has begun, batches are only of compiled sizes: no request waits
for a compiler.

Example:
>>> import keras_transformer as kt
>>> engine = ModelEngine(kt.Transformer.from_preset("multi30k_en_de"), max_batch_size=8, max_source_bucket=32)
>>> engine.length_buckets, engine.batch_sizes
((16, 32), (1, 4, 8))
>>> engine.warm_up()
>>> engine.rows_per_batch(16)  # the larger sizes are not compiled yet
1
>>> segments = engine.segments(["Two dogs play in the snow. A man rides a bike."], source_language="en")
>>> engine.translate_rows([segment.token_ids for segment in segments])
['Zwei Hunde spielen im Schnee.', 'Ein Mann fährt Fahrrad.']
"""

from collections.abc import Callable

from keras_transformer.generation.settings import LENGTH_BUCKET, SearchSettings, bucketed
from keras_transformer.generation.translation import Segment, source_segments
from keras_transformer.models.transformer_preprocessor import SOURCE_SPECIAL_ROOM
from keras_transformer.server.programs import SearchPrograms
from keras_transformer.utils.language_tags import language_tag
from keras_transformer.utils.memory import release_freed_memory


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
        split_sentences: translate each sentence of a text on its own (the
            default), or each text whole (for a model trained on lines of
            several sentences).
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
        split_sentences: bool = True,
    ):
        if model.preprocessor is None:
            raise ValueError("The server translates text: give it a model with a preprocessor.")
        if max_batch_size < 1 or max_batch_tokens < 1:
            raise ValueError(
                f"max_batch_size and max_batch_tokens must be positive; got {max_batch_size} and {max_batch_tokens}."
            )
        self.model = model
        self.name = name
        self.split_sentences = split_sentences
        self.search = search or model.default_search
        widest = min(max_source_bucket, model.max_source_tokens + SOURCE_SPECIAL_ROOM)
        self.length_buckets = _doubling_widths(widest)
        if not self.length_buckets:
            raise ValueError(
                f"max_source_bucket={max_source_bucket} leaves no source width: give at least {LENGTH_BUCKET}."
            )
        self.max_batch_tokens = max_batch_tokens
        self.batch_sizes = _powers_of_four(max_batch_size)
        self.max_sentence_tokens = self.length_buckets[-1] - SOURCE_SPECIAL_ROOM
        self.programs = SearchPrograms(model, self.search)
        self._compiled_sizes_only = False  # set by warm_up: from then on no batch waits for a compiler

    def target_languages(self) -> list[str]:
        """The ISO 639-3 names of a multilingual model's `>>xxx<<` tokens (none for others)."""
        return self.model.preprocessor.tokenizer.target_languages()

    def segments(
        self, texts: list[str], target_language: str | None = None, source_language: str | None = None
    ) -> list[Segment]:
        """The `Segment`s (sentences, with the spacing between them) to decode
        of `texts`, in `source_language` (see `source_segments`).

        The target's token (`target_language`, or the one the tokenizer fixes)
        leads every text, so that a text's own leading `>>...<<` is read as
        text, not as its language (the server refuses the model's real tokens in texts).
        """
        language = target_language or self.model.preprocessor.tokenizer.target_language
        if language is not None:
            texts = [f"{language_tag(language)} {text}" for text in texts]
        return source_segments(
            self.model,
            texts,
            target_language=language,
            max_tokens=self.max_sentence_tokens,
            split_sentences=self.split_sentences,
            source_language=source_language,
        )

    def bucket_of(self, row: list[int]) -> int:
        """The source width a sentence of these token ids is decoded at."""
        needed = len(row) + SOURCE_SPECIAL_ROOM
        return next((width for width in self.length_buckets if width >= needed), bucketed(needed))

    def rows_per_batch(self, bucket: int) -> int:
        """The most sentences of `bucket`'s width decoded together (once
        warming up has begun, the largest size compiled so far)."""
        fitting = [size for size in self._sizes(bucket) if size * bucket <= self.max_batch_tokens]
        return fitting[-1] if fitting else 1

    def _sizes(self, bucket: int) -> list[int]:
        return self.programs.compiled(bucket) if self._compiled_sizes_only else list(self.batch_sizes)

    def shapes(self) -> list[tuple[int, int]]:
        """Every `(batch size, source width)` the server decodes, smallest batches first."""
        return [
            (size, bucket)
            for size in self.batch_sizes
            for bucket in self.length_buckets
            if size == 1 or size * bucket <= self.max_batch_tokens
        ]

    @property
    def max_alternatives(self) -> int:
        """The most alternative translations of a sentence: the other hypotheses of its beam."""
        return (self.search.beam_size or 1) - 1

    def translate_rows(self, rows: list[list[int]], num_hypotheses: int = 1) -> list:
        """Translations of sentences of one bucket (the batcher gives at most
        `rows_per_batch`; more are decoded in batches of that many); with
        `num_hypotheses` > 1, each sentence's n best (a list, best first; see
        `Transformer.generate`)."""
        longest = max(rows, key=len)
        sizes = self._sizes(self.bucket_of(longest))
        if len(rows) > sizes[-1]:
            return [
                text
                for start in range(0, len(rows), sizes[-1])
                for text in self.translate_rows(rows[start : start + sizes[-1]], num_hypotheses)
            ]
        size = next(size for size in sizes if size >= len(rows))
        packed = self.model.preprocessor.pack_sources(rows + [longest] * (size - len(rows)), self.bucket_of(longest))
        if num_hypotheses > 1:  # alternatives: generate's n-best search, compiled at the first such request of a shape
            return self.model.generate(packed, search=self.search, num_hypotheses=num_hypotheses)[: len(rows)]
        translations = self.model.preprocessor.generate_postprocess(self.programs.run(packed))
        return [t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in translations][: len(rows)]

    def warm_up(self, on_shape: Callable[[int, int], None] | None = None) -> None:
        """Compiles batches of one sentence at every width: from then on the
        engine translates anything without compiling (calling
        `on_shape(done, total)` after each shape)."""
        self._compiled_sizes_only = True
        self._compile([(1, bucket) for bucket in self.length_buckets], on_shape)

    def warm_up_later(self, on_shape: Callable[[int, int], None] | None = None, stop=None) -> None:
        """Compiles the larger batch sizes, smallest first, each used as soon as
        it is compiled; `stop` (a `threading.Event`) ends it between shapes."""
        self._compile([shape for shape in self.shapes() if shape[0] > 1], on_shape, stop)

    def _compile(self, shapes, on_shape, stop=None) -> None:
        for done, (size, bucket) in enumerate(shapes, 1):
            if stop is not None and stop.is_set():
                return
            self.programs.compile(size, bucket)
            release_freed_memory()  # the compiler's scratch memory, freed but kept by the C library
            if on_shape is not None:
                on_shape(done, len(shapes))


def _doubling_widths(widest: int) -> tuple[int, ...]:
    """`LENGTH_BUCKET`, twice that, four times, ... up to `widest`, and the
    widest multiple of `LENGTH_BUCKET` itself."""
    widths = []
    width = LENGTH_BUCKET
    while width <= widest:
        widths.append(width)
        width *= 2
    last = widest // LENGTH_BUCKET * LENGTH_BUCKET
    return tuple(widths + ([last] if widths and last > widths[-1] else []))


def _powers_of_four(limit: int) -> tuple[int, ...]:
    """1, 4, 16, ... below `limit`, and `limit` itself."""
    sizes = [1]
    while sizes[-1] * 4 < limit:
        sizes.append(sizes[-1] * 4)
    return tuple(sizes + [limit]) if limit > 1 else (1,)
