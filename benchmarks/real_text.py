"""Real text: a shipped preset translating Multi30k's test_2016_flickr.

The headline workloads (`benchmarks.run`) decode random models to a fixed
length; real sentences end on their own, long before section 6.1's source +
50 limit, which is what `Transformer.generate`'s short first buffer exploits.
This measures it on real text, in one process per backend:

    python -m benchmarks.real_text                       # TensorFlow, both ways
    python -m benchmarks.real_text --backend jax --beam-size 4
    python -m benchmarks.real_text --precisions float32 mixed_bfloat16 int8

For each way (`short-first`: the library's default; `full-buffer`: every
batch searched with the full source + 50 buffer, as before) it translates the
1,000 test sentences twice in batches of 32 and reports the first pass
(compilation included) and the second (steady state) in sentences/s, the
BLEU of the translations, and whether both ways translate identically.
With `--precisions`, it compares precisions instead (the default way, one
process each): `mixed_bfloat16` loads the preset with that dtype policy,
`int8` applies Keras' `quantize("int8")` after loading (as `translate
--precision` does); BLEU and chrF2 are
reported with their difference from the first precision listed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import REPO_ROOT

DATA = Path(os.environ.get("KERAS_TRANSFORMER_DATA", REPO_ROOT.parent / "shared" / "data")) / "multi30k"
WAYS = ("short-first", "full-buffer")
PRECISIONS = ("float32", "mixed_bfloat16", "int8")


def measure(way: str, preset: str, beam_size: int | None, limit: int | None, precision: str = "float32") -> dict:
    """One way and precision, in this process."""
    from keras_transformer.evaluation.bleu import evaluate_translations
    from keras_transformer.models import transformer_generation
    from keras_transformer.presets.precision import load_model
    from keras_transformer.utils.files import read_lines

    if way == "full-buffer":
        transformer_generation.FIRST_BUFFER_EXTRA = 10**6  # never shorter than the full buffer
    target = preset.rsplit("_", 1)[-1]
    sources = list(read_lines(DATA / "raw" / "test_2016_flickr.en.gz"))[:limit]
    references = list(read_lines(DATA / "raw" / f"test_2016_flickr.{target}.gz"))[:limit]
    model = load_model(preset, "bfloat16" if precision == "mixed_bfloat16" else precision)
    times, translations = [], None
    for _ in range(2):
        start = time.perf_counter()
        translations = model.translate(sources, beam_size=beam_size, alpha=0.6, batch_size=32, verbose=0)
        times.append(time.perf_counter() - start)
    score = evaluate_translations(translations, references, target_language=target)
    return {
        "way": way,
        "precision": precision,
        "sentences": len(sources),
        "first_pass_sentences_per_s": len(sources) / times[0],
        "steady_sentences_per_s": len(sources) / times[1],
        "bleu": score.bleu,
        "chrf": score.chrf,
        "translations": translations,
    }


def run_worker(way: str, precision: str, args: argparse.Namespace) -> dict:
    command = [
        sys.executable,
        "-m",
        "benchmarks.real_text",
        "--way",
        way,
        "--precision",
        precision,
        "--preset",
        args.preset,
        "--beam-size",
        str(args.beam_size),
    ]
    command += ["--limit", str(args.limit)] if args.limit else []
    environment = {**os.environ, "KERAS_BACKEND": args.backend}
    output = subprocess.run(command, cwd=REPO_ROOT, env=environment, capture_output=True, text=True)
    if output.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{output.stderr[-3000:]}")
    return json.loads(output.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="tensorflow", choices=("tensorflow", "jax", "torch"))
    parser.add_argument("--preset", default="multi30k_en_de")
    parser.add_argument("--beam-size", type=int, default=4, help="0 for greedy")
    parser.add_argument("--limit", type=int, help="only the first N sentences")
    parser.add_argument(
        "--precisions",
        nargs="+",
        choices=PRECISIONS,
        help="compare these precisions (the default way) instead of the two ways",
    )
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)  # one measurement, in a worker process
    parser.add_argument("--precision", choices=PRECISIONS, default="float32", help=argparse.SUPPRESS)
    args = parser.parse_args()
    beam_size = args.beam_size or None
    if args.way:
        print(json.dumps(measure(args.way, args.preset, beam_size, args.limit, args.precision)))
        return
    runs = [("short-first", p) for p in args.precisions] if args.precisions else [(w, "float32") for w in WAYS]
    results = [run_worker(way, precision, args) for way, precision in runs]
    reference = results[0]
    search = f"beam {beam_size}" if beam_size else "greedy"
    print(f"{args.preset}, test_2016_flickr ({reference['sentences']} sentences), {args.backend}, {search}, batch 32:")
    print(
        "| way | precision | first pass (sentences/s) | steady (sentences/s) | BLEU | chrF2 "
        "| identical to the first row |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        same = sum(a == b for a, b in zip(reference["translations"], r["translations"]))
        print(
            f"| {r['way']} | {r['precision']} | {r['first_pass_sentences_per_s']:.1f} "
            f"| {r['steady_sentences_per_s']:.1f} | {r['bleu']:.2f} ({r['bleu'] - reference['bleu']:+.2f}) "
            f"| {r['chrf']:.2f} ({r['chrf'] - reference['chrf']:+.2f}) | {same} of {r['sentences']} |"
        )


if __name__ == "__main__":
    main()
