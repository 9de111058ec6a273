"""Training data at scale: the in-memory path against preparation once and streaming.

For each corpus size, a synthetic corpus of WMT-like length (two Multi30k
sentences joined per line, about 30 tokens a side; random words when
Multi30k is absent) is generated into --workdir (never committed), then each
measurement runs in a fresh process so that its peak RSS is its own:

- old: `read_parallel`, `tokenize_pairs` and `token_batches` as
  `keras-transformer train --src --tgt` runs them at every start;
- prepare: `prepare_corpus` (one streaming pass into shards);
- stream: `prepared_batches` over the shards, as `train --data` runs it.

Both batch pipelines are timed to their first batch and over --batches
batches of --tokens-per-batch tokens.

    python -m benchmarks.data_pipeline --pairs 100000 1000000 --output benchmarks/RESULTS-data.md
"""

import argparse
import gzip
import json
import os
import platform
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
VOCABULARY = REPO_ROOT / "presets" / "multi30k_en_de" / "assets" / "tokenizer" / "vocabulary.spm"
MULTI30K = Path(os.environ.get("KERAS_TRANSFORMER_DATA", REPO_ROOT.parent / "shared" / "data")) / "multi30k" / "raw"


def generate(pairs: int, prefix: Path) -> tuple[Path, Path]:
    paths = Path(f"{prefix}.en"), Path(f"{prefix}.de")
    if all(path.exists() for path in paths):
        return paths
    rng = random.Random(0)
    if (MULTI30K / "train.en.gz").exists():
        sides = [
            gzip.open(MULTI30K / f"train.{side}.gz", "rt", encoding="utf-8").read().splitlines()
            for side in "en de".split()
        ]
    else:
        words = "a dog man woman runs plays in the park on street with ball red green two".split()
        sides = [[" ".join(rng.choices(words, k=rng.randint(5, 15))) for _ in range(29000)]] * 2
    with open(paths[0], "w", encoding="utf-8") as source, open(paths[1], "w", encoding="utf-8") as target:
        for _ in range(pairs):
            i, j = rng.randrange(len(sides[0])), rng.randrange(len(sides[0]))
            source.write(f"{sides[0][i]} {sides[0][j]}\n")
            target.write(f"{sides[1][i]} {sides[1][j]}\n")
    return paths


def time_batches(batches, count: int) -> dict:
    start = time.perf_counter()
    iterator = iter(batches)
    next(iterator)
    first = time.perf_counter() - start
    rows = 0
    for _, (x, _, _) in zip(range(count), iterator):
        rows += int(x["encoder_token_ids"].shape[0])
    return {"first_batch_s": first, "batches_pairs_per_s": rows / (time.perf_counter() - start - first)}


def measure(kind: str, source: str, target: str, folder: str, tokens_per_batch: int, batches: int) -> dict:
    import keras_transformer as kt
    from keras_transformer.training import data, parallel_text, preparation, prepared

    tokenizer = kt.TransformerTokenizer(proto=str(VOCABULARY))
    result = {}
    start = time.perf_counter()
    if kind == "old":
        sources, targets, _ = parallel_text.read_parallel(source, target)
        result["read_s"] = time.perf_counter() - start
        pairs = data.tokenize_pairs(sources, targets, tokenizer, 256)
        result["tokenize_s"] = time.perf_counter() - start - result["read_s"]
        result["pairs_per_s"] = len(sources) / (time.perf_counter() - start)
        result.update(time_batches(data.token_batches(pairs, tokens_per_batch, repeat=True, seed=1), batches))
    elif kind == "prepare":
        corpus = preparation.prepare_corpus(source, target, folder, tokenizer, 256, overwrite=True)
        result["prepare_s"] = time.perf_counter() - start
        result["pairs_per_s"] = corpus.read.pairs / result["prepare_s"]
    else:
        corpus = prepared.PreparedCorpus.open(folder)
        result.update(time_batches(prepared.prepared_batches(corpus, tokens_per_batch, repeat=True, seed=1), batches))
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def run_measurement(kind, source, target, folder, args) -> dict:
    command = [
        sys.executable,
        "-m",
        "benchmarks.data_pipeline",
        "--measure",
        kind,
        str(source),
        str(target),
        str(folder),
    ]
    command += ["--tokens-per-batch", str(args.tokens_per_batch), "--batches", str(args.batches)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    output = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def report(rows: list[dict], command: str) -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    lines = [
        "# Training data: in memory against prepared and streamed",
        "",
        f"- Date (UTC): {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
        f"- Command: `{command}` (from the repository root)",
        f"- Machine: {os.cpu_count()} CPUs, {cpu}, {platform.platform()}; shared with other engineers' work "
        "while it ran, so the times are upper bounds and vary from run to run.",
        "- Corpus: synthetic, two Multi30k training sentences joined per line (about 30 tokens a side), "
        "tokenized with the `multi30k_en_de` vocabulary; max length 256.",
        "- Each measurement runs in its own process; peak RSS is that process's.",
        "",
        "| pairs | path | read | tokenize or prepare | pairs/s to ids | first batch | batching pairs/s | peak RSS |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def seconds(row, key):
        return f"{row[key]:.1f} s" if key in row else ""

    for row in rows:
        rate = f"{row['pairs_per_s']:,.0f}" if "pairs_per_s" in row else ""
        batch_rate = f"{row['batches_pairs_per_s']:,.0f}" if "batches_pairs_per_s" in row else ""
        tokenize = seconds(row, "tokenize_s") or seconds(row, "prepare_s")
        lines.append(
            f"| {row['pairs']:,} | {row['path']} | {seconds(row, 'read_s')} | {tokenize} | {rate} | "
            f"{seconds(row, 'first_batch_s')} | {batch_rate} | {row['peak_rss_mb']:,.0f} MB |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--tokens-per-batch", type=int, default=25000)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--workdir", default="/tmp/keras_transformer_data_bench")
    parser.add_argument("--output", help="write the results table (Markdown) here")
    parser.add_argument("--measure", nargs=4, metavar=("KIND", "SRC", "TGT", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(*args.measure, args.tokens_per_batch, args.batches)))
        return
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for pairs in args.pairs:
        source, target = generate(pairs, workdir / f"corpus{pairs}")
        folder = workdir / f"prepared{pairs}"
        for kind in ("old", "prepare", "stream"):
            row = {"pairs": pairs, "path": kind, **run_measurement(kind, source, target, folder, args)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    text = report(rows, "python -m benchmarks.data_pipeline " + " ".join(sys.argv[1:]))
    print(text)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
