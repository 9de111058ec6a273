"""Marian checkpoints as this project's backbone and preprocessor.

`load_marian` reads, in this order, `config.json` (checked and converted
before anything else is fetched), `vocab.json` (and `target_vocab.json` if
the target has its own vocabulary), `source.spm` and `target.spm` (checked
against the config), then the weights: one file, the
first of `model.safetensors`, `model.safetensors.index.json` and
`tf_model.h5` that the checkpoint has; never `pytorch_model.bin`.
"""

import json

from keras_transformer.marian.config import MarianConfigError, backbone_arguments, special_ids
from keras_transformer.marian.convert import load_marian_weights
from keras_transformer.marian.hub import CheckpointFiles
from keras_transformer.marian.preprocessor import MarianPreprocessor
from keras_transformer.marian.tokenizer import (
    SOURCE_SPM,
    TARGET_SPM,
    TARGET_VOCABULARY_JSON,
    VOCABULARY_JSON,
    MarianTokenizer,
)
from keras_transformer.marian.weights import read_weights
from keras_transformer.models.transformer_backbone import TransformerBackbone

# transformers' MarianTokenizer.model_max_length: the longest input Opus-MT takes.
MAX_INPUT_TOKENS = 512


def load_marian(
    handle: str, load_weights: bool = True, revision: str | None = None, dtype=None
) -> tuple[TransformerBackbone, MarianPreprocessor]:
    """Builds the backbone and preprocessor of a Marian checkpoint.

    Args:
        handle: `hf://org/name` (e.g. `hf://Helsinki-NLP/opus-mt-en-de`) or
            a folder written by `transformers`' `save_pretrained`.
        load_weights: convert the weights, or leave the backbone random.
        revision: a branch, tag or commit of a Hub repo.
        dtype: the backbone's dtype (e.g. `"float16"`); float32 by default.

    Raises:
        MarianConfigError: not a Marian checkpoint, or one the backbone
            cannot represent (the field and its value are named).
        ValueError: the vocabulary does not fit the config.
        PickleOnlyError: the weights exist only as `pytorch_model.bin`.
        HubUnreachableError, NotOnHubError: see `keras_transformer.presets.resolution`.
    """
    files = CheckpointFiles(handle, revision)
    preprocessor = marian_preprocessor(files)
    backbone = marian_backbone(files, preprocessor.tokenizer, load_weights, dtype=dtype)
    return backbone, preprocessor


def marian_preprocessor(files: CheckpointFiles, **kwargs) -> MarianPreprocessor:
    """The preprocessor (and tokenizer) of a Marian checkpoint, its config
    checked first; `kwargs` go to `MarianPreprocessor` (e.g.
    `encoder_sequence_length`, by default the longest input Opus-MT takes)."""
    config = files.config()
    arguments = backbone_arguments(config, files.name)
    tokenizer = _tokenizer(
        files, arguments["vocabulary_size"], special_ids(config, files.name), arguments["target_vocabulary_size"]
    )
    length = min(MAX_INPUT_TOKENS, arguments["max_sequence_length"])
    kwargs = {"encoder_sequence_length": length, "decoder_sequence_length": length, **kwargs}
    return MarianPreprocessor(tokenizer, **kwargs)


def marian_backbone(
    files: CheckpointFiles,
    tokenizer: MarianTokenizer,
    load_weights: bool = True,
    backbone_cls: type[TransformerBackbone] = TransformerBackbone,
    **kwargs,
) -> TransformerBackbone:
    """The backbone of a Marian checkpoint, with the special ids of its config
    and `tokenizer`; `kwargs` replace the config's arguments (e.g. `dtype`)."""
    config = files.config()
    ids = special_ids(config, files.name)
    arguments = {
        **backbone_arguments(config, files.name),
        "pad_token_id": ids.pad,
        "start_token_id": ids.start,
        "end_token_id": ids.end,
        "unk_token_id": tokenizer.unk_token_id,
        **kwargs,
    }
    backbone = backbone_cls(**arguments)
    if load_weights:
        load_marian_weights(backbone, read_weights(files, files.name), files.name, config)
    return backbone


def _tokenizer(
    files: CheckpointFiles, vocabulary_size: int, ids, target_vocabulary_size: int | None = None
) -> MarianTokenizer:
    """The tokenizer, its vocabularies checked against the config's sizes;
    `target_vocabulary_size` for a checkpoint with separate vocabularies."""
    separate = target_vocabulary_size is not None
    sizes = {VOCABULARY_JSON: ("vocab_size", vocabulary_size)}
    if separate:
        sizes[TARGET_VOCABULARY_JSON] = ("decoder_vocab_size", target_vocabulary_size)
    paths, vocabularies = {}, {}
    for name in (*sizes, SOURCE_SPM, TARGET_SPM):
        paths[name] = files(name)
        if paths[name] is None:
            raise FileNotFoundError(f"{files.name} has no {name}, which Marian's tokenizer needs.")
    for name, (field, size) in sizes.items():
        vocabularies[name] = json.loads(paths[name].read_text(encoding="utf-8"))
        if len(vocabularies[name]) != size:
            raise MarianConfigError(
                f"Cannot load {files.name}: {name} has {len(vocabularies[name])} pieces but config.json "
                f"has {field} = {size}; the vocabulary does not belong to these weights."
            )
    # The special ids are target ids.
    target = vocabularies[TARGET_VOCABULARY_JSON if separate else VOCABULARY_JSON]
    pieces = {index: piece for piece, index in target.items()}
    return MarianTokenizer(
        source_proto=paths[SOURCE_SPM],
        target_proto=paths[TARGET_SPM],
        vocabulary=vocabularies[VOCABULARY_JSON],
        target_vocabulary=vocabularies.get(TARGET_VOCABULARY_JSON),
        start_token=pieces[ids.start],
        end_token=pieces[ids.end],
        pad_token=pieces[ids.pad],
    )


def is_transformers_checkpoint(handle: str, revision: str | None = None) -> bool:
    """Whether `handle` (`hf://...` or a folder) holds a `transformers`
    checkpoint (a `config.json` with a `model_type`) rather than a KerasHub
    preset. `False` when that cannot be found out (e.g. offline and not
    cached): the preset loader then reports the problem. With a `revision`,
    which only `transformers` checkpoints take, the problem is raised here.
    """
    try:
        files = CheckpointFiles(handle, revision)
        return "model_type" in files.config()
    except (OSError, ValueError):
        if revision is not None:
            raise
        return False
