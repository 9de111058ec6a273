"""The shared source/target subword vocabulary (section 5.1)."""

import io
import os
from collections.abc import Iterable, Iterator

import keras
import keras_hub

from keras_transformer.models.transformer_backbone import TransformerBackbone
from keras_transformer.utils import library_internals, special_tokens
from keras_transformer.utils.special_tokens import END, END_ID, PAD, PAD_ID, START, START_ID, UNK, UNK_ID
from keras_transformer.utils.text_libraries import tf, tf_text


class TargetLanguages:
    """What translation asks a tokenizer about target languages.

    These defaults describe a model of one target language whose one
    vocabulary tokenizes both sides (`TransformerTokenizer`);
    `keras_transformer.marian.MarianTokenizer` overrides them for
    multilingual models (`>>deu<<` tokens) and separate target vocabularies.
    """

    target_vocabulary = None  # the target side shares the one vocabulary
    target_language = None  # no language token is added

    def target_languages(self) -> list[str]:
        """The languages chosen by a token (`>>deu<<`): none, there is one target language."""
        return []

    def language_tag_ids(self) -> list[int]:
        """The ids of target-language tokens: none."""
        return []

    def set_target_language(self, language: str | None) -> None:
        """Sets the language whose token `tokenize` adds: none here.

        Raises:
            ValueError: `language` is not None.
        """
        self.with_target_language([], language)

    def with_target_language(self, texts: list[str], language: str | None = None) -> list[str]:
        """`texts` as they are: a model of one target language takes no language.

        Raises:
            ValueError: `language` is given.
        """
        if language is not None:
            raise ValueError(
                f"This model has no target-language tokens (got target_language={language!r}): "
                "it translates into one language. Leave target_language out."
            )
        return list(texts)

    def tokenize_target(self, inputs):
        """Target text to token ids: the one vocabulary tokenizes both sides."""
        return self.tokenize(inputs)


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerTokenizer(TargetLanguages, keras_hub.tokenizers.SentencePieceTokenizer):
    """A SentencePiece tokenizer shared by source and target (section 5.1).

    The paper encodes both languages with one joint byte-pair vocabulary, so
    that the one embedding matrix of section 3.4 serves both. This is
    KerasHub's `SentencePieceTokenizer` with the special tokens the model
    needs: `<pad>` = 0, `<unk>` = 1, `<s>` = 2 (start of a target) and
    `</s>` = 3 (end of every sequence). Train a vocabulary with
    `train_tokenizer`.

    Args:
        proto: a serialized SentencePiece model (bytes) or the path of a
            `.spm` / `.model` file.

    Example:
    >>> tokenizer = train_tokenizer(
    ...     ["a dog runs .", "ein hund rennt ."] * 20, vocabulary_size=40)
    >>> ids = tokenizer("a dog runs .")
    >>> tokenizer.detokenize(ids)
    'a dog runs .'
    """

    backbone_cls = TransformerBackbone

    def __init__(self, proto=None, **kwargs):
        for piece, name in ((START, "start_token"), (END, "end_token"), (PAD, "pad_token")):
            library_internals.add_special_token(self, piece, name)
        super().__init__(proto=proto, **kwargs)

    def set_proto(self, proto):
        super().set_proto(proto)
        if proto is None:
            return
        expected = special_tokens.IDS
        actual = {piece: self.token_to_id(piece) for piece in expected}
        if actual != expected:
            raise ValueError(
                "This SentencePiece model does not have the special tokens that "
                f"TransformerTokenizer needs ({expected}); it has {actual}. "
                "Train the vocabulary with `keras_transformer.train_tokenizer`."
            )

    def tokenize(self, inputs):
        self._restore_sentence_piece()
        return super().tokenize(inputs)

    def detokenize(self, inputs):
        self._restore_sentence_piece()
        return super().detokenize(inputs)

    def tf_resources(self) -> list:
        """The TF resources its ops read (the SentencePiece model): a
        SavedModel that tokenizes in its graph must track them to save them."""
        return [library_internals.sentence_piece_op(self)]

    def _restore_sentence_piece(self):
        """Rebuilds SentencePiece's TF resource if TF has dropped it.

        `keras.utils.set_random_seed` calls `tf.random.set_seed`, which clears
        TF's eager kernel cache and with it the SentencePiece model of every
        tokenizer made before; tokenizing in `tf.data` then fails with "Resource
        ... SentencepieceOp ... does not exist". One cheap eager look-up finds
        out, at trace time or per eager call.
        """
        if tf_text is None:  # KerasHub tokenizes with `sentencepiece` itself
            return
        sentence_piece = library_internals.sentence_piece_op(self)
        if self.proto is None or not isinstance(sentence_piece, tf_text.SentencepieceTokenizer):
            return
        with tf.init_scope():
            try:
                sentence_piece.vocab_size()
            except tf.errors.NotFoundError:
                self.set_proto(self.proto)


def train_tokenizer(
    data: Iterable[str] | list[str | os.PathLike],
    vocabulary_size: int,
    model_type: str = "bpe",
    max_sentences: int = 2_000_000,
    **sentencepiece_options,
) -> TransformerTokenizer:
    """Trains one shared subword vocabulary on source and target text.

    KerasHub's `compute_sentence_piece_proto` cannot set the special token
    ids, so this calls SentencePiece's trainer directly with `<pad>`, `<unk>`,
    `<s>`, `</s>` at ids 0-3.

    Args:
        data: sentences (an iterable of strings; an iterator is streamed,
            not held in memory), or paths of text files with one sentence a
            line (plain or `.gz`); give both languages.
        vocabulary_size: number of subwords, the paper's ~37,000 for WMT
            English-German; about 8,000-10,000 suits Multi30k.
        model_type: `"bpe"` (the paper, English-German) or `"unigram"`.
        max_sentences: sample at most this many sentences for training.
        **sentencepiece_options: passed to `SentencePieceTrainer.train`.

    Returns:
        A `TransformerTokenizer`.
    """
    from keras_transformer.utils.files import read_lines

    if not isinstance(data, Iterator):  # an iterator of sentences streams; SentencePiece keeps its sample
        data = list(data)
    if isinstance(data, list) and data and all(isinstance(d, (str, os.PathLike)) and os.path.isfile(d) for d in data):
        sentences = (line for path in data for line in read_lines(path))
    else:
        sentences = iter(data)
    failure = []

    def nonempty():
        try:
            yield from (s for s in sentences if s.strip())
        except Exception as error:  # SentencePiece turns it into a RuntimeError of its own
            failure.append(error)
            raise

    model = io.BytesIO()
    try:
        _train_sentencepiece(nonempty(), model, vocabulary_size, model_type, max_sentences, sentencepiece_options)
    except RuntimeError:
        if failure:  # the sentences' own error, e.g. parallel files that are not line-aligned
            raise failure[0] from None
        raise
    return TransformerTokenizer(proto=model.getvalue())


def _train_sentencepiece(sentences, model, vocabulary_size, model_type, max_sentences, options) -> None:
    import sentencepiece

    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=sentences,
        model_writer=model,
        vocab_size=vocabulary_size,
        model_type=model_type,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=START_ID,
        eos_id=END_ID,
        pad_piece=PAD,
        unk_piece=UNK,
        bos_piece=START,
        eos_piece=END,
        character_coverage=1.0,
        input_sentence_size=max_sentences,
        shuffle_input_sentence=True,
        hard_vocab_limit=False,
        minloglevel=2,
        **options,
    )
