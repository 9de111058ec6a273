"""A model's tokenizer as the files of `transformers`' `MarianTokenizer`.

MarianTokenizer reads `source.spm` and `target.spm` (the SentencePiece
models that segment source and target text), `vocab.json` (each piece to
the model's id) and `tokenizer_config.json` (its special tokens and
options); it appends `</s>` to every source.

- A `MarianTokenizer` of this project (an Opus-MT model) is written back as
  it was read, with `target_vocab.json` if the target has its own
  vocabulary.
- A `TransformerTokenizer` (this project's own models) is one SentencePiece
  model for both languages whose ids are the model's: it becomes both
  `.spm` files, and `vocab.json` lists its pieces by id. Its sources start
  with `<s>`, which MarianTokenizer adds through SentencePiece's `add_bos`
  option (`sp_model_kwargs` in `tokenizer_config.json`). MarianTokenizer
  passes that option to both models, so its targets (`text_target=`, the
  labels when fine-tuning with `transformers`) start with `<s>` too: drop
  that first label token there.

Marian's last id is `<pad>`, which is also the decoder start, and
CTranslate2's converter drops that last row. A vocabulary whose last piece
is not `<pad>` (this project's own have `<pad>` = 0) gets a new last `<pad>`;
a `<pad>` piece it has is renamed `<unused>` (in the export it is neither
an input nor ever generated). Every other id stays the model's.
"""

import json

import sentencepiece

from keras_transformer.marian.export_weights import MarianExportError
from keras_transformer.marian.loader import MAX_INPUT_TOKENS
from keras_transformer.marian.tokenizer import (
    SOURCE_SPM,
    TARGET_SPM,
    TARGET_VOCABULARY_JSON,
    VOCABULARY_JSON,
    MarianTokenizer,
)
from keras_transformer.models.transformer_backbone import TransformerBackbone
from keras_transformer.models.transformer_tokenizer import TransformerTokenizer

TOKENIZER_CONFIG = "tokenizer_config.json"
PAD_PIECE, UNUSED_PIECE = "<pad>", "<unused>"


def marian_vocabularies(backbone: TransformerBackbone, preprocessor) -> tuple[list[str], list[str] | None]:
    """The export's vocabularies, pieces by id, `<pad>` last: the source's
    (or the shared one) and the target's (`None` when shared).

    Raises:
        MarianExportError: there is no preprocessor, the tokenizer is of
            another kind, or its vocabularies do not fit the backbone.
    """
    _, _, source, target = _parts(preprocessor)
    sizes = ((source, backbone.vocabulary_size, "source"), (target, backbone.target_vocabulary_size, "target"))
    for pieces, size, side in sizes:
        if (None if pieces is None else len(pieces)) != size:
            raise MarianExportError(
                f"The tokenizer's {side} vocabulary has {'no' if pieces is None else len(pieces)} pieces but the "
                f"model {size or 'no'} {side} embeddings; a Marian checkpoint needs one piece per embedding."
            )
    return _with_pad_last(source), None if target is None else _with_pad_last(target)


def _with_pad_last(pieces: list[str]) -> list[str]:
    if pieces[-1] == PAD_PIECE:
        return pieces
    if UNUSED_PIECE in pieces:
        raise MarianExportError(f"The vocabulary already has a piece {UNUSED_PIECE!r}, which the export needs.")
    return [UNUSED_PIECE if piece == PAD_PIECE else piece for piece in pieces] + [PAD_PIECE]


def tokenizer_files(
    backbone: TransformerBackbone, preprocessor, source_pieces: list[str], target_pieces: list[str] | None
) -> dict[str, bytes]:
    """MarianTokenizer's files for a model's tokenizer, by file name.

    Args:
        backbone: the model's backbone (its special ids and lengths).
        preprocessor: the model's preprocessor, holding a `MarianTokenizer`
            or a `TransformerTokenizer`.
        source_pieces, target_pieces: the export's vocabularies, from
            `marian_vocabularies`.

    Raises:
        MarianExportError: as `marian_vocabularies`, or the SentencePiece
            model cannot add the start token the model's sources begin with.
    """
    source, target, _, _ = _parts(preprocessor)
    start_kwargs = {}
    if preprocessor.source_start_token:
        _check_source_start(source, source_pieces[backbone.start_token_id])
        start_kwargs = {"add_bos": True}
    output_pieces = target_pieces or source_pieces  # the special ids are output ids
    config = {
        "tokenizer_class": "MarianTokenizer",
        "separate_vocabs": target_pieces is not None,
        "model_max_length": min(MAX_INPUT_TOKENS, backbone.max_sequence_length),
        "eos_token": output_pieces[backbone.end_token_id],
        "unk_token": output_pieces[backbone.unk_token_id],
        "pad_token": PAD_PIECE,
        "sp_model_kwargs": start_kwargs,
    }
    files = {
        SOURCE_SPM: source,
        TARGET_SPM: target,
        VOCABULARY_JSON: json_bytes({piece: index for index, piece in enumerate(source_pieces)}),
        TOKENIZER_CONFIG: json_bytes(config),
    }
    if target_pieces is not None:
        files[TARGET_VOCABULARY_JSON] = json_bytes({piece: index for index, piece in enumerate(target_pieces)})
    return files


def _parts(preprocessor) -> tuple[bytes, bytes, list[str], list[str] | None]:
    """The source and target SentencePiece models, and the source (or
    shared) and target (or `None`) pieces by id."""
    if preprocessor is None:
        raise MarianExportError("The model has no preprocessor: a Marian checkpoint needs its tokenizer.")
    tokenizer = preprocessor.tokenizer
    if isinstance(tokenizer, MarianTokenizer):
        target = None
        if tokenizer.target_vocabulary is not None:
            target = sorted(tokenizer.target_vocabulary, key=tokenizer.target_vocabulary.get)
        return tokenizer.source_proto, tokenizer.target_proto, tokenizer.get_vocabulary(), target
    if isinstance(tokenizer, TransformerTokenizer):
        return tokenizer.proto, tokenizer.proto, tokenizer.get_vocabulary(), None
    raise MarianExportError(
        f"Cannot write a {type(tokenizer).__name__} as Marian's tokenizer files; the export "
        "knows MarianTokenizer and TransformerTokenizer."
    )


def _check_source_start(proto: bytes, start_piece: str) -> None:
    """SentencePiece's `add_bos` must add the model's start token."""
    processor = sentencepiece.SentencePieceProcessor(model_proto=proto)
    bos = processor.bos_id()
    bos_piece = processor.id_to_piece(bos) if bos >= 0 else None
    if bos_piece != start_piece:
        raise MarianExportError(
            f"The model's sources start with {start_piece!r}, but its SentencePiece model's start piece "
            f"is {bos_piece!r}, so MarianTokenizer could not add it."
        )


def json_bytes(value) -> bytes:
    """`value` as the UTF-8 JSON `transformers` writes (indented, non-ASCII kept)."""
    return json.dumps(value, ensure_ascii=False, indent=2).encode("utf-8")
