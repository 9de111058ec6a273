"""`benchmarks.matmul_paths` measures the model's products on each path and says what each path ran."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not an installed package

from benchmarks import matmul_paths  # noqa: E402


def test_the_backward_products_have_the_shapes_of_the_forward_operands():
    train = {p.name: p for p in matmul_paths.products(["train"])}
    for layer in ("ffn in", "ffn out"):
        forward, dx, dw = train[layer], train[f"{layer} dx"], train[f"{layer} dW"]
        assert (dx.m, dx.n) == (forward.m, forward.k)  # dx: the shape of x
        assert (dw.m, dw.n) == (forward.k, forward.n)  # dW: the shape of W
        assert forward.flops == dx.flops == dw.flops
    assert train["logits"].b_shape == (matmul_paths.VOCABULARY, matmul_paths.D_MODEL)  # h @ E^T reads E as stored
    assert train["logits dE"].a_shape == (matmul_paths.TRAIN_ROWS, matmul_paths.VOCABULARY)  # dlogits^T @ h
    assert {p.m for p in matmul_paths.products(["decode"])} == set(matmul_paths.DECODE_ROWS)


def test_every_xla_variant_is_a_path_of_tensorflow_and_of_jax():
    paths = matmul_paths.all_paths()
    for suffix, flags in matmul_paths.XLA_VARIANTS.items():
        assert paths["jax" + suffix].environment == {"XLA_FLAGS": flags}
        assert paths["tf-xla" + suffix].mode == "xla"


def test_onednn_lines_name_the_implementation_or_the_operand_types():
    lines = [
        "onednn_verbose,v1,primitive,info,template:operation,engine,primitive,implementation",
        "onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx10_1_512_amx,undef,src:bf16::blocked:ab::f0,,,",
        "onednn_verbose,v1,primitive,exec,cpu,gemm_api,,undef,src_f32::blocked:ab:f0 wei_f32::blocked:ab:f0 "
        "dst_f32::blocked:ab:f0,,,32x512:512x2048,0.5",
        "a line of the program itself",
    ]
    assert matmul_paths.onednn_implementations(lines) == [
        "matmul:brg_matmul:avx10_1_512_amx",
        "gemm_api:f32,f32->f32",
    ]


def test_a_jax_program_says_what_its_dot_computes_in():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    a, b = jnp.ones((16, 32), jnp.bfloat16), jnp.ones((32, 24), jnp.bfloat16)
    for preferred, expected in ((jnp.float32, "dot bf16,bf16->f32"), (None, "dot f32,f32->f32")):
        program = (
            jax.jit(lambda a, b, p=preferred: jax.lax.dot(a, b, preferred_element_type=p))
            .lower(a, b)
            .compile()
            .as_text()
        )
        assert expected in matmul_paths.program_summary(program)


@pytest.mark.slow
def test_a_path_is_timed_and_a_path_xla_refuses_is_reported(monkeypatch, capsys):
    pytest.importorskip("jax")
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    arguments = ["--paths", "jax", "--shapes", "decode", "--dtypes", "float32", "--seconds", "0.01", "--threads", "1"]
    matmul_paths.main(arguments)
    table = capsys.readouterr().out
    row = next(line for line in table.splitlines() if line.startswith("| jax |"))
    assert float(row.split("|")[2]) > 0
    monkeypatch.setenv("XLA_FLAGS", "--xla_no_such_flag_anywhere=true")  # XLA aborts on a flag it does not know
    matmul_paths.main(arguments)
    assert "- jax (all): exit code" in capsys.readouterr().out
