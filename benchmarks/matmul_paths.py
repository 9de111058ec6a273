"""Which path runs the model's matrix products on the CPU's bfloat16 and int8 matrix units.

    python -m benchmarks.matmul_paths                          # every path, decoding and training shapes
    python -m benchmarks.matmul_paths --paths torch jax jax-onednn --shapes decode
    python -m benchmarks.matmul_paths --kernels                # what each path runs, not how fast

GFLOP/s of the base model's matrix products (d_model 512, FFN 2048,
vocabulary 32,000), each in float32, bfloat16, bfloat16 with float32 output
(`preferred_element_type`), int8 with int32 output and, on torch only,
`int8-dynamic`: float32 in and out through int8 weights packed once and the
input quantized at each call (`quantized::linear_dynamic`, torch.ao's
dynamic quantization, which `keras_transformer.speed_paths.torch_int8` runs), on
each path a Keras backend can take:

- `torch`: torch eager (oneDNN or MKL);
- `tf-eager`, `tf-function`: TensorFlow op by op and as a graph without XLA
  (oneDNN kernels; `-no-onednn`: `TF_ENABLE_ONEDNN_OPTS=0`, Eigen's);
- `tf-xla`, `jax`: XLA, with the default flags, and with each
  `XLA_FLAGS` variant of `XLA_VARIANTS` (`jax-onednn`, `tf-xla-ynn-off`,
  ...). A variant this XLA does not know makes the process abort, which the
  table reports as the path's error.

Shapes: decoding, one row per hypothesis (32 rows: greedy, batch 32; 128:
beam 4): `ffn in` 512 -> 2048, `ffn out` 2048 -> 512, `logits` h @ E^T
512 -> 32,000. Training, 4,096 rows (128 pairs of 32 tokens): the same
forward products and their backward ones (`dx` = dy @ W^T, `dW` = x^T @ dy,
the logits' `dh` and `dE`). A group's GFLOP/s are its products' FLOPs over
their summed times, every product counted once. Each path runs in its own
process (XLA reads its flags once) with `--threads` threads; a product's time
is the median of repeated calls after two warm-up calls (compilation).

`--kernels` times nothing: each path computes each product once under
`ONEDNN_VERBOSE=1`, and the table names the oneDNN implementations that ran
(`brg_matmul:avx512_core_amx` is AMX) and, for XLA, what its optimised
program made of the dot (a oneDNN or YNNPACK/XNNPACK call, or XLA's own dot
and the element type it computes in).
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import time

D_MODEL, FFN, VOCABULARY = 512, 2048, 32000
DECODE_ROWS = (32, 128)
TRAIN_ROWS = 4096
DTYPES = ("float32", "bfloat16", "bfloat16->float32", "int8->int32", "int8-dynamic")

# XLA flags that could route dots to oneDNN, YNNPACK or XNNPACK (names as
# this XLA's `debug_options_flags.cc` spells them).
XLA_VARIANTS = {
    "": "",
    "-onednn": "--xla_cpu_use_onednn=true",
    "-onednn-custom-call": "--xla_cpu_use_onednn=true --xla_cpu_experimental_onednn_custom_call=true",
    "-onednn-fusion": "--xla_cpu_experimental_onednn_fusion_type=dot",
    "-onednn-no-thunks": "--xla_cpu_use_onednn=true --xla_cpu_use_thunk_runtime=false",
    "-ynn-off": "--xla_cpu_experimental_ynn_fusion_type=",
    "-ynn-dot": "--xla_cpu_experimental_ynn_fusion_type=dot",
    "-xnn-dot": "--xla_cpu_experimental_xnn_fusion_type=dot",
    "-no-xnnpack": "--xla_cpu_use_xnnpack=false",
    "-fast-math": "--xla_cpu_enable_fast_math=true",
}


@dataclasses.dataclass(frozen=True)
class Path:
    framework: str  # torch, tensorflow or jax
    mode: str  # eager, function or xla
    environment: dict


def all_paths() -> dict[str, Path]:
    paths = {
        "torch": Path("torch", "eager", {}),
        "tf-eager": Path("tensorflow", "eager", {"TF_ENABLE_ONEDNN_OPTS": "1"}),
        "tf-eager-no-onednn": Path("tensorflow", "eager", {"TF_ENABLE_ONEDNN_OPTS": "0"}),
        "tf-function": Path("tensorflow", "function", {"TF_ENABLE_ONEDNN_OPTS": "1"}),
        "tf-function-no-onednn": Path("tensorflow", "function", {"TF_ENABLE_ONEDNN_OPTS": "0"}),
    }
    for suffix, flags in XLA_VARIANTS.items():
        paths["tf-xla" + suffix] = Path("tensorflow", "xla", {"XLA_FLAGS": flags})
        paths["jax" + suffix] = Path("jax", "xla", {"XLA_FLAGS": flags})
    return paths


@dataclasses.dataclass(frozen=True)
class Product:
    """`a @ b` of an (m, k) and a (k, n) operand, either stored transposed."""

    group: str
    name: str
    m: int
    k: int
    n: int
    a_transposed: bool = False
    b_transposed: bool = False

    @property
    def flops(self) -> int:
        return 2 * self.m * self.k * self.n

    @property
    def a_shape(self) -> tuple[int, int]:
        return (self.k, self.m) if self.a_transposed else (self.m, self.k)

    @property
    def b_shape(self) -> tuple[int, int]:
        return (self.n, self.k) if self.b_transposed else (self.k, self.n)


def products(shape_groups: list[str]) -> list[Product]:
    """The model's products: `decode` (32 and 128 rows) and `train` (4,096 rows, forward and backward).

    Example:
    >>> [p.name for p in products(["decode"])][:3]
    ['ffn in', 'ffn out', 'logits']
    >>> len(products(["train"]))
    9
    """
    chosen = []
    if "decode" in shape_groups:
        for rows in DECODE_ROWS:
            group = f"decode {rows}"
            chosen += [
                Product(group, "ffn in", rows, D_MODEL, FFN),
                Product(group, "ffn out", rows, FFN, D_MODEL),
                Product(group, "logits", rows, D_MODEL, VOCABULARY, b_transposed=True),  # h @ E^T
            ]
    if "train" in shape_groups:
        rows, group = TRAIN_ROWS, "train"
        chosen += [
            Product(group, "ffn in", rows, D_MODEL, FFN),
            Product(group, "ffn in dx", rows, FFN, D_MODEL, b_transposed=True),  # dy @ W^T
            Product(group, "ffn in dW", D_MODEL, rows, FFN, a_transposed=True),  # x^T @ dy
            Product(group, "ffn out", rows, FFN, D_MODEL),
            Product(group, "ffn out dx", rows, D_MODEL, FFN, b_transposed=True),
            Product(group, "ffn out dW", FFN, rows, D_MODEL, a_transposed=True),
            Product(group, "logits", rows, D_MODEL, VOCABULARY, b_transposed=True),
            Product(group, "logits dh", rows, VOCABULARY, D_MODEL),  # dlogits @ E
            Product(group, "logits dE", VOCABULARY, rows, D_MODEL, a_transposed=True),  # dlogits^T @ h
        ]
    return chosen


# --- One path, in its own process ----------------------------------------


def operands(product: Product, dtype: str):
    """Random numpy operands: float32 for the float dtypes (cast by the framework), int8 for int8."""
    import numpy as np

    rng = np.random.default_rng([product.m, product.k, product.n])
    if dtype.startswith("int8"):
        return tuple(rng.integers(-127, 128, size=s, dtype="int8") for s in (product.a_shape, product.b_shape))
    return tuple(rng.standard_normal(s, dtype="float32") for s in (product.a_shape, product.b_shape))


def torch_call(product: Product, dtype: str):
    import torch

    if dtype == "int8-dynamic":
        return torch_dynamic_int8_call(product)
    a, b = (torch.from_numpy(x) for x in operands(product, dtype))
    if dtype.startswith("bfloat16"):
        a, b = a.to(torch.bfloat16), b.to(torch.bfloat16)
    a = a.T if product.a_transposed else a
    b = b.T if product.b_transposed else b
    if dtype == "int8->int32":
        return lambda: torch._int_mm(a, b)
    if dtype == "bfloat16->float32":
        return lambda: torch.mm(a, b, out_dtype=torch.float32)
    return lambda: torch.mm(a, b)


def torch_dynamic_int8_call(product: Product):
    """`a @ b` of float32 `a` through `b` quantized to int8 per output column, packed once."""
    import torch

    a, b = (torch.from_numpy(x) for x in operands(product, "float32"))
    a = a.T if product.a_transposed else a
    b = b.T if product.b_transposed else b
    columns = b.T.contiguous()  # (n, k): one row per output
    scale = columns.abs().amax(dim=1).double() / 127
    quantized = torch.quantize_per_channel(columns, scale, torch.zeros_like(scale, dtype=torch.long), 0, torch.qint8)
    packed = torch.ops.quantized.linear_prepack(quantized, None)
    return lambda: torch.ops.quantized.linear_dynamic(a, packed, True)


def tensorflow_call(product: Product, dtype: str, mode: str):
    import tensorflow as tf

    if dtype == "int8-dynamic":
        raise NotImplementedError("torch's kernel")

    if dtype == "bfloat16->float32":
        raise NotImplementedError("tf.linalg.matmul's output_type is for int8 inputs only")
    a, b = (tf.constant(x) for x in operands(product, dtype))
    if dtype == "bfloat16":
        a, b = tf.cast(a, tf.bfloat16), tf.cast(b, tf.bfloat16)
    output_type = tf.int32 if dtype == "int8->int32" else None

    def multiply(a, b):
        return tf.linalg.matmul(
            a, b, transpose_a=product.a_transposed, transpose_b=product.b_transposed, output_type=output_type
        )

    if mode != "eager":
        multiply = tf.function(multiply, jit_compile=mode == "xla", autograph=False)
    return lambda: multiply(a, b), multiply, (a, b)


def jax_call(product: Product, dtype: str):
    import jax
    import jax.numpy as jnp

    if dtype == "int8-dynamic":
        raise NotImplementedError("torch's kernel")

    a, b = (jnp.asarray(x) for x in operands(product, dtype))
    if dtype.startswith("bfloat16"):
        a, b = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
    preferred = {"bfloat16->float32": jnp.float32, "int8->int32": jnp.int32}.get(dtype)
    dimensions = (((0 if product.a_transposed else 1,), (1 if product.b_transposed else 0,)), ((), ()))
    multiply = jax.jit(lambda a, b: jax.lax.dot_general(a, b, dimensions, preferred_element_type=preferred))
    return lambda: multiply(a, b).block_until_ready(), multiply, (a, b)


def optimised_program(path: Path, multiply, arguments) -> str:
    if path.framework == "jax":
        return multiply.lower(*arguments).compile().as_text()
    return multiply.experimental_get_compiler_ir(*arguments)(stage="optimized_hlo")


def program_summary(program: str) -> str:
    """What XLA's optimised program does with the dot: library calls and the dots' element types.

    Example:
    >>> program_summary(
    ...     '%a = bf16[32,512]{1,0} parameter(0)\\n%b = bf16[512,2048]{1,0} parameter(1)\\n'
    ...     '%d = f32[32,2048]{1,0} dot(%a, %b), lhs_contracting_dims={1}\\n'
    ...     '%f = f32[32,2048]{1,0} fusion(%a, %b), kind=kCustom, '
    ...     'backend_config={"fusion_config":{"kind":"__ynn_fusion"}}'
    ... )
    'dot bf16,bf16->f32; ynn fusion'
    """
    types = dict(re.findall(r"%(\S+) = (\w+)\[", program))  # names are unique within a module
    operand = r"(?:\w+\[[^\]]*\]\S* )?%([^,\s)]+)"
    found = [
        f"dot {types.get(left, '?')},{types.get(right, '?')}->{result}"
        for result, left, right in re.findall(rf"= (\w+)\[[^\]]*\]\S* dot\({operand}, {operand}\)", program)
    ]
    found += [target.strip("_").replace("$", " ") for target in re.findall(r'custom_call_target="([^"]+)"', program)]
    found += [kind.strip("_").replace("_", " ") for kind in re.findall(r'"kind":"(__\w+)"', program)]
    return "; ".join(dict.fromkeys(found)) or "?"


def make_call(path: Path, product: Product, dtype: str):
    """(call, the compiled function or None, its arguments)."""
    if path.framework == "torch":
        return torch_call(product, dtype), None, ()
    if path.framework == "tensorflow":
        return tensorflow_call(product, dtype, path.mode)
    return jax_call(product, dtype)


def set_threads(framework: str, threads: int) -> None:
    if framework == "torch":
        import torch

        torch.set_num_threads(threads)
        torch.set_num_interop_threads(1)
    elif framework == "tensorflow":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)


def seconds_per_call(call, seconds: float) -> float:
    """Median of single calls, as many as fit in about `seconds` (at least 3), after two warm-up calls."""
    call()
    start = time.perf_counter()
    call()
    estimate = time.perf_counter() - start
    times = []
    for _ in range(max(3, min(200, int(seconds / max(estimate, 1e-6))))):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def emit(line: str) -> None:
    """One line on file descriptor 1, after whatever the C libraries (oneDNN's verbose lines) buffered."""
    _LIBC.fflush(None)
    sys.stdout.flush()
    os.write(1, (line + "\n").encode())


_LIBC = ctypes.CDLL(None)


def run_path(name: str, shape_groups: list[str], dtypes: list[str], threads: int, seconds: float, kernels: bool):
    path = all_paths()[name]
    set_threads(path.framework, threads)
    for product in products(shape_groups):
        for dtype in dtypes:
            record = {"path": name, "group": product.group, "product": product.name, "dtype": dtype}
            try:
                call, multiply, arguments = make_call(path, product, dtype)
                if kernels:
                    call()  # compiles: its own oneDNN lines (reorders of constants) are not the product's
                    emit(f"BEGIN {json.dumps(record)}")
                    call()
                    emit("END")
                    if path.mode == "xla":
                        record["program"] = program_summary(optimised_program(path, multiply, arguments))
                else:
                    record["seconds"] = seconds_per_call(call, seconds)
                    record["gflops"] = product.flops / record["seconds"] / 1e9
            except Exception as error:  # noqa: BLE001 - one unsupported dtype must not lose the others
                record["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}"
            emit("RESULT " + json.dumps(record))


# --- The parent: one process per path, then the tables ------------------


def onednn_implementations(lines: list[str]) -> list[str]:
    """`primitive:implementation` of each oneDNN execution among `lines` (`ONEDNN_VERBOSE=1`).

    Example:
    >>> onednn_implementations(["onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx512_core_amx,undef,src"])
    ['matmul:brg_matmul:avx512_core_amx']
    >>> onednn_implementations(["onednn_verbose,v1,primitive,exec,cpu,gemm_api,,undef,src_s8::a wei_s8::a dst_s32::a"])
    ['gemm_api:s8,s8->s32']
    """
    found = []
    for line in lines:
        fields = line.split(",")
        if fields[0] == "onednn_verbose" and "exec" in fields:
            at = fields.index("exec")
            if len(fields) > at + 5:
                # gemm_api (oneDNN's BLAS-like calls) names no implementation: its operand types instead
                types = re.findall(r"(?:src|wei|dst)[_:]([a-z0-9]+)", fields[at + 5])
                detail = fields[at + 3] or ",".join(types[:-1]) + "->" + "".join(types[-1:])
                found.append(f"{fields[at + 2]}:{detail}")
    return list(dict.fromkeys(found))


def measure_path(name: str, args: argparse.Namespace) -> list[dict]:
    path = all_paths()[name]
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **path.environment)
    if "XLA_FLAGS" in path.environment:
        environment["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {path.environment['XLA_FLAGS']}".strip()
    if args.kernels:
        environment["ONEDNN_VERBOSE"] = "1"
    command = [sys.executable, "-m", "benchmarks.matmul_paths", "--child", name, "--threads", str(args.threads)]
    command += ["--seconds", str(args.seconds), "--shapes", *args.shapes, "--dtypes", *args.dtypes]
    command += ["--kernels"] if args.kernels else []
    try:
        process = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return [{"path": name, "error": f"timed out after {args.timeout} s"}]
    records, verbose = [], []
    for line in process.stdout.splitlines():
        if line.startswith("BEGIN "):
            verbose = []
        elif line == "END":
            pass
        elif line.startswith("RESULT "):
            record = json.loads(line[len("RESULT ") :])
            if args.kernels and "error" not in record:
                record["onednn"] = onednn_implementations(verbose)
            records.append(record)
        else:
            verbose.append(line)
    if process.returncode != 0 or not records:
        tail = " | ".join(process.stderr.strip().splitlines()[-3:])[-300:]
        records.append({"path": name, "error": f"exit code {process.returncode}: {tail}"})
    return records


def speed_tables(records: list[dict], dtypes: list[str]) -> list[str]:
    """Per group: GFLOP/s by path (rows) and dtype (columns), and each product by path and dtype."""
    lines = []
    totals = collections.defaultdict(lambda: [0.0, 0.0])
    errors = {}
    by_product = collections.defaultdict(dict)
    flops = {(p.group, p.name): p.flops for p in products(["decode", "train"])}
    for record in records:
        if "group" not in record:
            continue
        key = (record["group"], record["path"], record["dtype"])
        if "error" in record:
            errors.setdefault(key, record["error"])
            continue
        totals[key][0] += flops[record["group"], record["product"]]
        totals[key][1] += record["seconds"]
        by_product[record["group"], record["path"], record["dtype"]][record["product"]] = record["gflops"]
    paths = list(dict.fromkeys(r["path"] for r in records))
    for group in dict.fromkeys(r["group"] for r in records if "group" in r):
        lines += [f"\n{group} rows: GFLOP/s (all its products)\n", "| path | " + " | ".join(dtypes) + " |"]
        lines.append("| --- " * (len(dtypes) + 1) + "|")
        for path in paths:
            cells = []
            for dtype in dtypes:
                total = totals.get((group, path, dtype))
                cells.append(f"{total[0] / total[1] / 1e9:.0f}" if total else "n/a")
            lines.append(f"| {path} | " + " | ".join(cells) + " |")
        names = [name for g, name in flops if g == group]
        lines += [f"\n{group} rows, per product: GFLOP/s\n", "| path | dtype | " + " | ".join(names) + " |"]
        lines.append("| --- " * (len(names) + 2) + "|")
        for path in paths:
            for dtype in dtypes:
                values = by_product.get((group, path, dtype), {})
                if values:
                    cells = [f"{values[n]:.0f}" if n in values else "n/a" for n in names]
                    lines.append(f"| {path} | {dtype} | " + " | ".join(cells) + " |")
    failures = collections.defaultdict(set)
    for (_, path, dtype), error in errors.items():
        failures[path, error].add(dtype)
    failures.update({(r["path"], r["error"]): {"all"} for r in records if "group" not in r})
    if failures:
        lines.append("\nnot measured:")
        lines += [f"- {path} ({', '.join(sorted(d))}): {error}" for (path, error), d in failures.items()]
    return lines


def kernel_table(records: list[dict]) -> list[str]:
    """Per path and dtype: the oneDNN implementations that ran and XLA's program, over all products."""
    found = collections.defaultdict(dict)
    for record in records:
        key = (record["path"], record.get("dtype", "all"))
        found[key]  # a path that called no library still gets its row
        if "error" in record:
            found[key].setdefault(f"error: {record['error']}", None)
            continue
        for name in record.get("onednn", []):
            found[key].setdefault(name, None)
        if "program" in record:
            found[key].setdefault(f"XLA: {record['program']}", None)
    lines = ["| path | dtype | oneDNN implementations / XLA program |", "| --- | --- | --- |"]
    for (path, dtype), names in found.items():
        lines.append(f"| {path} | {dtype} | {'; '.join(names) or 'no oneDNN call'} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--paths", nargs="+", default=list(all_paths()), choices=list(all_paths()))
    parser.add_argument("--shapes", nargs="+", default=["decode", "train"], choices=("decode", "train"))
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=0.5, help="timed calls per product: about this long")
    parser.add_argument("--kernels", action="store_true", help="name the kernels each path runs; time nothing")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per path")
    parser.add_argument("--output", help="also write every record to this JSON file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        run_path(args.child, args.shapes, args.dtypes, args.threads, args.seconds, args.kernels)
        return
    records = []
    for name in args.paths:
        print(f"{name} ...", file=sys.stderr, flush=True)
        records += measure_path(name, args)
    print(f"{os.cpu_count()} CPUs, {args.threads} threads; load average {os.getloadavg()[0]:.2f} at the end")
    print("\n".join(kernel_table(records) if args.kernels else speed_tables(records, args.dtypes)))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
