"""Training data at scale: the in-memory path against preparation once and streaming, and training from it.

Whether training's memory and start-up stay flat as the corpus grows (the
goal: training's peak RSS at 4.5M pairs within 10% of that at 100,000, and a
resumed run training again within 30 s at 4.5M pairs). For each corpus size,
a synthetic corpus of WMT-like length (two Multi30k sentences joined per
line, about 30 tokens a side; random words when Multi30k is absent) is
generated into --workdir (never committed), then each measurement (--kinds,
all by default) runs in a fresh process so that its peak RSS is its own:

- old: `read_parallel`, `tokenize_pairs` and `token_batches` as
  `keras-transformer train --src --tgt` runs them at every start;
- prepare: `prepare_corpus` (one streaming pass into shards);
- stream: `prepared_batches` over the shards, as `train --data` runs it;
- train: the first --train-steps steps of `TrainingRun(run folder,
  data=prepared folder)`, what `keras-transformer train --data` runs, in a
  new run folder, with batches of --train-tokens-per-batch tokens;
- resume: the same run folder started again with max_steps 5 higher: it
  resumes from the checkpoint train wrote at its end and reads the prepared
  shards (it prepares and tokenizes nothing).

Both batch pipelines are timed to their first batch and over --batches
batches of --tokens-per-batch tokens. Both training runs are timed from the
process's start to the end of their first step (imports, opening the corpus,
filling the shuffle buffer, building, compiling and, for resume, restoring
included) and over their later steps (which include compiling the step
for each new batch shape), by a Keras callback given to `Trainer.fit`'s
`callbacks`. The model (1 layer a stack, d_model 32) and its batches (4,000
tokens by default) are tiny on purpose: what grows with the corpus is the data pipeline, not the
model, so its memory and start-up are not hidden behind the model's. The
old path's memory grows with the corpus; leave it out at tens of millions
of pairs (`--kinds prepare stream train resume`).

    python -m benchmarks.data_pipeline --pairs 100000 1000000 --output benchmarks/RESULTS-data.md
    python -m benchmarks.data_pipeline --pairs 100000 4500000 --kinds prepare stream train resume
"""

import argparse
import gzip
import json
import os
import platform
import random
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
VOCABULARY = REPO_ROOT / "presets" / "multi30k_en_de" / "assets" / "tokenizer" / "vocabulary.spm"
MULTI30K = Path(os.environ.get("KERAS_TRANSFORMER_DATA", REPO_ROOT.parent / "shared" / "data")) / "multi30k" / "raw"
KINDS = ("old", "prepare", "stream", "train", "resume")
# Tiny on purpose: the data pipeline, not the model, is what is measured.
ARCHITECTURE = {"num_layers": 1, "hidden_dim": 32, "intermediate_dim": 64, "num_heads": 2}
RESUME_STEPS = 5  # resume trains this many steps past train's


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


def step_times(started: float, step_ends: list[tuple[int, float]]) -> dict:
    """Training's timings from the `(step, time.time())` of each step's end and the process's start time."""
    (first_step, first_end), (last_step, last_end) = step_ends[0], step_ends[-1]
    return {
        "first_step": first_step,
        "last_step": last_step,
        "first_step_s": first_end - started,
        "later_steps_s": last_end - first_end,
    }


def train(directory: str, folder: str, max_steps: int, tokens_per_batch: int) -> dict:
    """Trains (or resumes) the run folder `directory` from the prepared `folder` to `max_steps`; its steps' ends."""
    import functools

    import keras

    from keras_transformer.training_run import TrainingRun

    class StepEnds(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.ends = []

        def on_train_batch_end(self, batch, logs=None):
            step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
            self.ends.append((step, time.time()))

    step_ends = StepEnds()

    class TimedRun(TrainingRun):
        """`keras-transformer train`'s run; its `Trainer.fit` also calls `step_ends` (fit's `callbacks`)."""

        def trainer(self, *, chief: bool = True):
            trainer = super().trainer(chief=chief)
            trainer.fit = functools.partial(trainer.fit, callbacks=[step_ends])
            return trainer

    TimedRun(
        directory,
        ARCHITECTURE,
        data=folder,
        max_steps=max_steps,
        tokens_per_batch=tokens_per_batch,
        checkpoint_every_minutes=None,
        checkpoint_every_steps=max_steps,  # and at the end: the checkpoint a resumed run starts from
        verbose=0,
    ).train()
    if not step_ends.ends:
        raise RuntimeError(f"{directory}: no training step ran.")
    return {"steps": step_ends.ends, "backend": keras.backend.backend()}


def run_folder(folder) -> Path:
    """The run folder that train and resume train in, beside the prepared `folder`."""
    return Path(f"{folder}-run")


def measure(kind: str, source: str, target: str, folder: str, args) -> dict:
    if kind in ("train", "resume"):
        started = float(os.environ["DATA_PIPELINE_STARTED"])  # set by run_measurement
        steps = args.train_steps + (RESUME_STEPS if kind == "resume" else 0)
        trained = train(str(run_folder(folder)), folder, steps, args.train_tokens_per_batch)
        result = {**step_times(started, trained["steps"]), "backend": trained["backend"]}
        result["tokens_per_batch"] = args.train_tokens_per_batch
    else:
        result = measure_data(kind, source, target, folder, args.tokens_per_batch, args.batches)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def measure_data(kind: str, source: str, target: str, folder: str, tokens_per_batch: int, batches: int) -> dict:
    import keras_transformer as kt
    from keras_transformer.training import data, parallel_text, shards_reading, shards_writing

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
        corpus = shards_writing.prepare_corpus(source, target, folder, tokenizer, 256, overwrite=True)
        result["prepare_s"] = time.perf_counter() - start
        result["pairs_per_s"] = corpus.read.pairs / result["prepare_s"]
    else:
        corpus = shards_reading.PreparedCorpus.open(folder)
        result.update(
            time_batches(shards_reading.prepared_batches(corpus, tokens_per_batch, repeat=True, seed=1), batches)
        )
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
    command += ["--train-steps", str(args.train_steps), "--train-tokens-per-batch", str(args.train_tokens_per_batch)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    env["DATA_PIPELINE_STARTED"] = repr(time.time())  # the process's start, for training's first step
    output = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def report(rows: list[dict], command: str, load: tuple[float, float] | None = None) -> str:
    """The Markdown report; `load`: the 1-minute load averages at the run's start and end."""
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    lines = [
        "# Training data: in memory against prepared and streamed, and training from it",
        "",
        f"- Date (UTC): {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
        f"- Command: `{command}` (from the repository root)",
        f"- Machine: {os.cpu_count()} CPUs, {cpu}, {platform.platform()}"
        + (f"; load average {load[0]:.2f} at the start, {load[1]:.2f} at the end." if load else "."),
        "- Corpus: synthetic, two Multi30k training sentences joined per line (about 30 tokens a side), "
        "tokenized with the `multi30k_en_de` vocabulary; max length 256.",
        "- Each measurement runs in its own process; peak RSS is that process's.",
    ]
    trained = [row for row in rows if "backend" in row]
    if trained:
        backends = ", ".join(sorted({row["backend"] for row in trained}))
        tokens = ", ".join(f"{n:,}" for n in sorted({row["tokens_per_batch"] for row in trained}))
        lines.append(
            f"- train and resume: `TrainingRun(run folder, {ARCHITECTURE}, data=prepared folder)`, batches of "
            f"{tokens} tokens, on Keras' {backends} backend, a tiny model on purpose (what grows with the "
            "corpus is the data pipeline); resume starts the same run folder again with a higher max_steps. "
            "First step: seconds from the process's start to the end of its first training step; steps: those "
            "trained, and the seconds of all after the first."
        )
    lines += [
        "",
        "| pairs | path | read | tokenize or prepare | pairs/s to ids | first batch | batching pairs/s "
        "| first step | steps | after the first | peak RSS |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def seconds(row, key):
        return f"{row[key]:.1f} s" if key in row else ""

    for row in rows:
        rate = f"{row['pairs_per_s']:,.0f}" if "pairs_per_s" in row else ""
        batch_rate = f"{row['batches_pairs_per_s']:,.0f}" if "batches_pairs_per_s" in row else ""
        tokenize = seconds(row, "tokenize_s") or seconds(row, "prepare_s")
        steps = f"{row['first_step']}-{row['last_step']}" if "first_step" in row else ""
        lines.append(
            f"| {row['pairs']:,} | {row['path']} | {seconds(row, 'read_s')} | {tokenize} | {rate} | "
            f"{seconds(row, 'first_batch_s')} | {batch_rate} | {seconds(row, 'first_step_s')} | {steps} | "
            f"{seconds(row, 'later_steps_s')} | {row['peak_rss_mb']:,.0f} MB |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="what to measure (all)")
    parser.add_argument("--tokens-per-batch", type=int, default=25000, help="of old and stream's batches")
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--train-steps", type=int, default=100, help="steps train trains")
    parser.add_argument("--train-tokens-per-batch", type=int, default=4000, help="of training's batches")
    parser.add_argument("--workdir", default="/tmp/keras_transformer_data_bench")
    parser.add_argument("--output", help="write the results table (Markdown) here")
    parser.add_argument("--measure", nargs=4, metavar=("KIND", "SRC", "TGT", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(*args.measure, args)))
        return
    if "resume" in args.kinds and "train" not in args.kinds:
        parser.error("resume resumes the run that train trains: measure train too.")
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    rows, load_at_start = [], os.getloadavg()[0]
    for pairs in args.pairs:
        folder = workdir / f"prepared{pairs}"
        if "prepare" not in args.kinds and {"stream", "train"} & set(args.kinds):
            if not (folder / "manifest.json").exists():
                parser.error(f"{folder} holds no prepared corpus: measure prepare too.")
        source, target = generate(pairs, workdir / f"corpus{pairs}")
        for kind in (kind for kind in KINDS if kind in args.kinds):
            if kind == "train":
                shutil.rmtree(run_folder(folder), ignore_errors=True)  # a new run, from step 0
            row = {"pairs": pairs, "path": kind, **run_measurement(kind, source, target, folder, args)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    command = "python -m benchmarks.data_pipeline " + " ".join(sys.argv[1:] if argv is None else argv)
    text = report(rows, command, (load_at_start, os.getloadavg()[0]))
    print(text)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
