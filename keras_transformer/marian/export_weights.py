"""A `TransformerBackbone` as Marian tensors: the inverse of `convert`.

`marian_tensors(backbone)` gives every weight under its `transformers` name
in PyTorch's layout (`Linear` weights `[out, in]`), in float32, as
`load_marian_weights` reads them. A model converted from Opus-MT comes back
as it was loaded. This project's own models need up to three rewrites, each
exact: no greedy or beam translation changes.

- **Sinusoid layout.** Marian puts all sines before all cosines; the paper
  interleaves them. The model axis of every weight (embedding columns,
  attention and FFN inputs and outputs, LayerNorm parameters) is reordered
  the same way; none of these layers depends on the order of that axis.
- **A zero decoder-start embedding.** CTranslate2, like Marian, feeds a zero
  vector at the first decoding step, not the start token's row. Every
  embedding row is shifted by minus that row; the first encoder and decoder
  layers' attention biases add the shift back (query, key and value biases
  by its projection, the output bias by the vector itself for the residual),
  and in the tied output projection it subtracts one number from all logits
  of a position, which softmax ignores. An Opus-MT model's start token
  (`<pad>`) has a zero row: nothing changes.
- **Tokens never generated.** The decoder start and padding tokens get a
  logits bias of `NEVER_GENERATED`, so that no runtime emits them, as this
  project's search never does.

The last row is Marian's `<pad>`, also its decoder start (see
`export_tokenizer` for a model whose padding token was elsewhere). With
separate vocabularies, all of this concerns the target's matrix; the
source's is only reordered.
"""

import keras
import numpy as np

from keras_transformer.marian.convert import (
    ATTENTION_SUBLAYERS,
    EMBEDDING_NAMES,
    LOGITS_BIAS,
    NORM_SUBLAYERS,
    PROJECTIONS,
    SOURCE_EMBEDDING,
    TARGET_EMBEDDING,
)
from keras_transformer.models.transformer_backbone import TransformerBackbone

SHARED_EMBEDDING = EMBEDDING_NAMES[0]
# Far below any logit, and still finite in float16 and bfloat16.
NEVER_GENERATED = -1e4


class MarianExportError(ValueError):
    """A model that a Marian checkpoint cannot represent."""


def marian_tensors(
    backbone: TransformerBackbone, vocabulary_size: int, target_vocabulary_size: int | None = None
) -> dict[str, np.ndarray]:
    """Every weight of `backbone` by Marian name, float32, PyTorch layout.

    Args:
        backbone: the model's backbone.
        vocabulary_size: the export's (source) vocabulary size: the
            backbone's, or one more (a new last `<pad>`, see
            `export_tokenizer.marian_vocabularies`).
        target_vocabulary_size: the same for the target, for a backbone
            with separate vocabularies; `None` when it shares one.

    Example:
    >>> backbone = TransformerBackbone(
    ...     vocabulary_size=10, num_encoder_layers=1, num_decoder_layers=1,
    ...     num_heads=2, hidden_dim=4, intermediate_dim=8)
    >>> tensors = marian_tensors(backbone, vocabulary_size=11)
    >>> tensors["model.shared.weight"].shape, tensors["model.decoder.layers.0.fc1.weight"].shape
    ((11, 4), (8, 4))

    Raises:
        MarianExportError: a layer is quantized, or the output projection
            is not tied to the (target) embeddings.
    """
    if not backbone.decoder_token_embedding.tie_weights:
        raise MarianExportError("The model's output projection is not tied to its embeddings; Marian ties them.")
    order = _marian_order(backbone.hidden_dim, backbone.position_encoding_layout)
    tensors = {}
    for stack, blocks in (("encoder", backbone.encoder_blocks), ("decoder", backbone.decoder_blocks)):
        for index, block in enumerate(blocks):
            tensors.update(_block_tensors(block, f"model.{stack}.layers.{index}", order))
    source = _model_axis(_weights(backbone.token_embedding, "embeddings"), 1, order)
    scale, start = backbone.token_embedding.scale, backbone.start_token_id
    if backbone.target_token_embedding is None:
        # One matrix: its shift reaches the inputs of both stacks.
        shared = _zero_start_row(tensors, source, start, scale, stacks=("encoder", "decoder"))
        tensors[SHARED_EMBEDDING] = _with_pad_row(shared, vocabulary_size, zero=True)
    else:
        target = _model_axis(_weights(backbone.target_token_embedding, "embeddings"), 1, order)
        target = _zero_start_row(tensors, target, start, scale, stacks=("decoder",))
        tensors[SOURCE_EMBEDDING] = _with_pad_row(source, vocabulary_size, zero=False)
        tensors[TARGET_EMBEDDING] = _with_pad_row(target, target_vocabulary_size, zero=True)
    output_size = target_vocabulary_size or vocabulary_size
    bias = np.zeros(output_size, "float32")
    if backbone.logits_bias is not None:
        learned = _array(backbone.logits_bias.bias)
        bias[: len(learned)] = learned
    bias[[start, backbone.pad_token_id, output_size - 1]] = NEVER_GENERATED
    tensors[LOGITS_BIAS] = bias[None, :]  # Marian stores it [1, V]
    return tensors


def _with_pad_row(embedding: np.ndarray, size: int, zero: bool) -> np.ndarray:
    """`embedding` with zero rows added up to `size` (a new last `<pad>`);
    `zero`: its last row (`<pad>`, the decoder start) zero in any case."""
    embedding = np.concatenate([embedding, np.zeros((size - len(embedding), embedding.shape[1]), "float32")])
    if zero:
        embedding[-1] = 0.0
    return embedding


def _marian_order(hidden_dim: int, layout: str) -> np.ndarray:
    """Which axis of this model each of Marian's model axes takes: all sines
    (this model's even axes, when interleaved), then all cosines."""
    if layout == "concatenated":
        return np.arange(hidden_dim)
    return np.concatenate([np.arange(0, hidden_dim, 2), np.arange(1, hidden_dim, 2)])


def _model_axis(array: np.ndarray, axis: int, order: np.ndarray) -> np.ndarray:
    return np.take(array, order, axis=axis)


def _array(variable) -> np.ndarray:
    return np.asarray(keras.ops.convert_to_numpy(variable), dtype="float32")


def _weights(layer, name: str) -> np.ndarray:
    """`layer.<name>` as float32; a quantized layer is refused (its integer
    weights and scales are not Marian's)."""
    if getattr(layer, "quantization_mode", None):
        raise MarianExportError(
            f"{layer.name} is quantized ({layer.quantization_mode}); export the model before quantizing it."
        )
    return _array(getattr(layer, name))


def _attention_tensors(attention, prefix: str, order: np.ndarray) -> dict:
    tensors = {}
    for projection, attribute in PROJECTIONS.items():
        dense = getattr(attention, attribute)
        kernel = _weights(dense, "kernel")  # (d_model, heads, head_dim)
        tensors[f"{prefix}.{projection}.weight"] = _model_axis(kernel.reshape(kernel.shape[0], -1).T, 1, order)
        tensors[f"{prefix}.{projection}.bias"] = _array(dense.bias).reshape(-1)
    output = attention.output_projection
    kernel = _weights(output, "kernel")  # (heads, head_dim, d_model)
    tensors[f"{prefix}.out_proj.weight"] = _model_axis(kernel.reshape(-1, kernel.shape[-1]).T, 0, order)
    tensors[f"{prefix}.out_proj.bias"] = _model_axis(_array(output.bias), 0, order)
    return tensors


def _block_tensors(block, prefix: str, order: np.ndarray) -> dict:
    tensors = {}
    for marian, attribute in ATTENTION_SUBLAYERS.items():
        attention = getattr(block, attribute, None)
        if attention is not None:
            tensors.update(_attention_tensors(attention, f"{prefix}.{marian}", order))
    for marian, attribute in NORM_SUBLAYERS.items():
        norm = getattr(block, attribute, None)
        if norm is not None:
            tensors[f"{prefix}.{marian}.weight"] = _model_axis(_array(norm.gamma), 0, order)
            tensors[f"{prefix}.{marian}.bias"] = _model_axis(_array(norm.beta), 0, order)
    inner, outer = block.feed_forward.inner, block.feed_forward.outer
    tensors[f"{prefix}.fc1.weight"] = _model_axis(_weights(inner, "kernel").T, 1, order)
    tensors[f"{prefix}.fc1.bias"] = _array(inner.bias)
    tensors[f"{prefix}.fc2.weight"] = _model_axis(_weights(outer, "kernel").T, 0, order)
    tensors[f"{prefix}.fc2.bias"] = _model_axis(_array(outer.bias), 0, order)
    return tensors


def _zero_start_row(tensors: dict, embedding: np.ndarray, start: int, scale: float, stacks: tuple) -> np.ndarray:
    """`embedding` with every row shifted by minus the start token's row; the
    shift of the inputs is added back in the first layer of `stacks`."""
    row = embedding[start].astype("float64")
    if not row.any():
        return embedding
    if not all(f"model.{stack}.layers.0.self_attn.out_proj.bias" in tensors for stack in stacks):
        raise MarianExportError(
            "The decoder start token's embedding is not zero, which a model without encoder or decoder "
            "layers cannot compensate; CTranslate2 and Marian start decoding from a zero vector."
        )
    shift = scale * row  # every scaled input embedding moved by -shift
    for stack in stacks:
        prefix = f"model.{stack}.layers.0.self_attn"
        for projection in PROJECTIONS:
            weight, bias = tensors[f"{prefix}.{projection}.weight"], tensors[f"{prefix}.{projection}.bias"]
            tensors[f"{prefix}.{projection}.bias"] = (bias + weight.astype("float64") @ shift).astype("float32")
        tensors[f"{prefix}.out_proj.bias"] = (tensors[f"{prefix}.out_proj.bias"] + shift).astype("float32")
    return (embedding - row).astype("float32")
