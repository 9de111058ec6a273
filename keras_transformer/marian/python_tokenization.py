"""Marian's tokenizing without TensorFlow, with `sentencepiece`'s own library.

`MarianTokenizer` tokenizes with TensorFlow ops, so that it works in
`tf.data` and in a SavedModel. Where TensorFlow is absent (not installed,
or kept out of a JAX or torch process such as the server, where it would be
most of its memory) it tokenizes with these functions, which follow those
ops step for step: a leading `>>xxx<<` is one piece, every piece is looked up
in the vocabulary (`<unk>` where it lacks one), and special ids are dropped
before the target model joins the pieces. `tests/test_tokenizers_without_tensorflow.py`
checks them against the ops.
"""

import sentencepiece

from keras_transformer.utils.language_tags import language_tag, split_language_tag

WORD_START = "\u2581"  # SentencePiece's "▁"
# `tf.strings.strip`'s whitespace: ASCII only, where `str.strip()` takes all of Unicode's.
ASCII_WHITESPACE = " \t\n\v\f\r"


def sentence_piece(proto: bytes) -> sentencepiece.SentencePieceProcessor:
    """A SentencePiece model that segments text into piece strings."""
    return sentencepiece.SentencePieceProcessor(model_proto=proto)


def tokenize(model, vocabulary: dict, unk_id: int, texts, default_language: str | None = None):
    """Token ids of a text or a list of texts, as `MarianTokenizer.tokenize`'s ops give them.

    Args:
        model: the side's `sentence_piece`.
        vocabulary: the side's pieces to ids.
        unk_id: the id of a piece the vocabulary lacks.
        texts: a string, or a list of strings.
        default_language: the language whose token goes before a text without one.
    """
    if isinstance(texts, str):
        return tokenize(model, vocabulary, unk_id, [texts], default_language)[0]
    rows = []
    for text in texts:
        text = text.decode("utf-8") if isinstance(text, bytes) else str(text)
        tag, rest = split_language_tag(text)
        if tag is None and default_language is not None:
            tag, rest = language_tag(default_language), " " + text
        pieces = ([] if tag is None else [tag]) + model.encode(text if tag is None else rest, out_type=str)
        rows.append([vocabulary.get(piece, unk_id) for piece in pieces])
    return rows


def detokenize(model, pieces: list[str], special_ids: set, token_ids):
    """Text of one row of token ids, or a list of texts of a batch of rows,
    as `MarianTokenizer.detokenize`'s ops give it."""
    rows = token_ids.tolist() if hasattr(token_ids, "tolist") else token_ids
    if not rows or not isinstance(rows[0], (list, tuple)):
        return detokenize(model, pieces, special_ids, [rows])[0]
    texts = []
    for row in rows:
        kept = [pieces[int(index)] for index in row if int(index) not in special_ids]
        # Pieces the target model lacks come out verbatim, "▁" included.
        texts.append(model.decode_pieces(kept).replace(WORD_START, " ").strip(ASCII_WHITESPACE))
    return texts
