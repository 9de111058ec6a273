"""A translation server: LibreTranslate's HTTP API, a web page, batching across requests.

Needs the `serve` extra (`pip install "keras-transformer[serve]"`): Starlette,
uvicorn, prometheus_client, pycountry, langcodes, lingua and python-multipart.

Example:
>>> import keras_transformer as kt
>>> from keras_transformer.server import build_app
>>> app = build_app({"multi30k_en_de": kt.Transformer.from_preset("multi30k_en_de")})
>>> # uvicorn.run(app, host="127.0.0.1", port=5000), or `keras-transformer serve multi30k_en_de`
"""

try:
    import langcodes  # noqa: F401
    import lingua  # noqa: F401
    import prometheus_client  # noqa: F401
    import pycountry  # noqa: F401
    import starlette  # noqa: F401
except ImportError as error:
    raise ImportError(
        f"keras_transformer.server needs the serve extra ({error.name} is missing): "
        'pip install "keras-transformer[serve]"'
    ) from error

from keras_transformer.generation.settings import SearchSettings
from keras_transformer.server.api import Limits
from keras_transformer.server.app import app_of, build_app
from keras_transformer.server.ctranslate2_cache import import_ctranslate2
from keras_transformer.server.ctranslate2_engine import CTranslate2Engine, compute_type_of
from keras_transformer.server.engine import ModelEngine
from keras_transformer.server.routing import Router, ServedModel, served_model
from keras_transformer.server.service import ServiceSettings, TranslationService


def parse_model_spec(spec: str) -> tuple[str, tuple[list[str], list[str]] | None]:
    """`"PRESET=SOURCES:TARGETS"` as `(preset, (sources, targets))`; a bare
    preset as `(preset, None)`.

    Example:
    >>> parse_model_spec("hf://Helsinki-NLP/opus-mt-tc-big-gmw-gmw=en,de:nl")
    ('hf://Helsinki-NLP/opus-mt-tc-big-gmw-gmw', (['en', 'de'], ['nl']))
    """
    preset, _, languages = spec.rpartition("=") if "=" in spec else (spec, "", "")
    if not languages:
        return spec, None
    sources, separator, targets = languages.partition(":")
    if not separator or not sources or not targets:
        raise ValueError(f"{spec!r}: write the languages as PRESET=SOURCES:TARGETS, e.g. {preset}=en:de.")
    return preset, (sources.split(","), targets.split(","))


ENGINES = ("keras", "ctranslate2")


def load_served_models(
    specs: list[str],
    *,
    precision: str = "float32",
    search: SearchSettings | None = None,
    engine: str = "keras",
    **engine_options,
) -> list[ServedModel]:
    """Each `PRESET[=SOURCES:TARGETS]` loaded (in `precision`) as a `ServedModel`.

    Args:
        specs: see `parse_model_spec`.
        precision: `"float32"`, `"bfloat16"` or `"int8"` (see `presets.precision.load_model`;
            the ctranslate2 engine takes float32 and int8).
        search: the search every request gets (by default each model's own).
        engine: `"keras"` (`ModelEngine`: the model itself, compiled per batch
            shape) or `"ctranslate2"` (`CTranslate2Engine`: the model converted
            for CTranslate2; needs the ctranslate2 extra).
        **engine_options: the engine's keywords.
    """
    from keras_transformer.presets.precision import load_model

    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}; got {engine!r}.")
    if engine == "ctranslate2":  # before any model loads
        compute_type_of(precision)
        import_ctranslate2()
    models = []
    for spec in specs:
        preset, languages = parse_model_spec(spec)
        if engine == "ctranslate2":
            # Converted from float32 weights; CTranslate2 quantizes them itself.
            served = CTranslate2Engine(
                load_model(preset), search=search, name=preset, precision=precision, **engine_options
            )
        else:
            served = ModelEngine(load_model(preset, precision), search=search, name=preset, **engine_options)
        models.append(served_model(preset, served, languages))
    return models


__all__ = [
    "CTranslate2Engine",
    "ENGINES",
    "Limits",
    "ModelEngine",
    "Router",
    "ServedModel",
    "ServiceSettings",
    "TranslationService",
    "app_of",
    "build_app",
    "load_served_models",
    "parse_model_spec",
    "served_model",
]
