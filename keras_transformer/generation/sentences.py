"""Splitting a long text into sentences, so that each fits the model.

`Transformer.translate` translates an input longer than the model's maximum
source length sentence by sentence. The rule is deliberately simple (a
regular expression, no abbreviation list): a sentence ends at `.`, `!`, `?`
or `…` (with any closing quotes or brackets) followed by whitespace, or at
the CJK full-width `。`, `！`, `？`, which need no space after them. An
abbreviation such as "Mr." may thus end a "sentence"; for translating a text
that is too long as a whole, a cut there costs little.

Example:
>>> split_sentences('He came. "Did he?" Yes!  今日は晴れ。明日は雨？')
['He came.', '"Did he?"', 'Yes!', '今日は晴れ。', '明日は雨？']
"""

import re

# A run of terminators, then closing quotes or brackets; Latin ones must be
# followed by whitespace ("3.14" and "e.g.x" are not boundaries), CJK ones not.
_SENTENCE_END = re.compile(r"[.!?…]+[\"'”’»)\]]*(?=\s)|[。！？]+[」』”’）]*")


def split_sentences(text: str) -> list[str]:
    """The sentences of `text`, stripped, without empty ones.

    Joining them with spaces gives `text` back up to whitespace.
    """
    sentences, start = [], 0
    for match in _SENTENCE_END.finditer(text):
        sentences.append(text[start : match.end()])
        start = match.end()
    sentences.append(text[start:])
    return [s.strip() for s in sentences if s.strip()]
