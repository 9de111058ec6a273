"""Tokenize, add start/end tokens and pad: strings in, model inputs out."""

import sys
import warnings

import keras
import keras_hub
import numpy as np

from keras_transformer.generation.settings import LENGTH_BUCKET, bucketed
from keras_transformer.models.transformer_backbone import TransformerBackbone
from keras_transformer.models.transformer_tokenizer import TransformerTokenizer
from keras_transformer.utils.text_libraries import tf

TOO_LONG_POLICIES = ("warn", "error")
# Positions a packed source adds to its tokens: <s> and </s> (Marian's
# sources have no <s>, and the one spare position only pads).
SOURCE_SPECIAL_ROOM = 2


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerPreprocessor(keras_hub.models.Seq2SeqLMPreprocessor):
    """Turns `{"encoder_text", "decoder_text"}` into `(x, y, sample_weight)`.

    Both sides are tokenized with the one shared `TransformerTokenizer`,
    wrapped in `<s> ... </s>` and padded. `x` holds the source ids, the target
    ids shifted right (teacher forcing) and both padding masks; `y` is the
    target shifted left and `sample_weight` is zero on padding, so padding
    counts neither in the loss nor in the metrics.

    A sentence longer than the sequence length is cut by the packer; that is
    never silent here. `too_long="warn"` (default) warns with the number of
    sentences cut in each batch (in a `tf.data` pipeline the warning goes to
    stderr); `too_long="error"` raises instead. For training data, filter or
    bucket by length before this layer (see `keras_transformer.training.data`).

    Args:
        tokenizer: a `TransformerTokenizer`.
        encoder_sequence_length: padded source length, start and end included.
        decoder_sequence_length: padded target length.
        too_long: `"warn"` or `"error"`, what to do when a sentence is cut.

    Example:
    >>> from keras_transformer import train_tokenizer
    >>> tokenizer = train_tokenizer(["a dog runs .", "ein hund rennt ."] * 20, 40)
    >>> preprocessor = TransformerPreprocessor(tokenizer, 8, 8)
    >>> x, y, w = preprocessor({"encoder_text": ["a dog"], "decoder_text": ["ein hund"]})
    >>> sorted(x)
    ['decoder_padding_mask', 'decoder_token_ids', 'encoder_padding_mask', 'encoder_token_ids']
    """

    backbone_cls = TransformerBackbone
    tokenizer_cls = TransformerTokenizer
    source_start_token = True  # sources begin with <s>; Marian's do not

    def __init__(
        self,
        tokenizer: TransformerTokenizer,
        encoder_sequence_length: int = 128,
        decoder_sequence_length: int = 128,
        too_long: str = "warn",
        **kwargs,
    ):
        if too_long not in TOO_LONG_POLICIES:
            raise ValueError(f"too_long must be one of {TOO_LONG_POLICIES}; got {too_long!r}.")
        super().__init__(
            tokenizer=tokenizer,
            encoder_sequence_length=encoder_sequence_length,
            decoder_sequence_length=decoder_sequence_length,
            **kwargs,
        )
        self.too_long = too_long

    def _report_cut(self, token_ids, max_tokens, side):
        """Counts sentences longer than `max_tokens` tokens and warns or raises."""
        if isinstance(token_ids, tf.RaggedTensor):
            lengths = token_ids.row_lengths()
        else:  # KerasHub hands eager callers Python lists.
            lengths = tf.constant([len(ids) for ids in token_ids], "int64")
        count = tf.reduce_sum(tf.cast(lengths > max_tokens, "int32"))
        message = (
            f"{{}} {side} sentence(s) longer than {max_tokens} tokens were cut to fit "
            f"the {side} sequence length. Raise the sequence length, or filter "
            "long sentences out (too_long='error' raises instead)."
        )
        if tf.executing_eagerly():
            if int(count) == 0:
                return
            if self.too_long == "error":
                raise ValueError(message.format(int(count)))
            warnings.warn(message.format(int(count)), stacklevel=3)
        elif self.too_long == "error":
            tf.debugging.assert_equal(count, 0, message=message.format("Some"))
        else:
            tf.cond(
                count > 0,
                lambda: tf.print("WARNING:", tf.strings.format(message, count), output_stream=sys.stderr),
                lambda: tf.no_op(),
            )

    def call(self, x, y=None, sample_weight=None, **kwargs):
        self._check_input_lengths(x, kwargs)
        return super().call(x, y, sample_weight, **kwargs)

    def generate_preprocess(self, x, **kwargs):
        self._check_input_lengths(x, kwargs, decoder=False)
        return super().generate_preprocess(x, **kwargs)

    def _check_input_lengths(self, x, kwargs, decoder=True):
        # Tokenizing twice is cheap next to the model, and keeps KerasHub's
        # packing code unchanged.
        encoder_text = x["encoder_text"] if isinstance(x, dict) else x
        encoder_length = kwargs.get("encoder_sequence_length") or self.encoder_sequence_length
        self._report_cut(self._tokenize(encoder_text), encoder_length - 2, "source")
        if decoder and isinstance(x, dict) and "decoder_text" in x:
            decoder_length = (
                kwargs.get("decoder_sequence_length") or kwargs.get("sequence_length") or self.decoder_sequence_length
            )
            # The target keeps one token fewer: inputs and labels are shifted.
            self._report_cut(self._tokenize(x["decoder_text"]), decoder_length - 1, "target")

    def pack_sources(self, rows: list[list[int]], bucket: int = LENGTH_BUCKET) -> dict:
        """Token id lists packed as this preprocessor packs sources, as arrays.

        The length is padded to the next multiple of `bucket`, so that a
        compiled decoder sees few shapes.
        """
        width = bucketed(max((len(ids) for ids in rows), default=0) + SOURCE_SPECIAL_ROOM, bucket)
        if not self.built:
            self.build(None)
        # The encoder packer's layout written in NumPy: the server packs every
        # batch, and KerasHub's packer takes milliseconds of TensorFlow ops.
        packer = self.encoder_packer
        start, end = list(packer.start_value or []), list(packer.end_value or [])
        token_ids = np.full((len(rows), width), packer.pad_value or 0, "int32")
        padding_mask = np.zeros((len(rows), width), bool)
        for row, ids in enumerate(rows):
            packed = [*start, *ids, *end]
            token_ids[row, : len(packed)] = packed
            padding_mask[row, : len(packed)] = True
        return {"encoder_token_ids": token_ids, "encoder_padding_mask": padding_mask}

    def generate_postprocess(self, x):
        """KerasHub's `generate_postprocess`: token ids to strings, padding and
        special tokens left out. A batch of NumPy arrays (what `generate` and
        the server decode) is stripped in NumPy, a tenth of the time of
        KerasHub's ragged TensorFlow ops, and detokenized as KerasHub does."""
        token_ids, padding_mask = x["decoder_token_ids"], x["decoder_padding_mask"]
        if not (isinstance(token_ids, np.ndarray) and isinstance(padding_mask, np.ndarray) and token_ids.ndim == 2):
            return super().generate_postprocess(x)
        special = set(self.tokenizer.special_token_ids)
        rows = [
            [int(token) for token, kept in zip(ids, mask) if kept and token not in special]
            for ids, mask in zip(token_ids.tolist(), padding_mask.tolist())
        ]
        return self.tokenizer.detokenize(rows) if rows else []

    def pack_source_tensor(self, token_ids, width: int, bucket: int = LENGTH_BUCKET) -> tuple:
        """`pack_sources` in TensorFlow ops, for graphs (the SavedModel's) too.

        Packs ragged ids at the fixed `width` (a graph's packer needs a
        static length), then keeps the next multiple of `bucket` after the
        longest row, at most `width`. Returns `(token_ids, padding_mask)`.
        """
        if not self.built:
            self.build(None)
        ids, mask = self.encoder_packer(token_ids, sequence_length=width)
        # (The maximum of no lengths is the lowest integer, hence the 0.)
        longest = tf.maximum(tf.reduce_max(tf.cast(token_ids.row_lengths(), "int32")), 0) + SOURCE_SPECIAL_ROOM
        length = tf.minimum(bucketed(longest, bucket), width)
        return ids[:, :length], mask[:, :length]

    def _tokenize(self, text):
        text = tf.convert_to_tensor(text)
        if text.shape.rank == 0:
            text = text[tf.newaxis]
        return self.tokenizer(text)

    def get_config(self):
        # KerasHub's Seq2SeqLMPreprocessor leaves its sequence lengths out.
        config = super().get_config()
        config.update(
            {
                "encoder_sequence_length": self.encoder_sequence_length,
                "decoder_sequence_length": self.decoder_sequence_length,
                "too_long": self.too_long,
            }
        )
        return config
