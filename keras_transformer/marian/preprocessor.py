"""Marian's packing: `ids </s>` for the source, `<pad> ids </s>` for the target."""

import keras
from keras_hub.layers import StartEndPacker

from keras_transformer.marian.tokenizer import MarianTokenizer
from keras_transformer.models.transformer_preprocessor import TransformerPreprocessor
from keras_transformer.utils.library_internals import preprocessing_function
from keras_transformer.utils.text_libraries import tf


@keras.saving.register_keras_serializable(package="keras_transformer")
class MarianPreprocessor(TransformerPreprocessor):
    """`TransformerPreprocessor` with Marian's tokenizer and packing.

    Marian models read the source as its pieces followed by `</s>`, with no
    start token, and the decoder starts from `<pad>` (its decoder start
    token, whose embedding is zero): source `ids </s>`, decoder input
    `<pad> ids`, labels `ids </s>`. The source is segmented with
    `source.spm`, the target with `target.spm` (each side with its own
    vocabulary's ids, if the model has two). Padding masks come from the
    packing, not from the token values, since the decoder start is the
    padding id. A multilingual model's target-language token is the
    tokenizer's (`MarianTokenizer(target_language=...)`).

    Args:
        tokenizer: a `MarianTokenizer`.
        encoder_sequence_length: padded source length, `</s>` included.
        decoder_sequence_length: padded target length.
        too_long: `"warn"` or `"error"`, see `TransformerPreprocessor`.
    """

    tokenizer_cls = MarianTokenizer
    source_start_token = False

    def build(self, input_shape):
        tokenizer = self.tokenizer
        self.encoder_packer = StartEndPacker(
            start_value=None,
            end_value=tokenizer.source_end_token_id,
            pad_value=tokenizer.source_pad_token_id,
            sequence_length=self.encoder_sequence_length,
            return_padding_mask=True,
        )
        self.decoder_packer = StartEndPacker(
            start_value=tokenizer.start_token_id,
            end_value=tokenizer.end_token_id,
            pad_value=tokenizer.pad_token_id,
            sequence_length=self.decoder_sequence_length,
            return_padding_mask=True,
        )
        self.built = True

    @preprocessing_function
    def call(
        self,
        x,
        y=None,
        sample_weight=None,
        *,
        encoder_sequence_length=None,
        decoder_sequence_length=None,
        sequence_length=None,
    ):
        encoder_length = encoder_sequence_length or self.encoder_sequence_length
        decoder_length = decoder_sequence_length or sequence_length or self.decoder_sequence_length
        source = self.tokenizer(_batch(x["encoder_text"]))
        target = self.tokenizer.tokenize_target(_batch(x["decoder_text"]))
        self._report_cut(source, encoder_length - 1, "source")
        self._report_cut(target, decoder_length - 1, "target")
        encoder_token_ids, encoder_padding_mask = self.encoder_packer(source, sequence_length=encoder_length)
        decoder_token_ids, decoder_padding_mask = self.decoder_packer(target, sequence_length=decoder_length + 1)
        x = {
            "encoder_token_ids": encoder_token_ids,
            "encoder_padding_mask": encoder_padding_mask,
            "decoder_token_ids": decoder_token_ids[..., :-1],
            "decoder_padding_mask": decoder_padding_mask[..., :-1],
        }
        y = decoder_token_ids[..., 1:]
        sample_weight = decoder_padding_mask[..., 1:]
        return keras.utils.pack_x_y_sample_weight(x, y, sample_weight)

    @preprocessing_function
    def generate_preprocess(
        self, x, *, encoder_sequence_length=None, decoder_sequence_length=None, sequence_length=None
    ):
        if not self.built:
            self.build(None)
        encoder_text = x["encoder_text"] if isinstance(x, dict) else x
        encoder_length = encoder_sequence_length or self.encoder_sequence_length
        decoder_length = decoder_sequence_length or sequence_length or self.decoder_sequence_length
        source = self.tokenizer(_batch(encoder_text))
        self._report_cut(source, encoder_length - 1, "source")
        encoder_token_ids, encoder_padding_mask = self.encoder_packer(source, sequence_length=encoder_length)
        if isinstance(x, dict) and "decoder_text" in x:
            target = self.tokenizer.tokenize_target(_batch(x["decoder_text"]))
        else:
            # No target prefix: the decoder input is the start token alone.
            target = tf.RaggedTensor.from_row_lengths(tf.zeros([0], source.dtype), tf.zeros_like(source.row_lengths()))
        decoder_token_ids, decoder_padding_mask = self.decoder_packer(
            target, sequence_length=decoder_length, add_end_value=False
        )
        return {
            "encoder_token_ids": encoder_token_ids,
            "encoder_padding_mask": encoder_padding_mask,
            "decoder_token_ids": decoder_token_ids,
            "decoder_padding_mask": decoder_padding_mask,
        }


def _batch(text):
    text = tf.convert_to_tensor(text)
    return text[tf.newaxis] if text.shape.rank == 0 else text
