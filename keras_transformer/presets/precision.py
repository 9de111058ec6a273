"""Loading a preset for translation in a precision: float32, bfloat16 or int8."""

PRECISIONS = ("float32", "bfloat16", "int8")


def load_model(preset: str, precision: str = "float32"):
    """The preset's `Transformer` in `precision`, one of `PRECISIONS`.

    `"bfloat16"` computes under Keras' `mixed_bfloat16` policy; `"int8"`
    quantizes the weights (`Transformer.quantize("int8")`).

    Args:
        preset: anything `Transformer.from_preset` takes.
        precision: one of `PRECISIONS`.
    """
    from keras_transformer.models.transformer import Transformer

    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}; got {precision!r}.")
    # Weights saved in float16 load as float32 unless a dtype is given.
    model = Transformer.from_preset(preset, **({"dtype": "mixed_bfloat16"} if precision == "bfloat16" else {}))
    if precision == "int8":
        model.quantize("int8")
    return model
