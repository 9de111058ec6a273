"""CTranslate2 as the server's decoder, behind the same batcher, API and metrics.

The model's own preprocessor still cuts texts into sentences and tokenizes
them (the same segments, special tokens and detokenizing as `ModelEngine`);
each batch is then decoded by `ctranslate2.Translator.translate_batch` on
the model converted once into a cache (`ctranslate2_cache.converted_model`),
with the same beam size, length penalty and length limit. CTranslate2 pads
each batch itself, so there is nothing to compile: a batch of any size up to
`max_batch_size` is decoded as it is.

Its length penalty is the one of section 6.1 (Wu et al.'s, with
`normalize_scores` off), and its limit is one length per call, the longest
sentence's: each translation is cut to its own source length plus
`max_extra_length` tokens afterwards. Greedy translations are then the
project's own; a beam search that reaches a shorter sentence's limit may
keep other beams than the project's, which stops that sentence there.

Needs the `ctranslate2` extra (`pip install "keras-transformer[ctranslate2]"`).

Example:
>>> import keras_transformer as kt
>>> engine = CTranslate2Engine(kt.Transformer.from_preset("multi30k_en_de"))  # doctest: +SKIP
>>> segments = engine.segments(["Two dogs play in the snow."])  # doctest: +SKIP
>>> engine.translate_rows([segment.token_ids for segment in segments])  # doctest: +SKIP
['Zwei Hunde spielen im Schnee.']
"""

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from keras_transformer.generation.settings import SearchSettings
from keras_transformer.server.ctranslate2_cache import converted_model, import_ctranslate2
from keras_transformer.server.engine import ModelEngine

# `--precision` as CTranslate2's weight quantization (on conversion) and compute type (on loading).
QUANTIZATIONS = {"float32": None, "int8": "int8"}
COMPUTE_TYPES = {"float32": "float32", "int8": "int8_float32"}


class CTranslate2Engine(ModelEngine):
    """A `Transformer` decoded by CTranslate2 behind the server's batcher.

    Sentences are cut, tokenized and grouped by width as `ModelEngine` does;
    a batch holds up to `max_batch_size` sentences (fewer for wide ones, so
    that no batch holds more than `max_batch_tokens` source positions).

    Args:
        model: a float32 `Transformer` with a preprocessor that a Marian
            checkpoint can hold (see `marian.export`).
        search, max_batch_size, max_batch_tokens, max_source_bucket, name, split_sentences: see `ModelEngine`.
        precision: `"float32"`, or `"int8"` weights (computing in float32 elsewhere).
        inter_threads: each batch is cut into this many parts, decoded side
            by side, one per CTranslate2 worker (default: one per core).
        intra_threads: threads per worker. One: CTranslate2's threads spin
            while they wait for each other, so a batch cut in parts, one
            thread each, decodes faster than one batch on every thread.
        device: CTranslate2's `"cpu"`, `"cuda"` or `"auto"`.
        cache: the folder of converted models (default `ctranslate2_cache.cache_root()`).
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
        precision: str = "float32",
        inter_threads: int | None = None,
        intra_threads: int = 1,
        device: str = "auto",
        cache: str | os.PathLike | None = None,
    ):
        compute_type = compute_type_of(precision)
        super().__init__(
            model,
            search=search,
            max_batch_size=max_batch_size,
            max_batch_tokens=max_batch_tokens,
            max_source_bucket=max_source_bucket,
            name=name,
            split_sentences=split_sentences,
        )
        ctranslate2 = import_ctranslate2()
        inter_threads = inter_threads or os.cpu_count() or 1
        self.folder = converted_model(model, QUANTIZATIONS[precision], cache)
        self.translator = ctranslate2.Translator(
            str(self.folder),
            device=device,
            compute_type=compute_type,
            inter_threads=inter_threads,
            intra_threads=intra_threads,
        )
        self.parts = inter_threads
        self.source_pieces, target_pieces = _vocabularies(self.folder)
        self.target_ids = {piece: index for index, piece in enumerate(target_pieces)}

    @property
    def max_alternatives(self) -> int:
        """None: `translate_rows` decodes each sentence's best only (CTranslate2's
        `num_hypotheses` is not wired to the server's alternatives yet)."""
        return 0

    def rows_per_batch(self, bucket: int) -> int:
        """The most sentences of `bucket`'s width decoded together (any number, not only powers of two)."""
        return max(1, min(self.batch_sizes[-1], self.max_batch_tokens // bucket))

    def shapes(self) -> list[tuple[int, int]]:
        """None: CTranslate2 decodes batches of any shape without compiling."""
        return []

    def translate_rows(self, rows: list[list[int]]) -> list[str]:
        """Translations of sentences of one bucket, at most `rows_per_batch` of them."""
        packed = self.model.preprocessor.pack_sources(rows)
        sources = [
            [self.source_pieces[i] for i in ids[mask]]
            for ids, mask in zip(packed["encoder_token_ids"], packed["encoder_padding_mask"])
        ]
        limits = [len(row) + self.search.max_extra_length for row in rows]
        results = self.translator.translate_batch(
            sources,
            beam_size=self.search.beam_size or 1,
            length_penalty=self.search.alpha,
            max_decoding_length=max(limits) + 1,  # and the end token
            max_batch_size=0 if self.parts == 1 else -(-len(sources) // self.parts),
        )
        hypotheses = [result.hypotheses[0][:limit] for result, limit in zip(results, limits)]
        return self._detokenized([[self.target_ids[piece] for piece in pieces] for pieces in hypotheses])

    def warm_up(self, on_shape: Callable[[int, int], None] | None = None) -> None:
        """Decodes one short sentence, so that the first request finds everything loaded."""
        self.translate_rows([[self.model.backbone.end_token_id]])
        if on_shape is not None:
            on_shape(1, 1)

    def _detokenized(self, token_ids: list[list[int]]) -> list[str]:
        width = max(map(len, token_ids), default=0)
        padded = np.full((len(token_ids), width), self.model.backbone.pad_token_id, "int32")
        for row, ids in zip(padded, token_ids):
            row[: len(ids)] = ids
        mask = np.arange(width)[None, :] < np.array([len(ids) for ids in token_ids])[:, None]
        outputs = {"decoder_token_ids": padded, "decoder_padding_mask": mask}
        texts = self.model.preprocessor.generate_postprocess(outputs)
        return [text.decode("utf-8") if isinstance(text, bytes) else str(text) for text in texts]


def compute_type_of(precision: str) -> str:
    """CTranslate2's compute type for a `--precision`.

    Example:
    >>> compute_type_of("int8")
    'int8_float32'
    """
    if precision not in COMPUTE_TYPES:
        raise ValueError(
            f"The ctranslate2 engine computes in float32 or int8; got precision {precision!r}: give one of those."
        )
    return COMPUTE_TYPES[precision]


def _vocabularies(folder: Path) -> tuple[list[str], list[str]]:
    """The converted model's source and target pieces by id (CTranslate2
    drops Marian's trailing `<pad>`; the other ids are the model's)."""

    def pieces(name: str) -> list[str]:
        return json.loads((folder / f"{name}_vocabulary.json").read_text(encoding="utf-8"))

    if (folder / "shared_vocabulary.json").is_file():
        shared = pieces("shared")
        return shared, shared
    return pieces("source"), pieces("target")
