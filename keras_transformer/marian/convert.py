"""Marian tensors (PyTorch names and layout) into a `TransformerBackbone`.

PyTorch `Linear` weights are `[out, in]`; Keras' `Dense` kernel is `[in, out]`
and multi-head attention splits d_model into heads: W^Q, W^K, W^V become
`(d_model, h, d_k)` kernels with `(h, d_k)` biases, W^O a `(h, d_k, d_model)`
kernel. Marian's sublayer names map onto the blocks' attributes one to one:

| Marian (per layer)        | block attribute                                |
| ------------------------- | ---------------------------------------------- |
| self_attn                 | self_attention                                 |
| self_attn_layer_norm      | self_attention_norm                            |
| encoder_attn              | cross_attention (decoder only)                 |
| encoder_attn_layer_norm   | cross_attention_norm (decoder only)            |
| fc1, fc2                  | feed_forward.inner, feed_forward.outer         |
| final_layer_norm          | feed_forward_norm                              |

and an attention's q_proj, k_proj, v_proj and out_proj are its
`query_projection`, `key_projection`, `value_projection` and `output_projection`.

The one embedding matrix serves encoder, decoder and output projection (or,
with separate vocabularies, the encoder's matrix the source and the
decoder's the target and output projection). The output projection is tied
to the (target) embedding here explicitly, whatever the file says: some
Opus-MT uploads had broken tied weights (a stale `lm_head.weight`) and were
re-pushed; if the file's `lm_head.weight` differs, a warning says so.
"""

import re
import warnings

import numpy as np

from keras_transformer.models.transformer_backbone import TransformerBackbone

# Where the shared matrix may be stored, best first: safetensors keeps one
# name of a set of tied tensors, and which one depends on the version.
EMBEDDING_NAMES = (
    "model.shared.weight",
    "model.encoder.embed_tokens.weight",
    "model.decoder.embed_tokens.weight",
)
OUTPUT_PROJECTION = "lm_head.weight"
# With separate vocabularies (`share_encoder_decoder_embeddings: false`).
SOURCE_EMBEDDING, TARGET_EMBEDDING = EMBEDDING_NAMES[1:]
LOGITS_BIAS = "final_logits_bias"
# The config.json field that says the weights hold a logits bias. Opus-MT
# configs say false although their bias was trained: only true is read.
BIAS_FIELD = "add_bias_logits"
_LAYER_NAME = re.compile(r"model\.(encoder|decoder)\.layers\.(\d+)\.")
# Marian module names -> the block attributes they map to (read by `export_weights` too).
ATTENTION_SUBLAYERS = {"self_attn": "self_attention", "encoder_attn": "cross_attention"}
NORM_SUBLAYERS = {
    "self_attn_layer_norm": "self_attention_norm",
    "encoder_attn_layer_norm": "cross_attention_norm",
    "final_layer_norm": "feed_forward_norm",
}
FEED_FORWARD_SUBLAYERS = {"fc1": "inner", "fc2": "outer"}
PROJECTIONS = {"q_proj": "query_projection", "k_proj": "key_projection", "v_proj": "value_projection"}


class WeightMismatchError(ValueError):
    """The checkpoint's tensors do not fit the architecture its config describes."""


def _embedding(tensors: dict, repo: str) -> np.ndarray:
    for name in EMBEDDING_NAMES:
        if name in tensors:
            return tensors[name]
    if OUTPUT_PROJECTION in tensors:
        return tensors[OUTPUT_PROJECTION]
    raise WeightMismatchError(f"{repo} has no embedding matrix ({EMBEDDING_NAMES[0]}) in its weights.")


def _check_tie(
    tensors: dict, embedding: np.ndarray, repo: str, names=(*EMBEDDING_NAMES, OUTPUT_PROJECTION), role="shared"
) -> None:
    for name in names:
        other = tensors.get(name)
        if other is None or other is embedding:
            continue
        if other.shape != embedding.shape or not np.array_equal(other, embedding):
            difference = (
                f"shape {other.shape} vs {embedding.shape}"
                if other.shape != embedding.shape
                else f"max difference {float(np.max(np.abs(other - embedding))):.3g}"
            )
            warnings.warn(
                f"{repo}: {name} differs from the {role} embedding matrix ({difference}). Marian "
                f"ties them; keras-transformer uses the {role} matrix for the embeddings and the "
                "output projection, as the model was trained, and ignores the stale copy.",
                stacklevel=4,
            )


def _assign(variable, value: np.ndarray, name: str, repo: str, split: int | None = None) -> None:
    """`variable = value`, where `value` has the variable's shape, or for
    attention the shape with the head axes merged: `split` axes of the
    variable make the value's first axis, the rest its second."""
    shape = tuple(variable.shape)
    expected = shape
    if split is not None:
        expected = tuple(int(np.prod(part)) for part in (shape[:split], shape[split:]) if part)
    if tuple(value.shape) != expected:
        raise WeightMismatchError(
            f"{repo}: {name} has shape {tuple(value.shape)}, but config.json implies {expected}; "
            "the weights and the config do not belong together."
        )
    variable.assign(np.asarray(value, dtype="float32").reshape(shape))


def _take(tensors: dict, name: str, repo: str) -> np.ndarray:
    if name not in tensors:
        raise WeightMismatchError(f"{repo}: the weights have no {name}, which config.json implies.")
    return tensors[name]


def _load_attention(layer, prefix: str, tensors: dict, repo: str) -> None:
    for projection, attribute in PROJECTIONS.items():
        dense = getattr(layer, attribute)
        name = f"{prefix}.{projection}"
        _assign(dense.kernel, _take(tensors, f"{name}.weight", repo).T, f"{name}.weight", repo, split=1)
        _assign(dense.bias, _take(tensors, f"{name}.bias", repo), f"{name}.bias", repo, split=2)
    output = layer.output_projection
    weight = _take(tensors, f"{prefix}.out_proj.weight", repo)
    _assign(output.kernel, weight.T, f"{prefix}.out_proj.weight", repo, split=2)
    _assign(output.bias, _take(tensors, f"{prefix}.out_proj.bias", repo), f"{prefix}.out_proj.bias", repo)


def _load_block(block, prefix: str, tensors: dict, repo: str) -> None:
    for marian, attribute in ATTENTION_SUBLAYERS.items():
        attention = getattr(block, attribute, None)
        if attention is not None:
            _load_attention(attention, f"{prefix}.{marian}", tensors, repo)
    for marian, attribute in NORM_SUBLAYERS.items():
        norm = getattr(block, attribute, None)
        if norm is None:
            continue
        _assign(norm.gamma, _take(tensors, f"{prefix}.{marian}.weight", repo), f"{prefix}.{marian}.weight", repo)
        _assign(norm.beta, _take(tensors, f"{prefix}.{marian}.bias", repo), f"{prefix}.{marian}.bias", repo)
    for marian, attribute in FEED_FORWARD_SUBLAYERS.items():
        dense = getattr(block.feed_forward, attribute)
        _assign(dense.kernel, _take(tensors, f"{prefix}.{marian}.weight", repo).T, f"{prefix}.{marian}.weight", repo)
        _assign(dense.bias, _take(tensors, f"{prefix}.{marian}.bias", repo), f"{prefix}.{marian}.bias", repo)


def _logits_bias(tensors: dict, vocabulary_size: int, repo: str, config: dict | None) -> np.ndarray:
    """`final_logits_bias` (stored `[1, V]`), or zeros with a warning when the
    weights lack it. `transformers` fills zeros silently; for a model trained
    with a bias, zeros change the translations unannounced."""
    if LOGITS_BIAS in tensors:
        return tensors[LOGITS_BIAS]
    if config is not None and config.get(BIAS_FIELD) is True:
        raise WeightMismatchError(
            f"{repo}: config.json has {BIAS_FIELD} = True, but the weights have no {LOGITS_BIAS}; "
            "the weights and the config do not belong together."
        )
    warnings.warn(
        f"{repo}: the weights have no {LOGITS_BIAS}, so the logits bias is all zeros (as in "
        "transformers). If the model was trained with a bias, its translations differ from the "
        "original's: load a checkpoint that stores it.",
        stacklevel=5,
    )
    return np.zeros((1, vocabulary_size), "float32")


def _load_separate_embeddings(backbone: TransformerBackbone, tensors: dict, repo: str) -> None:
    """The encoder's matrix for the source, the decoder's for the target and,
    tied, the output projection."""
    source = _take(tensors, SOURCE_EMBEDDING, repo)
    target = tensors.get(TARGET_EMBEDDING, tensors.get(OUTPUT_PROJECTION))
    if target is None:
        raise WeightMismatchError(f"{repo}: the weights have no {TARGET_EMBEDDING}, which config.json implies.")
    _check_tie(tensors, target, repo, names=(OUTPUT_PROJECTION,), role="target")
    _assign(backbone.token_embedding.embeddings, source, SOURCE_EMBEDDING, repo)
    _assign(backbone.target_token_embedding.embeddings, target, TARGET_EMBEDDING, repo)


def load_marian_weights(backbone: TransformerBackbone, tensors: dict, repo: str, config: dict | None = None) -> None:
    """Assigns a Marian checkpoint's tensors to every variable of `backbone`.

    Args:
        backbone: built from the same checkpoint's config
            (`keras_transformer.marian.config.backbone_arguments`).
        tensors: from `keras_transformer.marian.weights.read_weights`.
        repo: how to name the checkpoint in errors and warnings.
        config: the checkpoint's `config.json`. A missing
            `final_logits_bias` is an error where it says
            `add_bias_logits: true`, else a warning (the bias is zeros).

    Raises:
        WeightMismatchError: a tensor is missing or has another shape than
            the config implies (e.g. a vocabulary of another size).
    """
    if backbone.target_token_embedding is None:
        embedding = _embedding(tensors, repo)
        _check_tie(tensors, embedding, repo)
        _assign(backbone.token_embedding.embeddings, embedding, EMBEDDING_NAMES[0], repo)
    else:
        _load_separate_embeddings(backbone, tensors, repo)
    if backbone.logits_bias is not None:
        bias = _logits_bias(tensors, backbone.decoder_token_embedding.input_dim, repo, config)
        _assign(backbone.logits_bias.bias, bias.reshape(-1), LOGITS_BIAS, repo)
    for stack, blocks in (("encoder", backbone.encoder_blocks), ("decoder", backbone.decoder_blocks)):
        for index, block in enumerate(blocks):
            _load_block(block, f"model.{stack}.layers.{index}", tensors, repo)
    counts = {"encoder": len(backbone.encoder_blocks), "decoder": len(backbone.decoder_blocks)}
    for name in sorted(tensors):
        match = _LAYER_NAME.match(name)
        if match and int(match.group(2)) >= counts[match.group(1)]:
            raise WeightMismatchError(
                f"{repo}: the weights have {name}, but config.json has only "
                f"{counts[match.group(1)]} {match.group(1)} layers."
            )
