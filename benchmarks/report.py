"""`benchmarks/RESULTS.md` from the workers' results."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

from benchmarks import REPO_ROOT
from benchmarks.machine_load import OtherLoad
from benchmarks.workloads import SIZES, Train, headline_workloads, training_flops, workload_from_dict

PACKAGES = ("keras", "keras-hub", "tensorflow", "jax", "jaxlib", "torch", "transformers", "ctranslate2", "numpy")


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = "not installed"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True)
    found["keras-transformer (git)"] = commit.stdout.strip() or "unknown"
    return found


# The CPU flags that decide which matrix-product kernels can run: AVX-512,
# its bfloat16 and VNNI (int8) forms, and AMX's tiles.
MATRIX_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")


def machine() -> dict:
    model, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "unknown":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "matrix_extensions": [flag for flag in MATRIX_FLAGS if flag in flags],
        "platform": platform.platform(),
    }


def _is_peer(result: dict) -> bool:
    return result["job"]["implementation"] != "project"


def _precision_class(result: dict) -> str:
    """ "float32" or "reduced" (bfloat16 matrix products, int8 weights)."""
    return "float32" if result["job"]["precision"] == "float32" else "reduced"


def _entry(result: dict, name: str) -> dict:
    return result["workloads"].get(name, {})


def _throughput(entry: dict) -> float | None:
    return entry.get("sentences_per_s", entry.get("tokens_per_s"))


def _cell(entry: dict, workload, peak_gflops: float | None) -> str:
    if "error" in entry:
        return "error"
    if "skipped" in entry:
        return "-"
    value = _throughput(entry)
    if value is None:
        return ""
    text = f"{value:,.0f}" if value >= 100 else f"{value:.1f}"
    if isinstance(workload, Train) and peak_gflops:
        utilisation = training_flops(workload) / entry["steady_s"] / 1e9 / peak_gflops
        text += f" ({utilisation:.0%} MFU)"
    return text


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _by_label(results: list[dict]) -> dict[str, list[dict]]:
    """Results grouped by implementation label (one per size), in run order."""
    grouped: dict[str, list[dict]] = {}
    for result in results:
        grouped.setdefault(result["job"]["label"], []).append(result)
    return grouped


def _find(group: list[dict], name: str) -> dict:
    for result in group:
        if name in result["workloads"]:
            return result["workloads"][name]
    return {}


def render(context: dict, results: list[dict]) -> str:
    sizes = [s for s in SIZES if any(r["job"]["size"] == s for r in results)]
    peak = (context.get("peak") or {}).get("peak_gflops")
    grouped = _by_label(results)
    lines = ["# Benchmark results", ""]
    loads = {
        when: OtherLoad(**context[key])
        for when, key in (("before it started", "other_load_before"), ("while it ran", "other_load_during"))
        if context.get(key)
    }
    disturbed = [f"{when}: {load.describe()}" for when, load in loads.items() if not load.quiet]
    if context["dev"] or disturbed or not loads:
        why = "; ".join(disturbed) if disturbed else "marked --dev" if context["dev"] else "not measurable here"
        lines += [
            f"> **Development run: other work shared the machine or was not measured** (other processes {why}). "
            "These numbers only show that the harness works; they are **not** measurements to quote.",
            "",
        ]
    lines += [
        f"- Date (UTC): {context['started']} to {context['finished']}",
        f"- Command: `{context['command']}` (from the repository root)",
        f"- Machine: {context['machine']['cpu_count']} CPUs, {context['machine']['cpu_model']}, "
        f"{context['machine']['platform']}; matrix extensions: "
        + (", ".join(context["machine"].get("matrix_extensions", [])) or "none found"),
        f"- Threads: {context['threads']} per implementation: "
        + ", ".join(f"`{k}={v}`" for k, v in context["thread_environment"].items())
        + "; `torch.set_num_threads`, `tf.config.threading.set_intra_op_parallelism_threads`, CTranslate2 "
        "`intra_threads`; "
        + (
            f"pinned to CPUs {context['pinned_cpus']}"
            if context["pinned_cpus"]
            else "no pinning (no more CPUs than threads)"
        )
        + ".",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in context["versions"].items()),
    ]
    if loads:
        lines.append(
            "- Other processes' CPU use (`benchmarks/machine_load.py`): "
            + "; ".join(f"{when} {load.describe()}" for when, load in loads.items())
        )
    imported = sorted({r["module_file"] for r in results if r.get("module_file")})
    if imported:
        lines.append("- `keras_transformer` imported from: " + ", ".join(f"`{path}`" for path in imported))
    if context.get("peak"):
        p = context["peak"]
        lines.append(
            f"- Matrix-multiply peak (float32 {p['size']}x{p['size']}, median of 5): numpy "
            f"{p['numpy_gflops']:.1f} GFLOP/s, torch {p['torch_gflops']:.1f} GFLOP/s; MFU is against "
            f"{p['peak_gflops']:.1f} GFLOP/s."
        )
    lines += [
        "",
        "Workloads: random weights, identical in every implementation (one `MarianMTModel` checkpoint per "
        "size; base = 6+6 layers, d_model 512, 8 heads, FFN 2048, vocabulary 32,000; tiny = 4+4, 128, 4, "
        "256, 8,000). Decoding: batch 32, 24 source tokens (23 + `</s>`), exactly 24 new tokens with the "
        "end token suppressed; sentences/s. Training: 128 pairs of 32 + 32 tokens, source + target tokens/s, "
        "model FLOPs utilisation (MFU) = counted model FLOPs (3x forward, see "
        "`benchmarks/workloads.py:training_flops`) / step time / matmul peak. Steady state = median of "
        "the timed calls after the first (training: a call of 1 + N steps minus a call of 1 step, over N, "
        "so that a call's set-up is not counted as training); the first call (compilation) is listed separately.",
        "",
    ]

    # Agreement
    lines += ["## Agreement with the reference (checked before timing)", ""]
    rows = []
    for label, group in grouped.items():
        for result in group:
            check = result.get("check")
            if result.get("is_reference"):
                cells = ["reference", "reference"]
            elif check:
                cells = [
                    f"{check['sentences_equal']:.0%} of sentences, {check['tokens_equal']:.1%} of tokens",
                    f"{check['max_log_prob_difference']:.1e}",
                ]
            else:
                cells = ["not checked", ""]
            rows.append([label, result["job"]["size"], *cells])
    lines += _table(
        ["implementation", "size", "greedy output identical (first 23 tokens)", "max abs log-prob difference"],
        rows,
    )
    lines += [
        "",
        "Greedy: batch 32, 24 -> 24 tokens. Log-probabilities: the same batch, teacher-forced on 24 fixed "
        "random target tokens (softmax without `<pad>`, as CTranslate2's vocabulary has it). float32 "
        "implementations are timed only with at least 90% of the sentences identical (tokens can tie to "
        "float32 precision) and log-probabilities within 1e-3. Random models tend to repeat one token per sentence, "
        "so the log-probabilities are the stronger test of identical weights.",
        "",
    ]

    # Headline
    columns = []
    for kind in ("decode", "train"):
        for size in sizes:
            columns += [w for w in headline_workloads(size) if w.kind == kind]
    present = [w for w in columns if any(_find(g, w.name) for g in grouped.values())]

    def short(w) -> str:
        if isinstance(w, Train):
            return f"{w.size} train (tokens/s)"
        return f"{w.size} {'greedy' if w.beam_size == 1 else f'beam {w.beam_size}'}"

    lines += ["## Throughput (sentences/s; training: tokens/s)", ""]
    rows = [[label] + [_cell(_find(g, w.name), w, peak) for w in present] for label, g in grouped.items()]
    lines += _table(["implementation"] + [short(w) for w in present], rows) + [""]

    # Ratios, each against the fastest peer of the same precision class: a
    # float32 implementation against float32 peers, a reduced-precision one
    # (bfloat16, int8) against every reduced-precision peer.
    lines += ["## This project / fastest peer of the same precision class", ""]
    fastest = {}
    for w in present:
        for label, g in grouped.items():
            value = _throughput(_find(g, w.name))
            key = (w.name, _precision_class(g[0]))
            if _is_peer(g[0]) and value and value > fastest.get(key, (0, ""))[0]:
                fastest[key] = (value, label)
    rows = []
    for label, g in grouped.items():
        if _is_peer(g[0]):
            continue
        row = [label]
        for w in present:
            value, peer = _throughput(_find(g, w.name)), fastest.get((w.name, _precision_class(g[0])))
            row.append(f"{value / peer[0]:.2f} ({peer[1]})" if value and peer else "")
        rows.append(row)
    lines += _table(["implementation"] + [short(w) for w in present], rows) + [""]

    # Start-up, compilation, memory
    lines += ["## Start-up, first call (compilation) and memory", ""]
    rows = []
    for label, group in grouped.items():
        for result in group:
            size = result["job"]["size"]
            firsts = []
            for w in headline_workloads(size):
                entry = result["workloads"].get(w.name, {})
                if "first_s" in entry:
                    firsts.append(f"{short(w).split(' (')[0]} {entry['first_s']:.1f} / {entry['steady_s']:.2f}")
            rows.append(
                [
                    label,
                    size,
                    f"{result['import_s']:.1f}" if "import_s" in result else "",
                    f"{result['load_s']:.1f}" if "load_s" in result else "",
                    "; ".join(firsts),
                    f"{result.get('peak_rss_mb', 0):,.0f}",
                ]
            )
    lines += _table(
        ["implementation", "size", "import s", "load s", "first call s / steady s (per call or step)", "peak RSS MB"],
        rows,
    )
    lines += [
        "",
        "Peak RSS is the whole process (`resource.getrusage`), libraries included: "
        "`import keras_transformer` loads TensorFlow on every backend.",
        "",
    ]

    # Grid
    headline_names = {w.name for s in sizes for w in headline_workloads(s)}
    grid = []
    for result in results:
        for name in result["workloads"]:
            if name not in headline_names and name not in grid:
                grid.append(name)
    if grid:
        lines += ["## Greedy decoding over batch sizes and source lengths (sentences/s)", ""]
        workloads = {}
        for result in results:
            for w in result["job"]["workloads"]:
                workload = workload_from_dict(w)
                workloads[workload.name] = workload
        rows = [
            [label] + [_cell(_find(g, name), workloads[name], None) for name in grid] for label, g in grouped.items()
        ]
        header = [name.split(", ", 1)[1] for name in grid]
        lines += _table(["implementation"] + header, rows) + [""]

    # Problems
    problems = []
    for result in results:
        label = f"{result['job']['label']} ({result['job']['size']})"
        if "error" in result:
            problems.append(f"- {label}: {result['error']}")
        for name, entry in result["workloads"].items():
            if "error" in entry:
                problems.append(f"- {label}, {name}: {entry['error']}")
    if problems:
        lines += ["## Errors", "", *problems, "", "Logs: `benchmarks/.work/*.log`.", ""]

    lines += [
        "## Method notes",
        "",
        "- Each implementation and size runs in its own process (`benchmarks/worker.py`); the Keras "
        "backend is fixed per process by `KERAS_BACKEND`.",
        "- This project gets the checkpoint through `benchmarks/marian_weights.py:backbone_from_marian` "
        "(the project's own Marian converter, `keras_transformer.marian`). Decoding uses the public "
        "`Transformer.generate` (greedy: `beam_size=None`), with one benchmark-only hook (`benchmarks/project.py:"
        "FixedLengthBackbone`) that keeps the end token from winning before the length limit; every "
        "implementation runs 24 decoder steps. Training uses `model.compile()` (the paper's recipe) and "
        "`model.fit` on token ids in a tf.data pipeline with the autotuner off, as the train command's "
        "(`keras_transformer.training.data.without_autotuning`).",
        "- Hugging Face: `generate(num_beams, min_new_tokens = max_new_tokens = 24, suppress_tokens=[<pad>])`; "
        "training is a plain torch loop with the same label-smoothed loss and Adam(0.9, 0.98, 1e-9); "
        '`bfloat16` runs both under `torch.autocast("cpu", dtype=torch.bfloat16)`.',
        "- CTranslate2: `TransformersConverter` on the saved checkpoint, `Translator(compute_type=...)` with each "
        "compute type named in the table (`--peers ct2-best`: every type `ctranslate2.get_supported_compute_types"
        '("cpu")` lists), `translate_batch(beam_size, min_decoding_length = max_decoding_length = 24)`.',
        "",
    ]
    return "\n".join(lines)


APPENDED_HEADING = "## Profiles and other measurements"


def appended_sections(text: str) -> str:
    """The part of an existing RESULTS.md that `render` does not write (from
    `APPENDED_HEADING` on: profiles and measurements of other scripts), so
    that a new run keeps it.

    Example:
    >>> appended_sections("# Benchmark results\\n| a |\\n" + APPENDED_HEADING + "\\nkept\\n")
    '## Profiles and other measurements\\nkept\\n'
    """
    start = text.find(APPENDED_HEADING)
    return "" if start < 0 else text[start:]
