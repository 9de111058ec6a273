"""Real text: a shipped preset translating Multi30k's test_2016_flickr.

The headline workloads (`benchmarks.run`) decode random models to a fixed
length; real sentences end on their own, long before section 6.1's source +
50 limit, which is what `Transformer.generate`'s short first buffer exploits.
This measures it on real text, in one process per backend:

    python -m benchmarks.real_text                       # TensorFlow, both ways
    python -m benchmarks.real_text --backend jax --beam-size 4

For each way (`short-first`: the library's default; `full-buffer`: every
batch searched with the full source + 50 buffer, as before) it translates the
1,000 test sentences twice in batches of 32 and reports the first pass
(compilation included) and the second (steady state) in sentences/s, the
BLEU of the translations, and whether both ways translate identically.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("KERAS_TRANSFORMER_DATA", REPO_ROOT.parent / "shared" / "data")) / "multi30k"
WAYS = ("short-first", "full-buffer")


def measure(way: str, preset: str, beam_size: int | None, limit: int | None) -> dict:
    """One way, in this process."""
    from keras_transformer import Transformer
    from keras_transformer.evaluation import evaluate_translations
    from keras_transformer.files import read_lines
    from keras_transformer.models import transformer

    if way == "full-buffer":
        transformer.FIRST_BUFFER_EXTRA = 10**6  # never shorter than the full buffer
    target = preset.rsplit("_", 1)[-1]
    sources = list(read_lines(DATA / "raw" / "test_2016_flickr.en.gz"))[:limit]
    references = list(read_lines(DATA / "raw" / f"test_2016_flickr.{target}.gz"))[:limit]
    model = Transformer.from_preset(preset)
    times, translations = [], None
    for _ in range(2):
        start = time.perf_counter()
        translations = model.translate(sources, beam_size=beam_size, alpha=0.6, batch_size=32, verbose=0)
        times.append(time.perf_counter() - start)
    score = evaluate_translations(translations, references, target_language=target)
    return {
        "way": way,
        "sentences": len(sources),
        "first_pass_sentences_per_s": len(sources) / times[0],
        "steady_sentences_per_s": len(sources) / times[1],
        "bleu": score.bleu,
        "translations": translations,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="tensorflow", choices=("tensorflow", "jax", "torch"))
    parser.add_argument("--preset", default="multi30k_en_de")
    parser.add_argument("--beam-size", type=int, default=4, help="0 for greedy")
    parser.add_argument("--limit", type=int, help="only the first N sentences")
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)  # one way, in a worker process
    args = parser.parse_args()
    beam_size = args.beam_size or None
    if args.way:
        print(json.dumps(measure(args.way, args.preset, beam_size, args.limit)))
        return
    results = []
    for way in WAYS:
        command = [sys.executable, "-m", "benchmarks.real_text", "--way", way, "--preset", args.preset,
                   "--beam-size", str(args.beam_size)] + (["--limit", str(args.limit)] if args.limit else [])
        environment = {**os.environ, "KERAS_BACKEND": args.backend}
        output = subprocess.run(command, cwd=REPO_ROOT, env=environment, capture_output=True, text=True, check=True)
        results.append(json.loads(output.stdout.strip().splitlines()[-1]))
    same = sum(a == b for a, b in zip(results[0]["translations"], results[1]["translations"]))
    search = f"beam {beam_size}" if beam_size else "greedy"
    print(f"{args.preset}, test_2016_flickr ({results[0]['sentences']} sentences), {args.backend}, {search}, batch 32:")
    print("| way | first pass (sentences/s) | steady (sentences/s) | BLEU |")
    print("| --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['way']} | {r['first_pass_sentences_per_s']:.1f} | {r['steady_sentences_per_s']:.1f} | {r['bleu']:.2f} |")
    print(f"identical translations: {same} of {results[0]['sentences']}")


if __name__ == "__main__":
    main()
