"""A model-free engine for the server's tests: routing, limits and queueing
checked in milliseconds, on any backend."""

import re
import threading

from keras_transformer.generation.translation import Segment


class StubEngine:
    """A `ModelEngine`'s interface without a model: each sentence (up to a
    full stop) is one row of character codes; its translation is the
    sentence upper-cased. Batches wait while `gate` is clear.

    Args:
        languages: the `>>xxx<<` token languages of the "model" (none: one target language).
        fail_first: the first batch raises `RuntimeError`.
    """

    def __init__(self, languages=(), *, rows_per_batch: int = 4, fail_first: bool = False):
        self.languages = list(languages)
        self.batch_rows = rows_per_batch
        self.fail_first = fail_first
        self.batches = []
        self.segment_languages = []
        self.gate = threading.Event()
        self.gate.set()
        self.decoding = threading.Event()

    def target_languages(self) -> list[str]:
        return self.languages

    def segments(self, texts, target_language=None, source_language=None):
        self.segment_languages.append(target_language)
        return [
            Segment(index, [ord(c) for c in sentence.strip()], spacing)
            for index, text in enumerate(texts)
            for sentence, spacing in re.findall(r"([^.]+\.?)(\s*)", text)
            if sentence.strip()
        ]

    def bucket_of(self, row) -> int:
        return 16

    def rows_per_batch(self, bucket: int) -> int:
        return self.batch_rows

    def translate_rows(self, rows):
        self.decoding.set()
        self.gate.wait(30)
        self.batches.append(["".join(map(chr, row)) for row in rows])
        if self.fail_first and len(self.batches) == 1:
            raise RuntimeError("the first batch fails")
        return ["".join(map(chr, row)).strip().upper() for row in rows]

    def warm_up(self, on_shape=None) -> None:
        pass
