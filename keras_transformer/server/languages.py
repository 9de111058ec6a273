"""Language codes as LibreTranslate's clients send them, and the languages a model serves.

LibreTranslate names languages by ISO 639-1 codes (`"en"`, `"de"`, `"hi"`),
and ISO 639-3 where a language has no two-letter code (`"gos"`); Opus-MT's
multilingual models name their targets by ISO 639-3 tokens (`>>deu<<`),
some with a script (`>>cmn_Hans<<`, Mandarin in simplified characters).
pycountry carries the ISO 639-3 table, so both spellings of a language name
one `code` here, the one LibreTranslate uses; langcodes folds a token's
language into that code (`cmn_Hans` -> `zh`), with CLDR's data on
macrolanguages and scripts, which pycountry lacks.

Example:
>>> code("deu"), code("de"), code("gos"), language_name("hi")
('de', 'de', 'gos', 'Hindi')
>>> pair_from_name("multi30k_en_de"), pair_from_name("hf://Helsinki-NLP/opus-mt-hi-en")
(('en', 'de'), ('hi', 'en'))
>>> pair_from_name("hf://Helsinki-NLP/opus-mt-tc-big-gmw-gmw") is None
True
>>> source_from_name("Helsinki-NLP/opus-mt-en-ROMANCE"), source_from_name("opus-mt-tc-big-en-zle")
('en', 'en')
>>> source_from_name("opus-mt-tc-big-gmw-gmw"), source_from_name("my_model")
(None, None)
>>> pair_from_name("opus-mt-tc-big-en-cat_oci_spa"), source_from_name("opus-mt-tc-big-en-cat_oci_spa")
(None, 'en')
>>> tokens_by_code(["cmn_Hans", "cmn_Hant", "deu", "por", "pt_BR", "yue_Hant"])
{'zh': 'cmn_Hans', 'de': 'deu', 'pt': 'por', 'yue': 'yue_Hant'}
"""

import re
from collections.abc import Iterable

import langcodes
import pycountry

_CODE = re.compile(r"[a-z]{2,3}")


def _sides(name: str) -> tuple[str, str] | None:
    """The last two parts of a name, its source and target side. Opus-MT's names
    part them with `-` and join the languages of one side with `_`
    (`opus-mt-tc-big-en-cat_oci_spa`); other names may use either (`multi30k_en_de`)."""
    base = str(name).rstrip("/").rsplit("/", 1)[-1]
    parts = re.split("-" if base.lower().startswith("opus-mt-") else "[-_]", base)
    return (parts[-2], parts[-1]) if len(parts) >= 2 else None


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


def language_name(value: str) -> str:
    """The English name of a language code (the code itself for an unknown one)."""
    language = _language(value)
    return value if language is None else language.name


def pair_from_name(name: str) -> tuple[str, str] | None:
    """`(source, target)` codes read off a preset or repository name that ends in
    two language codes (`multi30k_en_de`, `opus-mt-hi-en`); `None` otherwise."""
    sides = _sides(str(name).lower())
    if sides is None or not all(_CODE.fullmatch(side) for side in sides):
        return None
    source, target = (code(side) for side in sides)
    return (source, target) if source and target else None


def source_from_name(name: str) -> str | None:
    """The source code of a name that ends in a language code and then a
    group of languages (`opus-mt-en-ROMANCE`, `opus-mt-tc-big-en-zle`: `en`)
    or several joined by `_` (`opus-mt-tc-big-en-cat_oci_spa`); `None` for other names."""
    sides = _sides(name)
    if sides is None or not _CODE.fullmatch(sides[0]):
        return None
    source, targets = sides
    several = "_" in targets and all(code(target) for target in targets.split("_"))
    if not (targets.isupper() or several or pycountry.language_families.get(alpha_3=targets) is not None):
        return None
    return code(source)


def token_code(language: str) -> str | None:
    """The LibreTranslate code of a target-language token's language
    (`deu` -> `de`; `cmn_Hans`, Mandarin in simplified script, -> `zh`); `None` for no language."""
    folded = _folded(language)
    return None if folded is None else code(folded.language)


def tokens_by_code(languages: Iterable[str]) -> dict[str, str]:
    """The code each token language serves (see `token_code`), mapped to it;
    of several for one code (`cmn_Hans`, `cmn_Hant`, `zh_TW`), the one in the
    language's usual script, then one without a region, then the first by name."""

    def preference(language: str) -> tuple[bool, bool, str]:
        folded = _folded(language)
        if folded is None:
            return True, True, language
        usual = folded.maximize().script == langcodes.Language.get(folded.language).maximize().script
        return not usual, folded.territory is not None, language

    by_code = {}
    for language in sorted(languages, key=preference):
        if (served := token_code(language)) is not None:
            by_code.setdefault(served, language)
    return by_code


def _folded(language: str) -> langcodes.Language | None:
    """A token's language as a BCP 47 tag, macrolanguage folded (`cmn_Hans` -> `zh-Hans`); `None` for no language."""
    try:
        folded = langcodes.Language.get(langcodes.standardize_tag(language.replace("_", "-"), macro=True))
    except ValueError:
        return None
    return folded if folded.language else None
