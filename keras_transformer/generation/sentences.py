"""Splitting a text into sentences, and keeping the spacing between them.

A model trained on single sentences (Multi30k, most of Opus-MT's data)
translates a text of several badly: it merges, drops or garbles them. So
`Transformer.translate` and the server translate each sentence of a text on
its own and join the translations with the whitespace the text had between
its sentences (`" "`, `"\\n\\n"`, ...).

The splitter is sentencex (Wikimedia's): rule-based, no model to download,
with abbreviation lists for some 300 languages (English, German, French,
Hindi and Opus-MT's languages among them; an unknown code falls back to
generic rules), so that "Dr. Smith", "z. B." and "3.5" stay whole. pysbd has
rules for 22 languages only. sentencex ends sentences at paragraph breaks but
not at a single line break; here a line break ends one too (a greeting, a
list item, a line without a full stop), unless a lowercase letter follows it:
then it is a hard-wrapped line that goes on. sentencex also ends a sentence
after an initial that begins one ("M. Dupont", French for Mr Dupont); here
the initial stays with its sentence.

Example:
>>> split_sentences("Dr. Smith paid 3.5 dollars. He left!\\n\\nDas ist z. B. gut.")
[('Dr. Smith paid 3.5 dollars.', ' '), ('He left!', '\\n\\n'), ('Das ist z. B. gut.', '')]
>>> join_sentences(["A.", "B.", "C."], [" ", "\\n\\n", ""])
'A. B.\\n\\nC.'
"""

import re

import sentencex

# sentencex's rules for a language it has no rules of (and for no language given).
GENERIC_LANGUAGE = "en"
# A line break, and the first character of the next line.
_LINE_BREAK = re.compile(r"\n\s*(\S)")


def split_sentences(text: str, language: str | None = None) -> list[tuple[str, str]]:
    """The sentences of `text`, stripped, each with the whitespace that follows
    it (`""` after the last); none for a text of whitespace only.

    Args:
        text: the text.
        language: its ISO 639-1 code (`"de"`), for the language's
            abbreviations; by default generic rules.
    """
    sentences, position = [], 0
    pieces = (piece for line in _lines(text) for piece in _segments(line, language or GENERIC_LANGUAGE))
    for piece in pieces:
        sentence = piece.strip()
        if sentence:
            # The pieces come in order: what lies between two sentences is whitespace.
            start = text.index(sentence, position)
            if sentences:
                sentences[-1] = (sentences[-1][0], text[position:start])
            sentences.append((sentence, ""))
            position = start + len(sentence)
    return sentences


def _segments(line: str, language: str) -> list[str]:
    """sentencex's sentences of one line, with each initial that it ended a
    sentence at (it does at a sentence's start: "A. Dupont", and French "M.",
    Mr) joined to the sentence it begins."""
    segments = []
    for piece in sentencex.segment(language, line):
        if segments and _is_initial(segments[-1]):
            segments[-1] += piece
        else:
            segments.append(piece)
    return segments


def _is_initial(piece: str) -> bool:
    """A capital and a full stop: an initial, never a sentence."""
    piece = piece.strip()
    return len(piece) == 2 and piece[0].isupper() and piece[1] == "."


def _lines(text: str) -> list[str]:
    """`text` cut before each line break that a lowercase letter does not follow."""
    lines, start = [], 0
    for match in _LINE_BREAK.finditer(text):
        if not match.group(1).islower():
            lines.append(text[start : match.start()])
            start = match.start()
    return lines + [text[start:]]


def join_sentences(translations: list[str], spacing: list[str]) -> str:
    """`translations` joined, each followed by its `spacing` but the last; an
    empty translation and the spacing after it are left out."""
    kept = [(text, space) for text, space in zip(translations, spacing) if text]
    return "".join(text + space for text, space in kept[:-1]) + (kept[-1][0] if kept else "")
