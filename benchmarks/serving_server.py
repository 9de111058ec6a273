"""One server of the serving benchmark, in its own process, on 127.0.0.1.

    python -m benchmarks.serving_server SPEC.json PORT STATUS.json

`SPEC.json` names the implementation (`benchmarks.serving.parse_implementation`):

- `ct2-requests`: CTranslate2 as LibreTranslate serves it: each request's
  sentences in one `translate_batch` call of their own, as many calls at once
  as there are threads (a thread pool; `inter_threads` = threads, one thread
  each), behind a small Starlette app that reads the request as the
  project's server does (`keras_transformer.server.api`);
- `ct2-batcher`: CTranslate2 behind this project's server and `Batcher`
  (`CTranslate2Engine`, one `translate_batch` call per batch, all threads);
- `project`: this project's server (`keras_transformer.server.app_of`, its
  `TranslationService`, `Batcher` and `ModelEngine`) with a `Transformer` on
  the checkpoint's weights, batching on (`max_batch_size` > 1) or off (1).

Every implementation turns text into token ids with the multi30k_en_de
preset's SentencePiece model and decodes each sentence to exactly
`new_tokens` tokens (random weights never choose to stop, so the end token
is suppressed until then, as `benchmarks.project` does). The translations of
random weights are meaningless; only their cost is measured. Both engines see
the same positions per sentence: `<s>`, the sentence's ids, `</s>`.

The process writes `STATUS.json` (its resident memory once its libraries
are imported, before the model loads) and answers `GET /health` with 200 once it is ready.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks import REPO_ROOT
from benchmarks.checkpoint import CT2_DIR, MARIAN_DIR

TOKENIZER = REPO_ROOT / "presets" / "multi30k_en_de" / "assets" / "tokenizer" / "vocabulary.spm"
# The ids `TransformerPreprocessor.pack_sources` puts around every source.
SOURCE_START_ID, SOURCE_END_ID = 2, 3


def in_vocabulary(ids, vocabulary_size: int) -> list[int]:
    """The tokenizer's ids as ordinary ids of a model of `vocabulary_size`:
    unchanged where they fit (the base size's 32,000 holds the preset's
    10,000), folded onto ids 2 ... `vocabulary_size - 2` for the smaller test sizes.

    Example:
    >>> in_vocabulary([2, 3, 300], 32000), in_vocabulary([2, 3, 300], 256)
    ([2, 3, 300], [2, 3, 47])
    """
    ordinary = vocabulary_size - 3  # ids 0, 1 and the last are Marian's specials
    return [i if i < vocabulary_size - 1 else 2 + (i - 2) % ordinary for i in ids]


def resident_bytes(pid: int | str = "self", field: str = "VmRSS") -> int | None:
    """A process's resident memory (`VmRSS`) or its peak (`VmHWM`), from /proc."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class SentencePieceIds:
    """Text to token ids with the multi30k_en_de preset's SentencePiece model (the
    `sentencepiece` library LibreTranslate uses; the same ids as the preset's tokenizer)."""

    def __init__(self, model_file: Path = TOKENIZER):
        import sentencepiece

        self.processor = sentencepiece.SentencePieceProcessor(model_file=str(model_file))

    def __call__(self, texts: list[str]) -> list[list[int]]:
        return self.processor.encode(texts)


class CTranslate2Decoder:
    """Batches of token ids through a `ctranslate2.Translator`, each sentence to exactly `new_tokens` tokens.

    With `split`, each batch is cut into `inter` parts that CTranslate2 decodes
    side by side (its `max_batch_size`), one per thread."""

    def __init__(
        self,
        checkpoint: Path,
        compute_type: str,
        beam_size: int,
        new_tokens: int,
        inter: int,
        intra: int,
        split: bool = False,
    ):
        import ctranslate2

        directory = checkpoint / CT2_DIR
        self.translator = ctranslate2.Translator(
            str(directory), device="cpu", compute_type=compute_type, inter_threads=inter, intra_threads=intra
        )
        self.vocabulary = json.loads((directory / "shared_vocabulary.json").read_text())
        self.beam_size, self.new_tokens = beam_size, new_tokens
        self.parts = inter if split else 1

    def __call__(self, rows: list[list[int]]) -> list[str]:
        size = len(self.vocabulary) + 1  # the converter drops Marian's trailing <pad>
        rows = [in_vocabulary((SOURCE_START_ID, *row, SOURCE_END_ID), size) for row in rows]
        sources = [[self.vocabulary[i] for i in row] for row in rows]
        results = self.translator.translate_batch(
            sources,
            beam_size=self.beam_size,
            max_decoding_length=self.new_tokens,
            min_decoding_length=self.new_tokens,
            max_batch_size=0 if self.parts == 1 else -(-len(sources) // self.parts),
        )
        return [" ".join(result.hypotheses[0]) for result in results]


ONE_QUEUE = 0


class CTranslate2Engine:
    """CTranslate2 as an engine of this project's `Batcher` and `TranslationService`.

    CTranslate2 pads each batch itself, so all sentences share one queue
    (one width, `ONE_QUEUE`) and a batch takes the `max_batch_size` oldest."""

    name = "ctranslate2"

    def __init__(self, decoder: CTranslate2Decoder, tokenize: SentencePieceIds, max_batch_size: int):
        self.decoder, self.tokenize, self.max_batch_size = decoder, tokenize, max_batch_size

    def target_languages(self) -> list[str]:
        return []

    def segments(self, texts: list[str], target_language: str | None = None, source_language: str | None = None):
        from keras_transformer.generation.translation import Segment

        return [Segment(index, ids) for index, ids in enumerate(self.tokenize(texts))]

    def bucket_of(self, row: list[int]) -> int:
        return ONE_QUEUE

    def rows_per_batch(self, bucket: int) -> int:
        return self.max_batch_size

    def translate_rows(self, rows: list[list[int]]) -> list[str]:
        return self.decoder(rows)

    def warm_up(self, on_shape=None) -> None:
        self.decoder([[SOURCE_END_ID] * 8])


def requests_app(decoder: CTranslate2Decoder, tokenize: SentencePieceIds, threads: int):
    """LibreTranslate's way: each request's sentences in a `translate_batch` call
    of their own, `threads` calls at once. It reads LibreTranslate's JSON body
    itself, so that the process holds CTranslate2 and no other framework."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    pool = ThreadPoolExecutor(threads, thread_name_prefix="translate")

    def translate_texts(texts: list[str]) -> list[str]:
        return decoder(tokenize(texts))

    async def translate(request: Request):
        try:
            q = json.loads(await request.body())["q"]
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"error": "Invalid request: send JSON with q."}, 400)
        texts = await asyncio.get_running_loop().run_in_executor(
            pool, translate_texts, [q] if isinstance(q, str) else q
        )
        return JSONResponse({"translatedText": texts[0] if isinstance(q, str) else texts})

    async def health(request: Request):
        return JSONResponse({"status": "ok"})

    return Starlette(routes=[Route("/translate", translate, methods=["POST"]), Route("/health", health)])


def project_model(checkpoint: Path, precision: str, new_tokens: int):
    """A `Transformer` on the checkpoint's weights with the preset's tokenizer,
    whose every search runs `new_tokens` decoder steps."""
    import numpy as np
    from safetensors.numpy import load_file

    from benchmarks.project import FixedLengthBackbone
    from keras_transformer import Transformer, TransformerPreprocessor, TransformerTokenizer
    from keras_transformer.generation.settings import LENGTH_BUCKET
    from keras_transformer.marian.config import backbone_arguments
    from keras_transformer.marian.convert import load_marian_weights

    class FoldedIdsPreprocessor(TransformerPreprocessor):
        """The preset's ids in the checkpoint's vocabulary (`in_vocabulary`), and
        back: random weights choose any of the checkpoint's ids, most of them
        past the preset's vocabulary, folded into it before detokenizing."""

        def pack_sources(self, rows, bucket=LENGTH_BUCKET):
            return super().pack_sources([in_vocabulary(row, vocabulary_size) for row in rows], bucket)

        def generate_postprocess(self, x):
            ids = np.asarray(x["decoder_token_ids"]) % self.tokenizer.vocabulary_size()
            return super().generate_postprocess({**x, "decoder_token_ids": ids})

    class FixedLengthTransformer(Transformer):
        """`generate` with an output buffer of `new_tokens + 1` positions (start
        token included) unless told otherwise, and the server's warm-up compiling that search."""

        def generate(self, inputs, max_length=None, *args, **kwargs):
            return super().generate(inputs, new_tokens + 1 if max_length is None else max_length, *args, **kwargs)

        def compile_searches(self, token_ids, search=None):
            self.generate(token_ids, search=search)

    tokenizer = TransformerTokenizer(proto=str(TOKENIZER))
    # The checkpoint's weights with the tokenizer's special ids (a `Transformer`
    # checks that both agree); which rows are special changes no cost.
    marian = checkpoint / MARIAN_DIR
    config = json.loads((marian / "config.json").read_text())
    backbone = FixedLengthBackbone(
        **backbone_arguments(config, str(marian)),
        pad_token_id=tokenizer.pad_token_id,
        start_token_id=tokenizer.start_token_id,
        end_token_id=tokenizer.end_token_id,
        unk_token_id=tokenizer.token_to_id("<unk>"),
    )
    load_marian_weights(backbone, load_file(marian / "model.safetensors"), str(marian))
    vocabulary_size = backbone.vocabulary_size
    model = FixedLengthTransformer(backbone=backbone, preprocessor=FoldedIdsPreprocessor(tokenizer))
    if precision == "int8":
        model.quantize("int8")
    return model


def project_app(spec: dict, checkpoint: Path):
    from benchmarks.project import set_threads
    from keras_transformer.generation.settings import SearchSettings
    from keras_transformer.server import ModelEngine, ServiceSettings, TranslationService, app_of, served_model
    from keras_transformer.server.programs import SearchPrograms

    set_threads(spec["threads"])
    model = project_model(checkpoint, spec["precision"], spec["new_tokens"])
    search = SearchSettings(beam_size=None if spec["beam_size"] == 1 else spec["beam_size"], max_extra_length=0)
    engine = ModelEngine(
        model,
        search=search,
        max_batch_size=spec["max_batch_size"],
        max_source_bucket=spec["max_source_bucket"],
        name="en-de",
    )
    # Every search runs `new_tokens` steps: a buffer of that many positions after the start token.
    engine.programs = SearchPrograms(model, search, buffer_length=lambda width: spec["new_tokens"] + 1)
    service = TranslationService([served_model("en-de", engine, (["en"], ["de"]))], ServiceSettings())
    return app_of(service, warm_up=True)


def build_server_app(spec: dict):
    checkpoint = Path(spec["checkpoint"])
    threads = spec["threads"]
    if spec["kind"] == "project":
        return project_app(spec, checkpoint)
    tokenize = SentencePieceIds()
    if spec["kind"] == "ct2-requests":
        decoder = CTranslate2Decoder(checkpoint, spec["precision"], spec["beam_size"], spec["new_tokens"], threads, 1)
        return requests_app(decoder, tokenize, threads)
    from keras_transformer.server import ServiceSettings, TranslationService, app_of, served_model

    # One thread per part of each batch: on the 2-core EPYC of `RESULTS-serving.md`,
    # CTranslate2 with two threads on one batch was slower than with one.
    decoder = CTranslate2Decoder(
        checkpoint, spec["precision"], spec["beam_size"], spec["new_tokens"], threads, 1, split=True
    )
    engine = CTranslate2Engine(decoder, tokenize, spec["max_batch_size"])
    service = TranslationService([served_model("en-de", engine, (["en"], ["de"]))], ServiceSettings())
    return app_of(service, warm_up=True)


def import_libraries(kind: str) -> None:
    """Everything the server imports, before its model loads (so that the
    resident memory then is the libraries' own)."""
    import starlette.applications  # noqa: F401
    import uvicorn  # noqa: F401

    if kind.startswith("ct2"):
        import ctranslate2  # noqa: F401
    if kind != "ct2-requests":
        import keras_transformer.server  # noqa: F401
    if kind == "project":
        import benchmarks.project  # noqa: F401


def main() -> None:
    spec_path, port, status_path = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    spec = json.loads(Path(spec_path).read_text())
    import_libraries(spec["kind"])
    status_path.write_text(json.dumps({"pid": os.getpid(), "rss_after_imports": resident_bytes()}))
    app = build_server_app(spec)
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
