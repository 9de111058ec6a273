"""Target-language tokens of multilingual models, such as `>>deu<<`.

A multilingual Opus-MT model reads the language to translate into from a
token at the start of the source: `">>deu<< Two dogs play."`. The rules are
`transformers`' `MarianTokenizer`'s: a text that starts with `>>` has a tag
up to the first `<<`, which is one token; the vocabulary's pieces of the
form `>>xxx<<` are the model's languages.

Example:
>>> split_language_tag(">>deu<< Two dogs play.")
('>>deu<<', ' Two dogs play.')
>>> language_tag("deu"), is_language_tag(">>nld<<"), is_language_tag("deu")
('>>deu<<', True, False)
"""

# The tag as a regular expression (RE2, for TensorFlow's string ops): ">>"
# up to the first "<<", newlines included.
LANGUAGE_TAG = r"(?s)^>>.*?<<"


def is_language_tag(piece: str) -> bool:
    """Whether a vocabulary piece is a target-language token (`>>xxx<<`)."""
    return piece.startswith(">>") and piece.endswith("<<") and len(piece) > 4


def language_tag(language: str) -> str:
    """The token of a language: `"deu"` -> `">>deu<<"` (a token is kept as it is)."""
    return language if is_language_tag(language) else f">>{language}<<"


def split_language_tag(text: str) -> tuple[str | None, str]:
    """`(tag, rest)` of a text that starts with a tag, else `(None, text)`."""
    end = text.find("<<") if text.startswith(">>") else -1
    return (text[: end + 2], text[end + 2 :]) if end != -1 else (None, text)
