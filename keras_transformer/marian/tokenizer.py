"""Marian's tokenizer: two SentencePiece models, one vocabulary, in a TF graph.

An Opus-MT repo holds `source.spm` (segments the source language),
`target.spm` (segments the target language and joins outputs back into
text) and `vocab.json`, one map from piece strings to the model's ids
shared by both languages. The SentencePiece models' own ids are never used:
every piece is looked up in `vocab.json`, and a piece it lacks becomes
`<unk>`. A leading language tag such as `>>fra<<` (multilingual models) is
one token, kept out of SentencePiece.

Everything runs as TensorFlow ops (tf_text's SentencePiece op and a
`tf.lookup.StaticHashTable`), so the tokenizer works in `tf.data` and in an
exported SavedModel, like KerasHub's own tokenizers.
"""

import json
import os
from pathlib import Path

import keras
import keras_hub

from keras_transformer.utils.library_internals import (
    add_special_token,
    convert_to_ragged_batch,
    preprocessing_function,
    update_special_token_ids,
)
from keras_transformer.models.transformer_backbone import TransformerBackbone
from keras_transformer.utils.text_libraries import require_text_libraries, tf, tf_text

SOURCE_SPM, TARGET_SPM, VOCABULARY_JSON = "source.spm", "target.spm", "vocab.json"
WORD_START = "\u2581"  # SentencePiece's "▁"
# transformers' MarianTokenizer.remove_language_code: ">>" up to the first "<<".
LANGUAGE_TAG = r"^>>.*?<<"


def _read_bytes(value) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return Path(value).read_bytes()


def _read_vocabulary(value) -> dict | None:
    if value is None or isinstance(value, dict):
        return value
    return json.loads(Path(value).read_text(encoding="utf-8"))


@keras.saving.register_keras_serializable(package="keras_transformer")
class MarianTokenizer(keras_hub.tokenizers.Tokenizer):
    """Source and target SentencePiece models mapped through one `vocab.json`.

    `tokenize` (and calling the layer) segments source text with the source
    model; `tokenize_target` segments target text with the target model;
    `detokenize` drops the special tokens and joins pieces with the target
    model, as `transformers`' `MarianTokenizer.decode(...,
    skip_special_tokens=True)` does. No end token is added here: the
    preprocessor packs sequences.

    Special tokens come from the model's config: `end_token` is `</s>`,
    `pad_token` is `<pad>` (the last id), and `start_token`, the decoder's
    first input, is `<pad>` too in every Opus-MT model.

    Args:
        source_proto: `source.spm` (bytes or a path).
        target_proto: `target.spm` (bytes or a path).
        vocabulary: `vocab.json` (a dict piece -> id, or a path).
        start_token, end_token, pad_token, unk_token: their pieces.

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
        **kwargs,
    ):
        require_text_libraries(type(self).__name__)
        super().__init__(**kwargs)
        self.file_assets = [SOURCE_SPM, TARGET_SPM, VOCABULARY_JSON]
        add_special_token(self, start_token, "start_token")
        add_special_token(self, end_token, "end_token")
        add_special_token(self, pad_token, "pad_token")
        add_special_token(self, unk_token, "unk_token")
        self.set_vocabulary(source_proto, target_proto, vocabulary)

    def set_vocabulary(self, source_proto, target_proto, vocabulary) -> None:
        """Sets (or replaces) both SentencePiece models and the shared vocabulary."""
        self.source_proto = _read_bytes(source_proto)
        self.target_proto = _read_bytes(target_proto)
        vocabulary = _read_vocabulary(vocabulary)
        if vocabulary is None:
            self.vocabulary = None
            return
        size = len(vocabulary)
        if sorted(vocabulary.values()) != list(range(size)):
            raise ValueError(f"vocab.json must number its {size} pieces 0 to {size - 1}, each once.")
        self.vocabulary = dict(vocabulary)
        self._pieces = [None] * size
        for piece, index in vocabulary.items():
            self._pieces[index] = piece
        update_special_token_ids(self)
        self._build_tf_resources()

    def _build_tf_resources(self) -> None:
        with tf.init_scope():
            self._source_sp = tf_text.SentencepieceTokenizer(self.source_proto, out_type=tf.string)
            self._target_sp = tf_text.SentencepieceTokenizer(self.target_proto, out_type=tf.string)
            self._piece_to_id = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(
                    tf.constant(self._pieces), tf.range(len(self._pieces), dtype=tf.int32)
                ),
                default_value=self.unk_token_id,
            )
            self._id_to_piece = tf.constant(self._pieces)
            special = sorted({self.start_token_id, self.end_token_id, self.pad_token_id, self.unk_token_id})
            self._special_ids = tf.constant(special, tf.int32)

    def _restore_tf_resources(self) -> None:
        """Rebuilds the TF resources if `tf.random.set_seed` dropped them
        (see `TransformerTokenizer._restore_sentence_piece`)."""
        with tf.init_scope():
            try:
                self._piece_to_id.size()
                self._source_sp.vocab_size()
            except tf.errors.NotFoundError:
                self._build_tf_resources()

    def _check_vocabulary(self) -> None:
        if self.vocabulary is None:
            raise ValueError(
                "No vocabulary has been set for MarianTokenizer: pass source_proto, target_proto "
                "and vocabulary."
            )

    def tf_resources(self) -> list:
        """The TF resources its ops read (both SentencePiece models and the
        vocabulary's lookup table): a SavedModel that tokenizes in its graph
        must track them to save them."""
        self._check_vocabulary()
        return [self._source_sp, self._target_sp, self._piece_to_id]

    # --- Vocabulary -----------------------------------------------------

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

    # --- Tokenizing -----------------------------------------------------

    def _tokenize_with(self, model, inputs):
        self._check_vocabulary()
        self._restore_tf_resources()
        inputs = tf.convert_to_tensor(inputs)
        unbatched = inputs.shape.rank == 0
        if unbatched:
            inputs = inputs[tf.newaxis]
        tagged = tf.strings.regex_full_match(inputs, "(?s)" + LANGUAGE_TAG + ".*")
        tags = tf.strings.regex_replace(inputs, "(?s)(" + LANGUAGE_TAG + ").*", r"\1")
        text = tf.strings.regex_replace(inputs, LANGUAGE_TAG, "", replace_global=False)
        pieces = model.tokenize(tf.where(tagged, text, inputs))
        tag_pieces = tf.ragged.boolean_mask(tags[:, tf.newaxis], tagged[:, tf.newaxis])
        pieces = tf.concat([tag_pieces, pieces], axis=1)
        ids = tf.ragged.map_flat_values(self._piece_to_id.lookup, pieces)
        return ids[0] if unbatched else ids

    @preprocessing_function
    def tokenize(self, inputs):
        """Source text to token ids (no end token), with `source.spm`."""
        return self._tokenize_with(self._source_sp, inputs)

    @preprocessing_function
    def tokenize_target(self, inputs):
        """Target text to token ids (no end token), with `target.spm`."""
        return self._tokenize_with(self._target_sp, inputs)

    @preprocessing_function
    def detokenize(self, inputs):
        """Token ids to text: special tokens dropped, pieces joined by `target.spm`."""
        self._check_vocabulary()
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

    # --- Saving ---------------------------------------------------------

    def save_assets(self, dir_path: str) -> None:
        Path(dir_path, SOURCE_SPM).write_bytes(self.source_proto)
        Path(dir_path, TARGET_SPM).write_bytes(self.target_proto)
        Path(dir_path, VOCABULARY_JSON).write_text(
            json.dumps(self.vocabulary, ensure_ascii=False), encoding="utf-8"
        )

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
                "start_token": self.start_token,
                "end_token": self.end_token,
                "pad_token": self.pad_token,
                "unk_token": self.unk_token,
            }
        )
        return config
