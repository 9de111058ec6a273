"""The server's two engines, one process each: time to ready, memory, one batch's speed.

    python -m benchmarks.serving_engines --engine keras|ctranslate2 [--size tiny|base] [--threads N]

In a fresh process: imports, loads the model (`--size tiny`: the shipped
`multi30k_en_de`; `base`: the paper's base size with random weights and the
same tokenizer, built from `--seed`), builds the engine the server would and
warms it up (the Keras engine compiles its batch shapes). The ctranslate2
engine's first run converts the model into its cache; a second run measures
a restart. It prints one JSON line: `ready_s` (from the script's first line,
before the libraries' imports, to warmed up), `rss_mb` (resident memory
then), and the median of `--repeats` decodings of one batch of the first 32
Multi30k test sentences (beam 4): `batch_s`, `sentences_per_s`,
`tokens_per_s` (target tokens, end token excluded). Both engines compute
the same function, so they decode the same tokens.
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()  # before the libraries' imports

import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402

from benchmarks.data_pipeline import MULTI30K  # noqa: E402
from benchmarks.serving_server import resident_bytes  # noqa: E402

TEST_SOURCES = MULTI30K / "test_2016_flickr.en.gz"
BATCH = 32
# The paper's base model (section 6.1), on the preset's 10,000-piece tokenizer.
BASE_SIZE = {"hidden_dim": 512, "intermediate_dim": 2048, "num_heads": 8}
BASE_SIZE |= {"num_encoder_layers": 6, "num_decoder_layers": 6}


def served_model(size: str, seed: int):
    import keras

    import keras_transformer as kt

    model = kt.Transformer.from_preset("multi30k_en_de")
    if size == "tiny":
        return model
    keras.utils.set_random_seed(seed)
    backbone = kt.TransformerBackbone.from_config({**model.backbone.get_config(), **BASE_SIZE})
    return kt.Transformer(backbone=backbone, preprocessor=model.preprocessor)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("keras", "ctranslate2"), required=True)
    parser.add_argument("--size", choices=("tiny", "base"), default="tiny")
    parser.add_argument("--precision", choices=("float32", "int8"), default="float32")
    parser.add_argument("--threads", type=int, help="CTranslate2's inter_threads (default: one per core)")
    parser.add_argument("--max-source-tokens", type=int, default=32, help="the widest source compiled")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=20260)
    args = parser.parse_args()

    from keras_transformer.generation.settings import SearchSettings
    from keras_transformer.server import CTranslate2Engine, ModelEngine

    model = served_model(args.size, args.seed)
    options = dict(search=SearchSettings(), max_batch_size=BATCH, max_source_bucket=args.max_source_tokens)
    if args.engine == "ctranslate2":
        engine = CTranslate2Engine(model, precision=args.precision, inter_threads=args.threads, **options)
    else:
        if args.precision == "int8":
            model.quantize("int8")
        engine = ModelEngine(model, **options)
    engine.warm_up()
    ready_s = time.perf_counter() - STARTED
    rss_mb = resident_bytes() / 2**20

    with gzip.open(TEST_SOURCES, "rt", encoding="utf-8") as file:
        texts = [next(file).strip() for _ in range(BATCH)]
    rows = [segment.token_ids for segment in engine.segments(texts)][:BATCH]
    translations = engine.translate_rows(rows)
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        engine.translate_rows(rows)
        times.append(time.perf_counter() - start)
    batch_s = statistics.median(times)
    tokens = sum(len(ids) for ids in model.preprocessor.tokenizer(translations))
    result = {
        "engine": args.engine,
        "size": args.size,
        "precision": args.precision,
        "parameters": model.backbone.count_params(),
        "ready_s": round(ready_s, 2),
        "rss_mb": round(rss_mb),
        "batch_s": round(batch_s, 3),
        "sentences_per_s": round(len(rows) / batch_s, 1),
        "tokens_per_s": round(tokens / batch_s),
        "first_translation": translations[0],
    }
    print(json.dumps(result, ensure_ascii=False))


if __name__ == "__main__":
    main()
