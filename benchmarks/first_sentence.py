"""The command line's first sentence, and `translate` answering a pipe line by line.

    python -m benchmarks.first_sentence                        # TensorFlow, 5 runs
    python -m benchmarks.first_sentence --runs 9 --backend jax
    python -m benchmarks.first_sentence --command keras-transformer --no-streaming

One sentence: `keras-transformer translate --preset multi30k_en_de "Two dogs
play in the snow."` end to end in a fresh process, the median of `--runs`
runs (wall time, and the process's CPU time), with an empty compile cache
each run (`KERAS_TRANSFORMER_COMPILE_CACHE` a new folder, as in a fresh
install) and with a warm one (a folder one unmeasured run filled). Its
breakdown comes from as many processes that do what the command does with a
timestamp between the steps: interpreter start, imports, loading the preset,
translating, exit (medians).

Streaming: one `translate` process reading a pipe, as a user typing would
feed it. The first `--sentences` sentences of Multi30k's test_2016_flickr
are written one at a time, each `--pause` seconds after the translation of
the one before was read; a first pass compiles the search's shapes (its
first line also waits for the model to load), the second is measured: the
time from writing a line to reading its translation (median and max), for
greedy and beam 4. The translations are compared with those of `--input` (a
file, batched). Skipped with a message when the data is absent.

The command is `python -m keras_transformer.cli` by default; `--command`
runs another (an installed `keras-transformer`, or an older copy to compare).
The machine's load average is printed with the results.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import queue
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks import REPO_ROOT

DATA = Path(os.environ.get("KERAS_TRANSFORMER_DATA", REPO_ROOT.parent / "shared" / "data")) / "multi30k"
SENTENCE = "Two dogs play in the snow."
STEPS = ("interpreter start", "imports", "loading the preset", "translating", "exit")

# What `translate` does for one sentence, with a timestamp after each step.
BREAKDOWN_CHILD = r"""
import json, sys, time
marks = [time.time()]
arguments = json.loads(sys.argv[1])
from keras_transformer.cli import startup
startup.prepare(arguments)  # the command line's start-up, before Keras
from keras_transformer.cli import main as cli
from keras_transformer.cli.commands import translate
marks.append(time.time())
startup.after_imports()
args = cli.build_parser(cli._commands()).parse_args(arguments)
model = translate.load_model(args.preset, args.precision)
marks.append(time.time())
model.run_eagerly = not translate._compile_search(args, len(args.sentences))
translate._translate_chunk(model, args.sentences, args, translate.search_settings(args), None)
marks.append(time.time())
print(json.dumps(marks), flush=True)
sys.exit(0)  # as the command ends
"""


def timed_run(command: list[str], environment: dict) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, stdout) of one process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=900)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} failed:\n{result.stderr[-3000:]}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return wall, cpu, result.stdout


def one_sentence(command: list[str], arguments: list[str], runs: int, workdir: Path) -> dict:
    """End to end with an empty and with a warm compile cache, and the breakdown."""
    environment = dict(os.environ)
    warm = workdir / "warm-cache"
    timed_run(command + arguments, {**environment, "KERAS_TRANSFORMER_COMPILE_CACHE": str(warm)})
    results = {"empty": [], "warm": [], "breakdown": []}
    outputs = set()
    for run in range(runs):  # alternating, so that a change in the machine's load touches both
        for cache in ("empty", "warm"):
            folder = workdir / f"empty-cache-{run}" if cache == "empty" else warm
            wall, cpu, output = timed_run(
                command + arguments, {**environment, "KERAS_TRANSFORMER_COMPILE_CACHE": str(folder)}
            )
            results[cache].append((wall, cpu))
            outputs.add(output)
        start = time.time()
        wall, _, output = timed_run(
            [sys.executable, "-c", BREAKDOWN_CHILD, json.dumps(arguments)],
            {**environment, "KERAS_TRANSFORMER_COMPILE_CACHE": str(workdir / f"breakdown-cache-{run}")},
        )
        *translation, marks = output.splitlines()
        marks = [start, *json.loads(marks), start + wall]
        results["breakdown"].append([b - a for a, b in zip(marks, marks[1:])])
        outputs.add("\n".join(translation) + "\n")
    results["outputs"] = sorted(outputs)
    return results


class Translator:
    """A `translate` process reading a pipe; `ask` writes one line and
    waits for its translation."""

    def __init__(self, command: list[str], arguments: list[str], log: Path, environment: dict):
        self.log = log
        self.process = subprocess.Popen(
            command + arguments, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log.open("wb"), env=environment
        )
        self.answers = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.answers.put(line.decode("utf-8").rstrip("\n"))
        self.answers.put(None)

    def ask(self, sentence: str, timeout: float) -> tuple[float, str]:
        start = time.perf_counter()
        self.process.stdin.write(sentence.encode("utf-8") + b"\n")
        self.process.stdin.flush()
        try:
            answer = self.answers.get(timeout=timeout)
        except queue.Empty:
            self.process.kill()
            raise RuntimeError(f"no translation within {timeout} s:\n{self.log.read_text()[-3000:]}") from None
        if answer is None:
            raise RuntimeError(f"translate ended early:\n{self.log.read_text()[-3000:]}")
        return time.perf_counter() - start, answer

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=120)


def streaming(command: list[str], base: list[str], sentences: list[str], pause: float, workdir: Path) -> dict:
    """Latency per line of one warm process, and agreement with `--input`.
    Both start with an empty compile cache; `workdir` is this search's own."""
    workdir.mkdir()
    environment = {**os.environ, "KERAS_TRANSFORMER_COMPILE_CACHE": str(workdir / "streaming-cache")}
    translator = Translator(command, base, workdir / "streaming.log", environment)
    first, _ = translator.ask(sentences[0], timeout=900)
    for sentence in sentences[1:]:  # the first pass: every shape these sentences need is compiled
        time.sleep(pause)
        translator.ask(sentence, timeout=900)
    latencies, translations = [], []
    for sentence in sentences:
        time.sleep(pause)
        latency, translation = translator.ask(sentence, timeout=120)
        latencies.append(latency)
        translations.append(translation)
    translator.close()
    source = workdir / "sentences.txt"
    source.write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
    environment["KERAS_TRANSFORMER_COMPILE_CACHE"] = str(workdir / "file-cache")
    _, _, batched = timed_run(command + base + ["--input", str(source)], environment)
    same = sum(a == b for a, b in zip(translations, batched.splitlines()))
    return {"first": first, "latencies": latencies, "identical": same}


def read_sentences(count: int) -> list[str] | None:
    """The first `count` English sentences of test_2016_flickr, or None if absent."""
    path = DATA / "raw" / "test_2016_flickr.en.gz"
    if not path.exists():
        return None
    with gzip.open(path, "rt", encoding="utf-8") as file:
        return [line.rstrip("\n") for _, line in zip(range(count), file)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="multi30k_en_de")
    parser.add_argument("--backend", choices=("tensorflow", "jax", "torch"), help="default: KERAS_BACKEND")
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per measurement (default 5)")
    parser.add_argument("--sentences", type=int, default=20, help="sentences streamed (default 20)")
    parser.add_argument("--pause", type=float, default=0.2, help="seconds between streamed lines (default 0.2)")
    parser.add_argument("--command", default=f"{shlex.quote(sys.executable)} -m keras_transformer.cli")
    parser.add_argument("--no-streaming", action="store_true", help="only the one-sentence command")
    args = parser.parse_args(argv)
    command = shlex.split(args.command)
    base = ["translate", "--preset", args.preset] + (["--backend", args.backend] if args.backend else [])
    backend = args.backend or os.environ.get("KERAS_BACKEND", "tensorflow")
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="first-sentence-") as workdir:
        workdir = Path(workdir)
        single = one_sentence(command, base + [SENTENCE], args.runs, workdir)
        sentences = None if args.no_streaming else read_sentences(args.sentences)
        streams = {}
        for name, flags in (("greedy", ["--greedy"]), ("beam 4", ["--beam-size", "4"])):
            if sentences:
                folder = workdir / name.replace(" ", "-")
                streams[name] = streaming(command, base + flags, sentences, args.pause, folder)

    print(f'`{args.command} translate --preset {args.preset} "{SENTENCE}"` on {backend}, {args.runs} runs each')
    print(f"(load average {load:.2f} before, {os.getloadavg()[0]:.2f} after); output: {single['outputs']!r}\n")
    print("| compile cache | wall s (median) | wall s (min) | CPU s (median) |")
    print("| --- | --- | --- | --- |")
    for cache in ("empty", "warm"):
        walls, cpus = zip(*single[cache])
        print(f"| {cache} | {statistics.median(walls):.2f} | {min(walls):.2f} | {statistics.median(cpus):.2f} |")
    steps = list(zip(*single["breakdown"]))
    print("\n| " + " | ".join(STEPS) + " | total |")
    print("|" + " --- |" * (len(STEPS) + 1))
    totals = [sum(run) for run in single["breakdown"]]
    print("| " + " | ".join(f"{statistics.median(s):.2f}" for s in steps) + f" | {statistics.median(totals):.2f} |")
    if args.no_streaming:
        return
    if not sentences:
        print(f"\nStreaming skipped: {DATA / 'raw' / 'test_2016_flickr.en.gz'} is absent.")
        return
    print(
        f"\nStreaming: one process reading a pipe, {len(sentences)} sentences of test_2016_flickr one at a time, "
        f"{args.pause} s apart; latency from writing a line to reading its translation, second pass:\n"
    )
    print("| search | first line (load + compile) s | median ms | max ms | identical to --input |")
    print("| --- | --- | --- | --- | --- |")
    for name, result in streams.items():
        latencies = result["latencies"]
        print(
            f"| {name} | {result['first']:.1f} | {1000 * statistics.median(latencies):.0f} "
            f"| {1000 * max(latencies):.0f} | {result['identical']} of {len(latencies)} |"
        )


if __name__ == "__main__":
    main()
