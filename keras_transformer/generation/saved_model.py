"""A translation model as a TensorFlow SavedModel: strings in, strings out.

`export_saved_model` writes a SavedModel that translates a batch of sentences
(`tf.string`, shape `[None]`) inside the graph: tokenization and packing as the
model's preprocessor does them (a native preset's SentencePiece model, or a
Marian model's `source.spm`, vocabulary table and `target.spm`), the encoder,
the beam search of section 6.1 (`generation.decoding.search_step`) and
detokenization. Loading it needs TensorFlow and tensorflow_text only, so
TensorFlow Serving, or any TensorFlow program, can serve it:

    import tensorflow as tf
    import tensorflow_text  # registers the SentencePiece ops
    translate = tf.saved_model.load("export/en_de").signatures["serving_default"]
    translate(inputs=tf.constant(["Two dogs play in the snow."]))["outputs"]

Signatures: `serving_default(inputs)`, beam search with the beam size and
alpha given at export; `translate_with_options(inputs, alpha, greedy)`, the
same beam size with alpha as an input, or greedy search. A multilingual
model is exported with one target language, whose token (`>>deu<<`) starts
every input that has none.

Unlike `Transformer.translate`, the graph does not split sentences (that is
Python): an input longer than `model.max_source_tokens` is truncated, as
`translate(too_long="truncate", split_sentences=False)` does; an empty input
translates to `""`. Export runs on the TensorFlow backend only;
`keras-transformer export` starts TensorFlow itself.
"""

import os
from pathlib import Path

import keras

from keras_transformer.generation.decoding import search_step
from keras_transformer.generation.settings import SearchSettings
from keras_transformer.models.transformer_preprocessor import SOURCE_SPECIAL_ROOM
from keras_transformer.speed_paths.runtime import describe_runtime
from keras_transformer.speed_paths.search_kernels import search_kernels
from keras_transformer.utils.files import folder_replaced_atomically
from keras_transformer.utils.language_tags import LANGUAGE_TAG, language_tag

OUTPUT_KEY = "outputs"


def export_saved_model(
    model,
    directory: str | os.PathLike,
    *,
    search: SearchSettings | None = None,
    beam_size: int | str = "auto",
    alpha: float | None = None,
    max_extra_length: int | None = None,
    overwrite: bool = False,
    target_language: str | None = None,
) -> Path:
    """Writes `model` as a SavedModel that translates strings in its graph.

    The SavedModel is written into a temporary folder next to `directory`
    and renamed into place when complete
    (`keras_transformer.utils.files.folder_replaced_atomically`), so a
    failed export leaves nothing half-written behind.

    Args:
        model: a `keras_transformer.Transformer` with a preprocessor
            (a native preset or a Marian / Opus-MT model).
        directory: the folder to create; it must not exist, or be empty,
            unless `overwrite`.
        search: the search of `serving_default` and the default of
            `translate_with_options` (whose greedy input needs no beam
            size); by default section 6.1's, `SearchSettings()`.
        beam_size, alpha, max_extra_length: instead of `search`'s (`"auto"`
            and `None` keep it), as in `Transformer.generate`.
        overwrite: replace an existing, non-empty `directory`.
        target_language: for a multilingual model, the language to
            translate into (e.g. `"deu"`), as in `Transformer.translate`.

    Returns:
        The SavedModel folder.

    Raises:
        RuntimeError: Keras runs on another backend than TensorFlow.
        ValueError: the model has no preprocessor, a bad search argument,
            or a multilingual model without a known target language.
        FileExistsError: `directory` holds files and `overwrite` is False.
    """
    backend = describe_runtime().backend
    if backend != "tensorflow":
        raise RuntimeError(
            f"Exporting a SavedModel needs the TensorFlow backend; Keras runs on "
            f"{backend!r}. Set KERAS_BACKEND=tensorflow before Keras "
            "is imported (`keras-transformer export` does so itself)."
        )
    if model.preprocessor is None:
        raise ValueError("The model has no preprocessor (tokenizer); a SavedModel that takes strings needs one.")
    settings = (search or SearchSettings()).overridden(
        beam_size=beam_size, alpha=alpha, max_extra_length=max_extra_length
    )
    if settings.beam_size is None:
        raise ValueError("beam_size must be a positive integer; greedy search is an input of the exported model.")
    # Checks the language (or its absence) as `translate` does, before any work.
    model.preprocessor.tokenizer.with_target_language([""], target_language)

    target = Path(directory).resolve()
    if target.exists() and not target.is_dir():
        raise FileExistsError(f"{target} exists and is not a folder; choose another export folder.")
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        raise FileExistsError(f"{target} is not empty; pass overwrite=True (--overwrite) to replace it.")
    with folder_replaced_atomically(target) as folder:
        _export_archive(model, settings, target_language).write_out(str(folder), verbose=False)
    return target


def _export_archive(model, settings: SearchSettings, target_language: str | None = None):
    """A `keras.export.ExportArchive` holding the model and its two signatures."""
    import tensorflow as tf

    preprocessor = model.preprocessor
    if not preprocessor.built:
        preprocessor.build(None)  # makes the packers
    tokenizer = preprocessor.tokenizer
    backbone = model.backbone
    max_source_tokens = model.max_source_tokens
    special_ids = [backbone.pad_token_id, backbone.start_token_id, backbone.end_token_id]
    tag_ids = tokenizer.language_tag_ids()
    # A traced search, as `translate`'s (TensorFlow runs it without XLA): the same kernels.
    kernels = search_kernels(describe_runtime(), jit_compile=False, traced=True)

    def pack(texts):
        """Token ids, mask and token counts; ids and mask packed as `translate` packs them."""
        if target_language is not None:
            untagged = tf.logical_not(tf.strings.regex_full_match(texts, LANGUAGE_TAG + ".*"))
            texts = tf.where(untagged, language_tag(target_language) + " " + texts, texts)
        token_ids = tokenizer(texts)[:, :max_source_tokens]
        ids, mask = preprocessor.pack_source_tensor(token_ids, width=max_source_tokens + SOURCE_SPECIAL_ROOM)
        lengths = token_ids.row_lengths()
        if tag_ids:
            # A language token alone is no text (`translate`).
            first = token_ids[:, :1].to_tensor(default_value=-1)[:, 0]
            lengths -= tf.cast(tf.reduce_any(first[:, None] == tf.constant(tag_ids, first.dtype), axis=-1), "int64")
        return ids, tf.cast(mask, "int32"), lengths

    def translate(texts, beam, alpha_value):
        ids, mask, lengths = pack(texts)
        batch = tf.shape(ids)[0]
        buffer = tf.zeros((batch, tf.shape(ids)[1] + settings.max_extra_length), "int32")
        outputs = search_step(
            backbone,
            {"encoder_token_ids": ids, "encoder_padding_mask": mask, "decoder_token_ids": buffer},
            beam_size=beam,
            alpha=alpha_value,
            max_extra_length=settings.max_extra_length,
            kernels=kernels,
        )
        tokens = outputs["decoder_token_ids"]
        keep = tf.reduce_all(tokens[:, :, None] != tf.constant(special_ids, "int32"), axis=-1)
        texts_out = tokenizer.detokenize(tf.ragged.boolean_mask(tokens, keep))
        # As `translate`: a sentence without tokens is "" without decoding.
        return tf.where(lengths > 0, texts_out, "")

    def serving_default(inputs):
        return {OUTPUT_KEY: translate(inputs, settings.beam_size, settings.alpha)}

    def translate_with_options(inputs, alpha, greedy):
        return {
            OUTPUT_KEY: tf.cond(
                greedy,
                lambda: translate(inputs, None, 0.0),
                lambda: translate(inputs, settings.beam_size, alpha),
            )
        }

    archive = keras.export.ExportArchive()
    archive.track(model)
    texts_spec = tf.TensorSpec([None], tf.string, name="inputs")
    archive.add_endpoint("serving_default", serving_default, input_signature=[texts_spec])
    archive.add_endpoint(
        "translate_with_options",
        translate_with_options,
        input_signature=[
            texts_spec,
            tf.TensorSpec([], tf.float32, name="alpha"),
            tf.TensorSpec([], tf.bool, name="greedy"),
        ],
    )
    # The SentencePiece models (their protos are saved with them) and Marian's
    # vocabulary table are TF resources; tracked after tracing, which may
    # have rebuilt them.
    for resource in tokenizer.tf_resources():
        archive.track(resource)
    return archive
