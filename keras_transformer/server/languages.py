"""Language codes as LibreTranslate's clients send them, and the languages a model serves.

LibreTranslate names languages by ISO 639-1 codes (`"en"`, `"de"`, `"hi"`),
and ISO 639-3 where a language has no two-letter code (`"gos"`); Opus-MT's
multilingual models name their targets by ISO 639-3 tokens (`>>deu<<`).
pycountry carries the ISO 639-3 table, so both spellings of a language name
one `code` here, the one LibreTranslate uses.

Example:
>>> code("deu"), code("de"), code("gos"), language_name("hi")
('de', 'de', 'gos', 'Hindi')
>>> pair_from_name("multi30k_en_de"), pair_from_name("hf://Helsinki-NLP/opus-mt-hi-en")
(('en', 'de'), ('hi', 'en'))
>>> pair_from_name("hf://Helsinki-NLP/opus-mt-tc-big-gmw-gmw") is None
True
"""

import re

import pycountry

# A name that ends in two language codes: `..._en_de`, `...-hi-en`.
_NAME_PAIR = re.compile(r"(?:^|[_\-/])([a-z]{2,3})[_\-]([a-z]{2,3})$")


def _language(value: str):
    value = value.lower()
    if len(value) == 2:
        return pycountry.languages.get(alpha_2=value)
    if len(value) == 3:
        return pycountry.languages.get(alpha_3=value)
    return None


def code(value: str) -> str | None:
    """The LibreTranslate code of an ISO 639-1 or 639-3 code, or `None` for no language."""
    language = _language(value)
    if language is None:
        return None
    return getattr(language, "alpha_2", None) or language.alpha_3


def alpha_3(value: str) -> str | None:
    """The ISO 639-3 code of a language code (the form of Opus-MT's `>>xxx<<` tokens)."""
    language = _language(value)
    return None if language is None else language.alpha_3


def language_name(value: str) -> str:
    """The English name of a language code (the code itself for an unknown one)."""
    language = _language(value)
    return value if language is None else language.name


def pair_from_name(name: str) -> tuple[str, str] | None:
    """`(source, target)` codes read off a preset or repository name that ends in
    two language codes (`multi30k_en_de`, `opus-mt-hi-en`); `None` otherwise."""
    match = _NAME_PAIR.search(str(name).rstrip("/").lower())
    if match is None:
        return None
    source, target = (code(part) for part in match.groups())
    return (source, target) if source and target else None
