"""Marian's tokenizer: two SentencePiece models, one vocabulary, in a TF graph.

An Opus-MT repo holds `source.spm` (segments the source language),
`target.spm` (segments the target language and joins outputs back into
text) and `vocab.json`, one map from piece strings to the model's ids
shared by both languages, or (checkpoints with separate vocabularies)
`vocab.json` for the source and `target_vocab.json` for the target. The
SentencePiece models' own ids are never used: every piece is looked up in
the vocabulary, and a piece it lacks becomes `<unk>`.

Multilingual models read the target language from a token at the start of
the source, such as `>>deu<<`: a leading `>>...<<` is one token, kept out of
SentencePiece, as `transformers`' `MarianTokenizer` does. The model's
languages are the `>>xxx<<` pieces of its (source) vocabulary;
`target_language` makes the tokenizer add that token to every source
without one.

Everything runs as TensorFlow ops (tf_text's SentencePiece op and a
`tf.lookup.StaticHashTable`), so the tokenizer works in `tf.data` and in an
exported SavedModel, like KerasHub's own tokenizers; in a process without
TensorFlow, `python_tokenization` does the same with `sentencepiece`.
"""

import json
import os
from pathlib import Path

import keras
import keras_hub

from keras_transformer.marian import python_tokenization
from keras_transformer.marian.python_tokenization import WORD_START
from keras_transformer.models.transformer_backbone import TransformerBackbone
from keras_transformer.models.transformer_tokenizer import TargetLanguages
from keras_transformer.utils.language_tags import LANGUAGE_TAG, is_language_tag, language_tag, split_language_tag
from keras_transformer.utils.library_internals import (
    add_special_token,
    convert_to_ragged_batch,
    preprocessing_function,
    update_special_token_ids,
)
from keras_transformer.utils.text_libraries import tf, tf_text

SOURCE_SPM, TARGET_SPM, VOCABULARY_JSON = "source.spm", "target.spm", "vocab.json"
TARGET_VOCABULARY_JSON = "target_vocab.json"


def _read_bytes(value) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return Path(value).read_bytes()


def _read_vocabulary(value) -> dict | None:
    if value is None or isinstance(value, dict):
        return value
    return json.loads(Path(value).read_text(encoding="utf-8"))


def _pieces_in_order(vocabulary: dict, name: str) -> list[str]:
    """The pieces of a vocabulary by id; it must number them 0 to V - 1."""
    size = len(vocabulary)
    if sorted(vocabulary.values()) != list(range(size)):
        raise ValueError(f"{name} must number its {size} pieces 0 to {size - 1}, each once.")
    pieces = [None] * size
    for piece, index in vocabulary.items():
        pieces[index] = piece
    return pieces


def _lookup_table(pieces: list[str], default_id: int):
    """A TF table from piece to id (`default_id` for pieces it lacks)."""
    return tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant(pieces), tf.range(len(pieces), dtype=tf.int32)),
        default_value=default_id,
    )


@keras.saving.register_keras_serializable(package="keras_transformer")
class MarianTokenizer(TargetLanguages, keras_hub.tokenizers.Tokenizer):
    """Source and target SentencePiece models mapped through one `vocab.json`.

    `tokenize` (and calling the layer) segments source text with the source
    model; `tokenize_target` segments target text with the target model;
    `detokenize` drops the special tokens and joins pieces with the target
    model, as `transformers`' `MarianTokenizer.decode(...,
    skip_special_tokens=True)` does. No end token is added here: the
    preprocessor packs sequences.

    Special tokens come from the model's config: `end_token` is `</s>`,
    `pad_token` is `<pad>` (the last id), and `start_token`, the decoder's
    first input, is `<pad>` too in every Opus-MT model. Their ids
    (`end_token_id`, ...) are target ids, which decoding uses;
    `source_end_token_id` and `source_pad_token_id` pack sources.
    `get_vocabulary`, `token_to_id` and `id_to_token` describe the source
    vocabulary, which `tokenize` maps to (as `transformers`' `get_vocab`).

    Args:
        source_proto: `source.spm` (bytes or a path).
        target_proto: `target.spm` (bytes or a path).
        vocabulary: `vocab.json` (a dict piece -> id, or a path).
        start_token, end_token, pad_token, unk_token: their pieces.
        target_vocabulary: `target_vocab.json` of a checkpoint with separate
            vocabularies (a dict or a path); `None` when `vocabulary` serves
            both sides.
        target_language: a language of a multilingual model (`"deu"` or
            `">>deu<<"`), whose token `tokenize` puts before every source
            that has none; `None` adds nothing.
        separate_vocabularies: whether the target has its own vocabulary
            (implied by `target_vocabulary`; saved configs say it, since
            the vocabularies are saved as assets).

    Example:
    >>> tokenizer = MarianTokenizer("source.spm", "target.spm", "vocab.json")  # doctest: +SKIP
    >>> tokenizer.detokenize(tokenizer.tokenize_target("Ein Hund."))  # doctest: +SKIP
    'Ein Hund.'
    """

    backbone_cls = TransformerBackbone

    def __init__(
        self,
        source_proto=None,
        target_proto=None,
        vocabulary=None,
        start_token: str = "<pad>",
        end_token: str = "</s>",
        pad_token: str = "<pad>",
        unk_token: str = "<unk>",
        target_vocabulary=None,
        target_language: str | None = None,
        separate_vocabularies: bool = False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.separate_vocabularies = separate_vocabularies or target_vocabulary is not None
        self.file_assets = [SOURCE_SPM, TARGET_SPM, VOCABULARY_JSON]
        if self.separate_vocabularies:
            self.file_assets.append(TARGET_VOCABULARY_JSON)
        self.target_language = target_language
        add_special_token(self, start_token, "start_token")
        add_special_token(self, end_token, "end_token")
        add_special_token(self, pad_token, "pad_token")
        add_special_token(self, unk_token, "unk_token")
        self.set_vocabulary(source_proto, target_proto, vocabulary, target_vocabulary)

    def set_vocabulary(self, source_proto, target_proto, vocabulary, target_vocabulary=None) -> None:
        """Sets (or replaces) both SentencePiece models and the vocabulary
        (`vocabulary` for the source, `target_vocabulary` for the target if
        the model has separate ones)."""
        self.source_proto = _read_bytes(source_proto)
        self.target_proto = _read_bytes(target_proto)
        vocabulary = _read_vocabulary(vocabulary)
        target_vocabulary = _read_vocabulary(target_vocabulary)
        if vocabulary is None:
            self.vocabulary = self.target_vocabulary = None
            return
        if self.separate_vocabularies and target_vocabulary is None:
            raise ValueError(f"This tokenizer has separate vocabularies: pass {TARGET_VOCABULARY_JSON} too.")
        self.vocabulary = dict(vocabulary)
        self.target_vocabulary = None if target_vocabulary is None else dict(target_vocabulary)
        self._pieces = _pieces_in_order(self.vocabulary, VOCABULARY_JSON)
        self._target_pieces = (
            self._pieces if target_vocabulary is None else _pieces_in_order(target_vocabulary, TARGET_VOCABULARY_JSON)
        )
        update_special_token_ids(self)  # checks the special pieces against the source vocabulary
        if self.target_vocabulary is not None:
            # Decoding starts, stops and pads with target ids.
            for name in ("start_token", "end_token", "pad_token", "unk_token"):
                piece = getattr(self, name)
                if piece not in self.target_vocabulary:
                    raise ValueError(f"{TARGET_VOCABULARY_JSON} has no {name} {piece!r}.")
                setattr(self, f"{name}_id", self.target_vocabulary[piece])
        self.source_end_token_id = self.vocabulary[self.end_token]
        self.source_pad_token_id = self.vocabulary[self.pad_token]
        self.source_unk_token_id = self.vocabulary[self.unk_token]
        if self.target_language is not None:
            self.check_target_language(self.target_language)
        self._build_tf_resources()

    def _build_tf_resources(self) -> None:
        if tf_text is None:  # `python_tokenization` tokenizes
            self._source_sp = python_tokenization.sentence_piece(self.source_proto)
            self._target_sp = python_tokenization.sentence_piece(self.target_proto)
            return
        with tf.init_scope():
            self._source_sp = tf_text.SentencepieceTokenizer(self.source_proto, out_type=tf.string)
            self._target_sp = tf_text.SentencepieceTokenizer(self.target_proto, out_type=tf.string)
            self._piece_to_id = _lookup_table(self._pieces, self.source_unk_token_id)
            self._target_piece_to_id = (
                self._piece_to_id
                if self.target_vocabulary is None
                else _lookup_table(self._target_pieces, self.unk_token_id)
            )
            self._id_to_piece = tf.constant(self._target_pieces)
            special = sorted({self.start_token_id, self.end_token_id, self.pad_token_id, self.unk_token_id})
            self._special_ids = tf.constant(special, tf.int32)

    def _restore_tf_resources(self) -> None:
        """Rebuilds the TF resources if `tf.random.set_seed` dropped them
        (see `TransformerTokenizer._restore_sentence_piece`)."""
        if tf_text is None:
            return
        with tf.init_scope():
            try:
                self._piece_to_id.size()
                self._source_sp.vocab_size()
            except tf.errors.NotFoundError:
                self._build_tf_resources()

    def _check_vocabulary(self) -> None:
        if self.vocabulary is None:
            raise ValueError(
                "No vocabulary has been set for MarianTokenizer: pass source_proto, target_proto and vocabulary."
            )

    def tf_resources(self) -> list:
        """The TF resources its ops read (both SentencePiece models and the
        vocabulary's lookup table): a SavedModel that tokenizes in its graph
        must track them to save them."""
        self._check_vocabulary()
        tables = [self._piece_to_id] + ([] if self.target_vocabulary is None else [self._target_piece_to_id])
        return [self._source_sp, self._target_sp, *tables]

    def get_vocabulary(self) -> list[str]:
        self._check_vocabulary()
        return list(self._pieces)

    def vocabulary_size(self) -> int:
        self._check_vocabulary()
        return len(self._pieces)

    def id_to_token(self, id: int) -> str:
        self._check_vocabulary()
        if not 0 <= id < len(self._pieces):
            raise ValueError(f"id must be in [0, {len(self._pieces) - 1}]; got {id}.")
        return self._pieces[id]

    def token_to_id(self, token: str) -> int:
        self._check_vocabulary()
        return self.vocabulary.get(token, self.vocabulary[self.unk_token])

    def target_languages(self) -> list[str]:
        """The languages of a multilingual model, from the `>>xxx<<` pieces
        of its vocabulary (`["deu", "eng", ...]`); `[]` for a model of one
        target language."""
        self._check_vocabulary()
        return sorted(piece[2:-2] for piece in self.vocabulary if is_language_tag(piece))

    def language_tag_ids(self) -> list[int]:
        """The source ids of the target-language tokens."""
        self._check_vocabulary()
        return sorted(index for piece, index in self.vocabulary.items() if is_language_tag(piece))

    def check_target_language(self, language: str) -> str:
        """The token of `language` (`"deu"` or `">>deu<<"`), if this model has it.

        Raises:
            ValueError: the model has no such language; the message lists
                the ones it has.
        """
        languages = self.target_languages()
        tag = language_tag(language)
        if tag not in self.vocabulary or not is_language_tag(tag):
            if not languages:
                raise ValueError(
                    f"This model translates into one language and has no target-language tokens; "
                    f"got target_language={language!r}. Leave target_language out."
                )
            raise ValueError(
                f"This model has no target language {language!r}; its languages are: {', '.join(languages)}."
            )
        return tag

    def set_target_language(self, language: str | None) -> None:
        """Sets the language whose token `tokenize` adds (`None`: none),
        checked against the model's languages."""
        if language is not None:
            self.check_target_language(language)
        self.target_language = language

    def with_target_language(self, texts: list[str], language: str | None = None) -> list[str]:
        """`texts` with the token of `language` (by default the tokenizer's
        `target_language`) before each text that has none, every language
        checked.

        Raises:
            ValueError: an unknown language, or (for a multilingual model)
                none at all; the message lists the model's languages.
        """
        language = language if language is not None else self.target_language
        tag = None if language is None else self.check_target_language(language)
        if tag is None and not self.target_languages():
            return list(texts)
        tagged = []
        for text in texts:
            own, _ = split_language_tag(text)
            if own is not None:
                self.check_target_language(own)
                tagged.append(text)
            elif tag is None:
                raise ValueError(
                    "This model translates into several languages: pass target_language, one of "
                    f"{', '.join(self.target_languages())} (or start each text with its token, "
                    "e.g. '>>deu<< ')."
                )
            else:
                tagged.append(f"{tag} {text}")
        return tagged

    def _tokenize_with(self, target: bool, inputs, default_language=None):
        self._check_vocabulary()
        if tf_text is None:
            if target:
                side = (self._target_sp, self.target_vocabulary or self.vocabulary, self.unk_token_id)
            else:
                side = (self._source_sp, self.vocabulary, self.source_unk_token_id)
            return python_tokenization.tokenize(*side, inputs, default_language)
        self._restore_tf_resources()
        model, table = (self._target_sp, self._target_piece_to_id) if target else (self._source_sp, self._piece_to_id)
        inputs = tf.convert_to_tensor(inputs)
        unbatched = inputs.shape.rank == 0
        if unbatched:
            inputs = inputs[tf.newaxis]
        tagged = tf.strings.regex_full_match(inputs, LANGUAGE_TAG + ".*")
        if default_language is not None:
            inputs = tf.where(tagged, inputs, language_tag(default_language) + " " + inputs)
            tagged = tf.ones_like(tagged)
        tags = tf.strings.regex_replace(inputs, "(?s)(" + LANGUAGE_TAG + ").*", r"\1")
        text = tf.strings.regex_replace(inputs, LANGUAGE_TAG, "", replace_global=False)
        pieces = model.tokenize(tf.where(tagged, text, inputs))
        tag_pieces = tf.ragged.boolean_mask(tags[:, tf.newaxis], tagged[:, tf.newaxis])
        pieces = tf.concat([tag_pieces, pieces], axis=1)
        ids = tf.ragged.map_flat_values(table.lookup, pieces)
        return ids[0] if unbatched else ids

    @preprocessing_function
    def tokenize(self, inputs):
        """Source text to token ids (no end token), with `source.spm`; the
        `target_language` token first where a text has no language token."""
        return self._tokenize_with(False, inputs, self.target_language)

    @preprocessing_function
    def tokenize_target(self, inputs):
        """Target text to token ids (no end token), with `target.spm`."""
        return self._tokenize_with(True, inputs)

    @preprocessing_function
    def detokenize(self, inputs):
        """Token ids to text: special tokens dropped, pieces joined by `target.spm`."""
        self._check_vocabulary()
        if tf_text is None:
            special = {self.start_token_id, self.end_token_id, self.pad_token_id, self.unk_token_id}
            return python_tokenization.detokenize(self._target_sp, self._target_pieces, special, inputs)
        self._restore_tf_resources()
        inputs, unbatched, _ = convert_to_ragged_batch(inputs)
        inputs = tf.cast(inputs, tf.int32)
        special = tf.reduce_any(inputs.flat_values[:, None] == self._special_ids[None, :], axis=-1)
        kept = tf.ragged.boolean_mask(inputs, tf.logical_not(inputs.with_flat_values(special)))
        pieces = tf.ragged.map_flat_values(tf.gather, self._id_to_piece, kept)
        text = self._target_sp.detokenize(pieces)
        # Pieces the target model lacks come out verbatim, "▁" included.
        text = tf.strings.strip(tf.strings.regex_replace(text, WORD_START, " "))
        return tf.squeeze(text, 0) if unbatched else text

    def save_assets(self, dir_path: str) -> None:
        Path(dir_path, SOURCE_SPM).write_bytes(self.source_proto)
        Path(dir_path, TARGET_SPM).write_bytes(self.target_proto)
        vocabularies = {VOCABULARY_JSON: self.vocabulary, TARGET_VOCABULARY_JSON: self.target_vocabulary}
        for name, vocabulary in vocabularies.items():
            if vocabulary is not None:
                Path(dir_path, name).write_text(json.dumps(vocabulary, ensure_ascii=False), encoding="utf-8")

    def load_assets(self, dir_path: str) -> None:
        self.set_vocabulary(*(os.path.join(dir_path, name) for name in self.file_assets))

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            {
                # The models and the vocabulary are saved as assets.
                "source_proto": None,
                "target_proto": None,
                "vocabulary": None,
                "target_vocabulary": None,
                "separate_vocabularies": self.separate_vocabularies,
                "target_language": self.target_language,
                "start_token": self.start_token,
                "end_token": self.end_token,
                "pad_token": self.pad_token,
                "unk_token": self.unk_token,
            }
        )
        return config
