"""The serving benchmark's servers as shipped: this project's `keras-transformer serve` and the real LibreTranslate.

Both serve the same preset's weights, translate as they do by default (beam 4;
`beam_size` 1: `serve --greedy` and `ARGOS_BEAM_SIZE=1`) and stop where the
model does: unlike the `benchmarks.serving_server` servers, nothing fixes the
output length. The preset is the shipped `multi30k_en_de` (tiny, trained:
both translate the test sentences alike); there is none at base size (see `PRESETS`).

Implementation names: `libretranslate` (`benchmarks.libretranslate`) and
`serve-BACKEND-PRECISION`, e.g. `serve-tensorflow-float32`, `serve-jax-int8`.

Ready: seconds from the process's start to its first answer of a
translation. LibreTranslate loads its model on the first request, so that
answer is its readiness; this project's server answers once every batch shape
is compiled. Resident memory is that of the whole process tree.
"""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import REPO_ROOT
from benchmarks import libretranslate as lt
from benchmarks.serving_load import request_body
from benchmarks.serving_server import resident_bytes

SHIPPED_KINDS = ("libretranslate", "serve")
TINY_PRESET = "multi30k_en_de"
BACKENDS = ("tensorflow", "jax", "torch")
# `serve --engine ctranslate2` (its model converted once into a cache), named as a backend.
ENGINES = ("ctranslate2",)
PRECISIONS = ("float32", "bfloat16", "int8")
SOURCE, TARGET = "en", "de"
# The language pairs of further copies of the model (`--models N`): distinct
# pairs, so that `serve` keeps each copy (it routes a pair to its first model).
COPY_PAIRS = (("fr", "it"), ("es", "pt"), ("nl", "sv"), ("da", "fi"), ("pl", "cs"), ("hu", "ro"), ("el", "bg"))


def parse_shipped(name: str) -> dict | None:
    """The spec of a shipped server's name, `None` for another implementation's.

    Example:
    >>> parse_shipped("serve-jax-int8")["backend"], parse_shipped("libretranslate")["kind"]
    ('jax', 'libretranslate')
    >>> parse_shipped("tensorflow-int8-batched") is None
    True
    """
    if name == "libretranslate":
        return {"name": name, "kind": "libretranslate", "backend": None, "precision": "float32"}
    if not name.startswith("serve-"):
        return None
    parts = name.split("-")
    if len(parts) != 3 or parts[1] not in BACKENDS + ENGINES or parts[2] not in PRECISIONS:
        raise ValueError(
            f"{name!r} is not serve-BACKEND-PRECISION with BACKEND in {BACKENDS + ENGINES}, PRECISION in {PRECISIONS}."
        )
    return {"name": name, "kind": "serve", "backend": parts[1], "precision": parts[2]}


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants, from /proc."""
    tree, index = [pid], 0
    while index < len(tree):
        for task in Path(f"/proc/{tree[index]}/task").glob("*"):
            try:
                tree += [int(child) for child in (task / "children").read_text().split()]
            except OSError:
                pass
        index += 1
    return tree


def tree_resident_bytes(pid: int) -> int | None:
    """The resident memory of `pid` and its descendants (None once it is gone)."""
    sizes = [resident_bytes(p) for p in process_tree(pid)]
    return sum(s for s in sizes if s) or None


def serve_command(spec: dict, preset: str, port: int, models: int, beam_size: int, more: str = "") -> list[str]:
    """`keras-transformer serve` of `models` copies of `preset`, the first for en -> de, and `more` options.

    Example:
    >>> spec = parse_shipped("serve-jax-int8")
    >>> " ".join(serve_command(spec, "multi30k_en_de", 5001, 2, 1, "--max-wait-ms 2")[4:])
    'multi30k_en_de=en:de multi30k_en_de=fr:it --port 5001 --backend jax --precision int8 --greedy --max-wait-ms 2'
    """
    if models > 1 + len(COPY_PAIRS):
        raise ValueError(f"at most {1 + len(COPY_PAIRS)} copies of the model; got {models}.")
    pairs = [(SOURCE, TARGET), *COPY_PAIRS[: models - 1]]
    command = [sys.executable, "-m", "keras_transformer.cli", "serve", *(f"{preset}={s}:{t}" for s, t in pairs)]
    command += ["--port", str(port), "--precision", spec["precision"]]
    command += ["--engine", spec["backend"]] if spec["backend"] in ENGINES else ["--backend", spec["backend"]]
    return command + (["--greedy"] if beam_size == 1 else ["--beam-size", str(beam_size)]) + shlex.split(more)


class ShippedServer:
    """A shipped server's process, from start to first answer to stopped."""

    def __init__(self, spec: dict, port: int, workdir: Path, env: dict, cpus: list[int] | None, models: int = 1):
        self.spec, self.port = spec, port
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / f"serving-{spec['name']}-{models}.log"
        if spec["kind"] == "libretranslate":
            home, venv = Path(spec["libretranslate_home"]), Path(spec["libretranslate_venv"])
            command = lt.command(venv, self.port, SOURCE, TARGET)
            env = {**env, **lt.environment(home, spec["threads"], spec["beam_size"])}
        else:
            command = serve_command(
                spec, spec["preset"], self.port, models, spec["beam_size"], spec.get("serve_args", "")
            )
            if spec["backend"] not in ENGINES:
                env = {**env, "KERAS_BACKEND": spec["backend"]}
        pin = ["taskset", "-c", ",".join(map(str, cpus))] if cpus else []
        self.rss_before_model = None
        self.started = time.monotonic()
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                [*pin, *command], cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            )

    def wait_until_ready(self, timeout_s: float, probe: list[str] | None = None) -> float:
        """Seconds from start to the first 200 of `POST /translate` (of `probe`);
        the process tree's resident memory when it first answers any HTTP request
        is kept as `rss_before_model` (LibreTranslate loads its model only then)."""
        import httpx

        body = request_body(probe or ["A dog runs."])
        while time.monotonic() - self.started < timeout_s:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}: see {self.log_path}")
            try:
                if self.rss_before_model is None and self.spec["kind"] == "libretranslate":
                    httpx.get(self.url + "/languages", timeout=5, trust_env=False)
                    self.rss_before_model = tree_resident_bytes(self.process.pid)
                response = httpx.post(self.url + "/translate", json=body, timeout=60, trust_env=False)
                if response.status_code == 200:
                    return time.monotonic() - self.started
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"the server did not answer after {timeout_s:.0f} s: see {self.log_path}")

    def memory(self) -> dict:
        return {
            "rss_before_model": self.rss_before_model,
            "rss_ready": tree_resident_bytes(self.process.pid),
            "rss_peak": resident_bytes(self.process.pid, "VmHWM"),
        }

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def memory_per_model(spec: dict, memory: dict, models: int, start, timeout_s: float) -> dict:
    """What one more model costs. LibreTranslate loads its one model on the
    first request: its memory then less its memory before (one pair; more
    pairs would need more trained packages). `serve`: `start(models)` serves
    `models` copies; (its memory ready less `memory`'s with one) / (models - 1)."""
    if spec["kind"] == "libretranslate":
        before, after = memory.get("rss_before_model"), memory.get("rss_ready")
        return {"per_model": after - before if before and after else None, "models": 1}
    if models < 2:
        return {"per_model": None, "models": 1}
    server = start(models)
    try:
        server.wait_until_ready(timeout_s)
        rss = server.memory()["rss_ready"]
    finally:
        server.stop()
    return {"per_model": (rss - memory["rss_ready"]) / (models - 1), "models": models, "rss_ready_models": rss}


# Random weights stop nowhere: they repeat one token (a logits bias on the end token makes them
# stop at once or never), so LibreTranslate would decode 256 tokens a sentence where `serve` stops at
# the source + 50. The comparison needs weights that end their sentences: a trained preset's.
PRESETS = {"tiny": TINY_PRESET}


def preset_of(size: str) -> str:
    """The preset both shipped servers serve at `size`."""
    if size not in PRESETS:
        raise SystemExit(
            f"the shipped servers run at size {sorted(PRESETS)} only: {size!r} has random weights, which never "
            "choose the end token, and LibreTranslate would decode 256 tokens a sentence where `serve` stops at "
            "the source + 50."
        )
    return PRESETS[size]
