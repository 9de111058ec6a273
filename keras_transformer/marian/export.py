"""A model as a Marian checkpoint in `transformers` format: the way out.

`export_transformers(model, folder)` writes what `transformers`'
`MarianMTModel.from_pretrained` and `MarianTokenizer.from_pretrained` read,
and CTranslate2's `TransformersConverter` converts: `model.safetensors`
(float32), `config.json`, `generation_config.json` and the tokenizer's files
(`export_tokenizer`: the SentencePiece models, `vocab.json`, and
`target_vocab.json` for a model with separate vocabularies). It takes an Opus-MT model loaded here, fine-tuned or
not, and this project's own models; `export_weights` says how their weights
are rewritten, exactly, into Marian's form.

Marian's architecture is fixed where this project's backbone has options.
What it cannot express is refused before anything is written: Pre-LN layers,
a sinusoid wavelength other than 10000, an FFN activation other than ReLU,
swish or GELU, an untied output projection, quantized weights. One thing is
approximated, with a warning: Marian's LayerNorm epsilon is 1e-5 and cannot
be set, while this project's own models use 1e-6; each normalised value then
changes by about (1e-5 - 1e-6) / (2 variance), relative.
"""

import warnings
from pathlib import Path

import keras

from keras_transformer.marian.config import LAYER_NORM_EPSILON, MODEL_TYPE
from keras_transformer.marian.export_tokenizer import json_bytes, marian_vocabularies, tokenizer_files
from keras_transformer.marian.export_weights import MarianExportError, marian_tensors
from keras_transformer.marian.hub import CONFIG_FILE
from keras_transformer.marian.loader import MAX_INPUT_TOKENS
from keras_transformer.marian.weights import SAFETENSORS
from keras_transformer.models.transformer_backbone import TransformerBackbone
from keras_transformer.utils.files import folder_replaced_atomically

GENERATION_CONFIG = "generation_config.json"
# Keras activation -> the name `transformers` (ACT2FN) and CTranslate2 read.
ACTIVATION_NAMES = {"relu": "relu", "silu": "swish", "swish": "swish", "gelu": "gelu"}
MARIAN_WAVELENGTH = 10_000


def export_transformers(model: keras.Model, directory: str | Path, *, overwrite: bool = False) -> Path:
    """Writes `model` as a Marian checkpoint in `transformers` format.

    The folder is written next to `directory` under a temporary name and
    renamed when complete: an error leaves nothing half-written.

    Args:
        model: a `keras_transformer.Transformer` with its preprocessor.
        directory: the folder to create; it must not exist, or be empty,
            unless `overwrite`.
        overwrite: replace an existing, non-empty `directory`.

    Returns:
        The folder.

    Raises:
        MarianExportError: Marian cannot represent the model (the message
            says what), or it has no tokenizer.
        FileExistsError: `directory` is a file, or holds files and
            `overwrite` is False.

    Example:
    >>> from keras_transformer import Transformer
    >>> model = Transformer.from_preset("multi30k_en_de")  # doctest: +SKIP
    >>> folder = export_transformers(model, "multi30k_en_de_marian")  # doctest: +SKIP
    >>> from transformers import MarianMTModel, MarianTokenizer  # doctest: +SKIP
    >>> tokenizer = MarianTokenizer.from_pretrained(folder)  # doctest: +SKIP
    >>> marian = MarianMTModel.from_pretrained(folder)  # doctest: +SKIP
    >>> ids = marian.generate(**tokenizer(["Two dogs play in the snow."], return_tensors="pt"))  # doctest: +SKIP
    >>> tokenizer.batch_decode(ids, skip_special_tokens=True)  # doctest: +SKIP
    ['Zwei Hunde spielen im Schnee.']
    """
    backbone = model.backbone
    # Everything is computed, and every refusal made, before the folder is touched.
    source_pieces, target_pieces = marian_vocabularies(backbone, model.preprocessor)
    sizes = (len(source_pieces), None if target_pieces is None else len(target_pieces))
    files = {
        CONFIG_FILE: json_bytes(marian_config(backbone, *sizes)),
        GENERATION_CONFIG: json_bytes(generation_config(backbone, *sizes)),
        **tokenizer_files(backbone, model.preprocessor, source_pieces, target_pieces),
    }
    tensors = marian_tensors(backbone, *sizes)
    target = Path(directory)
    if target.exists() and not target.is_dir():
        raise FileExistsError(f"{target} exists and is not a folder; choose another export folder.")
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        raise FileExistsError(f"{target} is not empty; pass overwrite=True (--overwrite) to replace it.")
    from safetensors.numpy import save_file

    with folder_replaced_atomically(target) as folder:
        # "pt": the format `transformers` requires of a safetensors file's metadata.
        save_file(tensors, folder / SAFETENSORS, metadata={"format": "pt"})
        for name, content in files.items():
            (folder / name).write_bytes(content)
    return target.resolve()


def marian_config(
    backbone: TransformerBackbone, vocabulary_size: int, target_vocabulary_size: int | None = None
) -> dict:
    """The `config.json` of a Marian model computing what `backbone` does,
    with `vocabulary_size` (source) ids and `target_vocabulary_size` target
    ids if the target has its own vocabulary; the last target id is `<pad>`
    and the decoder start.

    Raises:
        MarianExportError: the backbone uses an option Marian does not have.
    """
    if backbone.normalize_first:
        raise MarianExportError(
            "The model is Pre-LN (normalize_first=True); Marian's layers are Post-LN and it has no "
            "final LayerNorms, so it cannot compute this model."
        )
    if backbone.activation not in ACTIVATION_NAMES:
        raise MarianExportError(
            f"The model's FFN activation is {backbone.activation!r}; a Marian checkpoint can hold "
            f"{sorted(ACTIVATION_NAMES)}."
        )
    wavelength = backbone.position_encoding.max_wavelength
    if wavelength != MARIAN_WAVELENGTH:
        raise MarianExportError(
            f"The model's sinusoids have max_wavelength {wavelength}; Marian's are fixed at {MARIAN_WAVELENGTH}."
        )
    if backbone.layer_norm_epsilon != LAYER_NORM_EPSILON:
        warnings.warn(
            f"The model's LayerNorm epsilon is {backbone.layer_norm_epsilon:g}, Marian's is "
            f"{LAYER_NORM_EPSILON:g} and cannot be set: each LayerNorm's output changes by about "
            "(difference of the epsilons) / (2 x variance of its input), relative. Translations rarely "
            "change; compare a few before serving the export.",
            stacklevel=3,
        )
    return {
        "model_type": MODEL_TYPE,
        "architectures": ["MarianMTModel"],
        "vocab_size": vocabulary_size,
        "decoder_vocab_size": target_vocabulary_size or vocabulary_size,
        "share_encoder_decoder_embeddings": target_vocabulary_size is None,
        "tie_word_embeddings": True,
        "d_model": backbone.hidden_dim,
        "encoder_layers": backbone.num_encoder_layers,
        "decoder_layers": backbone.num_decoder_layers,
        "encoder_attention_heads": backbone.num_heads,
        "decoder_attention_heads": backbone.num_heads,
        "encoder_ffn_dim": backbone.intermediate_dim,
        "decoder_ffn_dim": backbone.intermediate_dim,
        "activation_function": ACTIVATION_NAMES[backbone.activation],
        "dropout": backbone.dropout,
        "attention_dropout": backbone.attention_dropout,
        "activation_dropout": 0.0,
        "max_position_embeddings": backbone.max_sequence_length,
        "scale_embedding": True,
        **_special_ids(backbone, target_vocabulary_size or vocabulary_size),
        "is_encoder_decoder": True,
        "dtype": "float32",
    }


def generation_config(
    backbone: TransformerBackbone, vocabulary_size: int, target_vocabulary_size: int | None = None
) -> dict:
    """`generation_config.json`: how `transformers`' `generate` starts and
    ends (its default search, greedy, is left as it is)."""
    return {
        **_special_ids(backbone, target_vocabulary_size or vocabulary_size),
        "max_length": min(MAX_INPUT_TOKENS, backbone.max_sequence_length),
    }


def _special_ids(backbone: TransformerBackbone, output_size: int) -> dict:
    # Marian's <pad> is its last (target) id and its decoder start, with a zero embedding.
    pad = output_size - 1
    return {
        "pad_token_id": pad,
        "decoder_start_token_id": pad,
        "eos_token_id": backbone.end_token_id,
        "forced_eos_token_id": backbone.end_token_id,
    }
