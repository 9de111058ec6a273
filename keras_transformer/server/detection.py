"""Which language a text is in: LibreTranslate's `/detect` and `source: "auto"`.

Lingua (`lingua-language-detector`) tells 75 languages apart from short texts
too, as LibreTranslate itself does since 1.6. The detector here knows only
the languages the server serves: fewer languages to confuse, and lingua loads
the models of those alone, when the detector is built (once per process: lingua
shares them), so that no request waits for them.

Example:
>>> detector = LanguageDetector(["en", "hi", "de"])
>>> detector.detect("मेरा ऑर्डर अभी तक नहीं आया है।")[0]
Detection(language='hi', confidence=100.0)
>>> detector.detect("My order has still not arrived.")[0].language
'en'
"""

from collections.abc import Iterable
from dataclasses import dataclass

from lingua import IsoCode639_1, IsoCode639_3, Language, LanguageDetectorBuilder


@dataclass(frozen=True)
class Detection:
    """A language code and LibreTranslate's confidence in it, 0 to 100."""

    language: str
    confidence: float

    def as_json(self) -> dict:
        return {"confidence": self.confidence, "language": self.language}


class LanguageDetector:
    """Lingua restricted to `codes` (LibreTranslate codes); a code lingua does
    not know is never detected.

    Args:
        codes: the languages to tell apart.
    """

    def __init__(self, codes: Iterable[str]):
        self._languages = {}
        for code in dict.fromkeys(codes):
            if (language := _lingua_language(code)) is not None:
                self._languages[language] = code
        self._detector = None
        if self._languages:
            builder = LanguageDetectorBuilder.from_languages(*self._languages)
            self._detector = builder.with_preloaded_language_models().build()

    def detect(self, text: str) -> list[Detection]:
        """The detectable languages `text` may be in, likeliest first (those of
        confidence above 0; none for a text without letters of any of them)."""
        if self._detector is None:
            return []
        values = self._detector.compute_language_confidence_values(text)
        return [
            Detection(self._languages[value.language], round(100 * value.value, 1))
            for value in values
            if value.value > 0
        ]


def _lingua_language(code: str) -> Language | None:
    try:
        if len(code) == 2:
            return Language.from_iso_code_639_1(IsoCode639_1.from_str(code))
        return Language.from_iso_code_639_3(IsoCode639_3.from_str(code))
    except ValueError:  # a language lingua does not know
        return None
