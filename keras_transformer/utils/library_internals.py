"""Every use of a private Keras or KerasHub attribute, in one place.

Each function here exists because the installed library offers no public
route to something the paper needs. `tests/test_library_internals.py` checks
every name this module touches against the installed versions, so an
upgrade that moves one fails there, loudly, instead of somewhere deep in a
training run.
"""

from collections.abc import Callable

import keras

# KerasHub's preset file names and preset machinery: no public module of
# keras_hub exports them (`keras_hub.src.utils.preset_utils`).
from keras_hub.src.utils.preset_utils import (
    ASSET_DIR,
    BUILTIN_PRESETS_FOR_BACKBONE,
    CONFIG_FILE,
    HF_PREFIX,
    METADATA_FILE,
    MODEL_WEIGHTS_FILE,
    README_FILE,
    get_preset_saver,
    register_presets,
)

# KerasHub's helpers for tokenizers and preprocessors written outside it
# (`keras_hub.src.utils.tensor_utils`): `preprocessing_function` runs a
# method in TensorFlow and hands the caller backend tensors or lists;
# `convert_to_ragged_batch` batches any token-id input as a ragged tensor.
from keras_hub.src.utils.tensor_utils import convert_to_ragged_batch, preprocessing_function

# The residual-branch dropouts of KerasHub's blocks (section 5.4: "applied to
# the output of each sub-layer, before it is added to the sub-layer input").
ENCODER_RESIDUAL_DROPOUTS = ("_self_attention_dropout", "_feedforward_dropout")
DECODER_RESIDUAL_DROPOUTS = (
    "_self_attention_dropout",
    "_cross_attention_dropout",
    "_feedforward_dropout",
)
# The attention layers of KerasHub's blocks.
ENCODER_ATTENTION_LAYERS = ("_self_attention_layer",)
DECODER_ATTENTION_LAYERS = ("_self_attention_layer", "_cross_attention_layer")
# The LayerNorms around a KerasHub decoder block's self- and cross-attention
# sublayers: the cross-attention's query is computed with them.
DECODER_ATTENTION_NORMS = ("_self_attention_layer_norm", "_cross_attention_layer_norm")


def replace_residual_dropouts(
    block: keras.layers.Layer, names: tuple[str, ...], make_dropout: Callable[..., keras.layers.Layer]
) -> None:
    """Gives a block being built new residual dropout layers, `make_dropout(dtype=, name=)`.

    KerasHub hands its blocks' one `dropout` to the attention layers and the
    residual dropouts alike, at construction, and Keras refuses flash
    attention for an attention layer made with dropout > 0. The blocks of
    this package therefore build with the attention dropout and then get
    their residual dropouts here (a `Dropout` made with rate 0 has no seed
    state, so its rate cannot simply be raised). Call it from `build`, before
    Keras locks the block's state; the replaced layers are untracked.
    """
    for name in names:
        old = getattr(block, name)
        block._layers.remove(old)
        setattr(block, name, make_dropout(dtype=block.dtype_policy, name=old.name))


def attention_layers(block: keras.layers.Layer, names: tuple[str, ...]) -> list:
    """The `MultiHeadAttention` layers of a built KerasHub block."""
    return [getattr(block, name) for name in names if getattr(block, name, None) is not None]


def decoder_attention_norms(block: keras.layers.Layer) -> tuple:
    """The self-attention and cross-attention `LayerNormalization` layers of a
    built KerasHub `TransformerDecoder` (pictures of attention need the
    cross-attention's query, which the block does not return)."""
    return tuple(getattr(block, name) for name in DECODER_ATTENTION_NORMS)


def current_learning_rate(optimizer: keras.optimizers.Optimizer) -> float:
    """The learning rate the optimizer's next update uses (schedules included).

    `optimizer.learning_rate` evaluates a schedule at `iterations`, which
    counts micro-batches under gradient accumulation; Keras' own helper is
    what its updates use.
    """
    return float(keras.ops.convert_to_numpy(optimizer._get_current_learning_rate()))


# The sublayers of KerasHub's blocks, by their role in section 3.1; a block
# lacks the cross-attention ones if it is an encoder block.
BLOCK_SUBLAYERS = {
    "self_attention": "_self_attention_layer",
    "self_attention_norm": "_self_attention_layer_norm",
    "cross_attention": "_cross_attention_layer",
    "cross_attention_norm": "_cross_attention_layer_norm",
    "ffn_inner": "_feedforward_intermediate_dense",
    "ffn_outer": "_feedforward_output_dense",
    "ffn_norm": "_feedforward_layer_norm",
}


def block_sublayers(block: keras.layers.Layer) -> dict:
    """The built sublayers of a KerasHub encoder or decoder block, by role."""
    return {
        role: getattr(block, name)
        for role, name in BLOCK_SUBLAYERS.items()
        if getattr(block, name, None) is not None
    }


def attention_projections(attention: keras.layers.MultiHeadAttention) -> dict:
    """The `EinsumDense` layers of W^Q, W^K, W^V and W^O (kernels and biases)."""
    return {
        "query": attention._query_dense,
        "key": attention._key_dense,
        "value": attention._value_dense,
        "output": attention._output_dense,
    }


def projection_kernels(attention: keras.layers.MultiHeadAttention) -> dict:
    """W^Q, W^K, W^V and W^O of a built `MultiHeadAttention`, by name."""
    return {
        "query": attention._query_dense.kernel,
        "key": attention._key_dense.kernel,
        "value": attention._value_dense.kernel,
        "output": attention._output_dense.kernel,
    }



def add_special_token(tokenizer, piece: str, name: str) -> None:
    """Declares `piece` as the tokenizer's `<name>` / `<name>_id` (KerasHub's
    own model tokenizers call this protected method the same way)."""
    tokenizer._add_special_token(piece, name)


def update_special_token_ids(tokenizer) -> None:
    """Sets the tokenizer's `<name>_id`s from its new vocabulary (KerasHub's
    tokenizers call this protected method when theirs is set)."""
    tokenizer._update_special_token_ids()


def sentence_piece_op(tokenizer):
    """The `tf_text.SentencepieceTokenizer` inside a KerasHub tokenizer, or None."""
    return getattr(tokenizer, "_sentence_piece", None)
