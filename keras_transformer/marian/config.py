"""A Marian `config.json` as `TransformerBackbone` arguments, or a clear refusal.

Marian (`model_type: "marian"` in `transformers`, the Opus-MT models of
Tiedemann & Thottingal 2020) is the paper's architecture with a few fixed
choices, each of which the backbone can express:

- Post-LN, no embedding LayerNorm and no final LayerNorm;
- static sinusoids with all sines before all cosines (`"concatenated"`);
- embeddings scaled by sqrt(d_model), one matrix shared by encoder, decoder
  and output projection, or (`share_encoder_decoder_embeddings: false`) a
  source matrix for the encoder and a target matrix for the decoder and
  output projection; plus a `final_logits_bias`;
- LayerNorm epsilon 1e-5 (PyTorch's default; `transformers` hard-codes it);
- FFN activation `"swish"` (Opus-MT base) or `"relu"` (tc-big);
- `<pad>` = V - 1, also the decoder start; `</s>` from the config (0 in
  Opus-MT base, 43311 in opus-mt-tc-big-en-fr).

Anything else (pre-norm, learned positions, unscaled or untied embeddings)
is refused here, from `config.json` alone, before any weights
are downloaded.
"""

from dataclasses import dataclass

MODEL_TYPE = "marian"
LAYER_NORM_EPSILON = 1e-5  # transformers' MarianEncoderLayer: nn.LayerNorm's default
# transformers' ACT2FN names -> Keras activations that compute the same function.
ACTIVATIONS = {"relu": "relu", "swish": "silu", "silu": "silu", "gelu": "gelu"}
# Fields whose value must be this for the backbone to compute the same model:
# (field, required value, what the other value would mean).
FIXED_FIELDS = (
    ("normalize_before", False, "pre-norm layers"),
    ("normalize_embedding", False, "a LayerNorm on the embeddings"),
    ("add_final_layer_norm", False, "a final LayerNorm after each stack"),
    ("static_position_embeddings", True, "learned positions"),
    ("scale_embedding", True, "embeddings not scaled by sqrt(d_model)"),
    ("tie_word_embeddings", True, "an output projection untied from the embeddings"),
    ("is_decoder", False, "a decoder-only model"),
)
SAME_ON_BOTH_SIDES = (
    ("encoder_attention_heads", "decoder_attention_heads"),
    ("encoder_ffn_dim", "decoder_ffn_dim"),
)


class MarianConfigError(ValueError):
    """A Marian checkpoint this project cannot represent exactly."""


@dataclass(frozen=True)
class SpecialIds:
    """The token ids a Marian model gives a special meaning."""

    end: int  # </s>, appended to every source and ending every target
    pad: int  # <pad>, never generated
    start: int  # the decoder start, <pad> in every Opus-MT model


def _refuse(repo: str, field: str, value, reason: str) -> MarianConfigError:
    return MarianConfigError(f"Cannot load {repo}: config.json has {field} = {value!r}, {reason}.")


def check_model_type(config: dict, repo: str) -> None:
    """Refuses a `transformers` config of any other architecture."""
    model_type = config.get("model_type")
    if model_type != MODEL_TYPE:
        raise _refuse(
            repo,
            "model_type",
            model_type,
            "but keras-transformer converts only Marian (Opus-MT) checkpoints ('marian')",
        )


def backbone_arguments(config: dict, repo: str) -> dict:
    """`TransformerBackbone` keyword arguments for a Marian `config.json`.

    Args:
        config: the parsed `config.json`.
        repo: how to name the checkpoint in errors (`hf://org/name` or a folder).

    Raises:
        MarianConfigError: the config is not Marian, or uses an option the
            backbone cannot represent; the message names the field and value.
    """
    check_model_type(config, repo)
    for field, required, meaning in FIXED_FIELDS:
        value = config.get(field, required)
        if value != required:
            raise _refuse(
                repo,
                field,
                value,
                f"which means {meaning}; keras-transformer's Transformer cannot represent that (it needs {required!r})",
            )
    for encoder_field, decoder_field in SAME_ON_BOTH_SIDES:
        if encoder_field in config and config.get(decoder_field, config[encoder_field]) != config[encoder_field]:
            raise _refuse(
                repo,
                decoder_field,
                config[decoder_field],
                f"but {encoder_field} is {config[encoder_field]!r}; keras-transformer's "
                "encoder and decoder layers share one size",
            )
    vocabulary_size = config["vocab_size"]
    decoder_vocabulary_size = config.get("decoder_vocab_size") or vocabulary_size
    shared = config.get("share_encoder_decoder_embeddings", True)
    if shared and decoder_vocabulary_size != vocabulary_size:
        raise _refuse(
            repo,
            "decoder_vocab_size",
            decoder_vocabulary_size,
            f"but vocab_size is {vocabulary_size} and share_encoder_decoder_embeddings is true",
        )
    activation = config.get("activation_function", "gelu")
    if activation not in ACTIVATIONS:
        raise _refuse(
            repo,
            "activation_function",
            activation,
            f"which keras-transformer does not map (it knows {sorted(ACTIVATIONS)})",
        )
    hidden_dim, heads = config["d_model"], config["encoder_attention_heads"]
    if hidden_dim % heads:
        raise _refuse(repo, "encoder_attention_heads", heads, f"which does not divide d_model {hidden_dim}")
    return dict(
        vocabulary_size=vocabulary_size,
        num_encoder_layers=config["encoder_layers"],
        num_decoder_layers=config["decoder_layers"],
        num_heads=heads,
        hidden_dim=hidden_dim,
        intermediate_dim=config["encoder_ffn_dim"],
        dropout=float(config.get("dropout", 0.1)),
        attention_dropout=float(config.get("attention_dropout", 0.0)),
        max_sequence_length=config.get("max_position_embeddings", 512),
        normalize_first=False,
        layer_norm_epsilon=LAYER_NORM_EPSILON,
        activation=ACTIVATIONS[activation],
        position_encoding_layout="concatenated",
        use_logits_bias=True,
        target_vocabulary_size=None if shared else decoder_vocabulary_size,
    )


def special_ids(config: dict, repo: str) -> SpecialIds:
    """The end, pad and decoder-start ids of a Marian `config.json`.

    They are target ids: with separate vocabularies, ids of `target_vocab.json`.

    Raises:
        MarianConfigError: one is missing, outside the (target) vocabulary,
            or (for `eos_token_id`) a list of several ids.
    """
    size_field = "vocab_size" if config.get("share_encoder_decoder_embeddings", True) else "decoder_vocab_size"
    size = config.get(size_field) or config["vocab_size"]
    values = {}
    for field in ("eos_token_id", "pad_token_id", "decoder_start_token_id"):
        value = config.get(field)
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < size:
            raise _refuse(repo, field, value, f"but it must be one token id below {size_field} {size}")
        values[field] = value
    return SpecialIds(end=values["eos_token_id"], pad=values["pad_token_id"], start=values["decoder_start_token_id"])
