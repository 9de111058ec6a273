"""A Marian checkpoint's weights in a `TransformerBackbone` (benchmark-only).

`backbone_from_marian` is the single place where the benchmark turns a
saved `MarianMTModel` into this project's model; it is to be replaced by the
project's own Marian loader once that exists. It handles only what the
benchmark's random checkpoints use (shared embeddings, zero
`final_logits_bias`, post-LN) and refuses anything else.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

ACTIVATIONS = {"swish": "swish", "silu": "swish", "relu": "relu", "gelu": "gelu"}
MARIAN_LAYER_NORM_EPSILON = 1e-5  # torch's default, hard-wired in Marian


def _attention(prefix: str, target: str, num_heads: int) -> dict:
    """Keras `MultiHeadAttention` weights from a Marian attention: Linear
    weights are `[out, in]`; Keras kernels are `(d_model, heads, head_dim)`
    for Q/K/V and `(heads, head_dim, d_model)` for the output."""

    def projection(w):
        d_model = w.shape[1]
        return w.T.reshape(d_model, num_heads, -1)

    def bias(b):
        return b.reshape(num_heads, -1)

    def output(w):
        d_model = w.shape[0]
        return w.T.reshape(num_heads, -1, d_model)

    mapping = {}
    for keras_name, marian_name in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
        mapping[f"{target}/{keras_name}/kernel"] = (f"{prefix}.{marian_name}.weight", projection)
        mapping[f"{target}/{keras_name}/bias"] = (f"{prefix}.{marian_name}.bias", bias)
    mapping[f"{target}/attention_output/kernel"] = (f"{prefix}.out_proj.weight", output)
    mapping[f"{target}/attention_output/bias"] = (f"{prefix}.out_proj.bias", None)
    return mapping


def _dense(prefix: str, target: str) -> dict:
    return {
        f"{target}/kernel": (f"{prefix}.weight", np.transpose),
        f"{target}/bias": (f"{prefix}.bias", None),
    }


def _layer_norm(prefix: str, target: str) -> dict:
    return {f"{target}/gamma": (f"{prefix}.weight", None), f"{target}/beta": (f"{prefix}.bias", None)}


def weight_mapping(num_encoder_layers: int, num_decoder_layers: int, num_heads: int) -> dict:
    """Keras variable path -> (Marian tensor name, transform or None)."""
    mapping = {"token_embedding/embeddings": ("model.shared.weight", None)}
    for i in range(num_encoder_layers):
        marian, keras_ = f"model.encoder.layers.{i}", f"encoder_block_{i}"
        mapping.update(_attention(f"{marian}.self_attn", f"{keras_}/self_attention_layer", num_heads))
        mapping.update(_layer_norm(f"{marian}.self_attn_layer_norm", f"{keras_}/self_attention_layer_norm"))
        mapping.update(_dense(f"{marian}.fc1", f"{keras_}/feedforward_intermediate_dense"))
        mapping.update(_dense(f"{marian}.fc2", f"{keras_}/feedforward_output_dense"))
        mapping.update(_layer_norm(f"{marian}.final_layer_norm", f"{keras_}/feedforward_layer_norm"))
    for i in range(num_decoder_layers):
        marian, keras_ = f"model.decoder.layers.{i}", f"decoder_block_{i}"
        mapping.update(_attention(f"{marian}.self_attn", f"{keras_}/self_attention", num_heads))
        mapping.update(_layer_norm(f"{marian}.self_attn_layer_norm", f"{keras_}/self_attention_layer_norm"))
        mapping.update(_attention(f"{marian}.encoder_attn", f"{keras_}/cross_attention", num_heads))
        mapping.update(_layer_norm(f"{marian}.encoder_attn_layer_norm", f"{keras_}/cross_attention_layer_norm"))
        mapping.update(_dense(f"{marian}.fc1", f"{keras_}/feedforward_intermediate_dense"))
        mapping.update(_dense(f"{marian}.fc2", f"{keras_}/feedforward_output_dense"))
        mapping.update(_layer_norm(f"{marian}.final_layer_norm", f"{keras_}/feedforward_layer_norm"))
    return mapping


def _check_supported(config: dict, tensors: dict) -> None:
    unsupported = {
        "share_encoder_decoder_embeddings": (config.get("share_encoder_decoder_embeddings", True), True),
        "scale_embedding": (config.get("scale_embedding"), True),
        "normalize_before": (config.get("normalize_before", False), False),
        "encoder/decoder sizes differ": (
            (config["encoder_layers"], config["encoder_attention_heads"], config["encoder_ffn_dim"])
            == (config["decoder_layers"], config["decoder_attention_heads"], config["decoder_ffn_dim"]),
            True,
        ),
    }
    wrong = {name: got for name, (got, want) in unsupported.items() if got != want}
    if wrong:
        raise ValueError(f"backbone_from_marian does not handle these Marian settings: {wrong}")
    if np.any(tensors.get("final_logits_bias", 0.0)):
        raise ValueError("final_logits_bias is not zero; this project's model has no logits bias")
    if "lm_head.weight" in tensors and not np.array_equal(tensors["lm_head.weight"], tensors["model.shared.weight"]):
        raise ValueError("lm_head.weight differs from model.shared.weight; only tied weights are handled")


def backbone_from_marian(checkpoint_dir: str | Path, *, unk_token_id: int = 1, dtype=None, backbone_cls=None):
    """Builds a `TransformerBackbone` (or `backbone_cls`, a subclass) with the
    weights of a saved `MarianMTModel` (`config.json` + `model.safetensors`).

    Marian's decoder starts from `<pad>` (`decoder_start_token_id`), whose
    embedding row is zero; the backbone's start token is that same id, so its
    first decoder input is the same zero vector. Marian's config does not
    record `<unk>`; Opus-MT's is 1.
    """
    from safetensors.numpy import load_file

    from keras_transformer import TransformerBackbone

    checkpoint_dir = Path(checkpoint_dir)
    config = json.loads((checkpoint_dir / "config.json").read_text())
    tensors = load_file(checkpoint_dir / "model.safetensors")
    _check_supported(config, tensors)

    backbone = (backbone_cls or TransformerBackbone)(
        vocabulary_size=config["vocab_size"],
        num_encoder_layers=config["encoder_layers"],
        num_decoder_layers=config["decoder_layers"],
        num_heads=config["encoder_attention_heads"],
        hidden_dim=config["d_model"],
        intermediate_dim=config["encoder_ffn_dim"],
        dropout=config["dropout"],
        attention_dropout=config["attention_dropout"],
        max_sequence_length=config["max_position_embeddings"],
        normalize_first=False,
        layer_norm_epsilon=MARIAN_LAYER_NORM_EPSILON,
        activation=ACTIVATIONS[config["activation_function"]],
        position_encoding_layout="concatenated",
        pad_token_id=config["pad_token_id"],
        start_token_id=config["decoder_start_token_id"],
        end_token_id=config["eos_token_id"],
        unk_token_id=unk_token_id,
        dtype=dtype,
    )
    mapping = weight_mapping(config["encoder_layers"], config["decoder_layers"], config["encoder_attention_heads"])
    variables = {v.path: v for v in backbone.weights}
    if set(variables) != set(mapping):
        raise ValueError(
            "backbone variables and the Marian mapping differ: "
            f"unmapped {sorted(set(variables) - set(mapping))}, missing {sorted(set(mapping) - set(variables))}"
        )
    for path, (name, transform) in mapping.items():
        value = tensors[name] if transform is None else transform(tensors[name])
        variable = variables[path]
        if tuple(variable.shape) != value.shape:
            raise ValueError(f"{path}: shape {tuple(variable.shape)} but {name} gives {value.shape}")
        variable.assign(value.astype(variable.dtype))
    return backbone
