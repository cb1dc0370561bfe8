"""The cuBLAS matrix-product rules (backends/cuda/cublas.py, cublas_rules.py) on the GPU,
against float64 NumPy, in every precision (SEMANTICS.md tolerances: fp32
1e-4 on exact summation, TF32 5e-3, bf16/fp16 1e-2)."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

import opgraph as og
from opgraph.backends.cuda import cublas as cm
from opgraph.backends.device import cuda_status

GPU_OK, GPU_WHY = cuda_status()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU_OK, reason=GPU_WHY)]

TOL = {"fp32": 1e-5, "tf32": 5e-3, "bf16": 1e-2, "fp16": 1e-2}


@pytest.mark.parametrize("precision", list(TOL))
@pytest.mark.parametrize("transpose_a,transpose_b", [(False, False), (True, False), (False, True),
                                                     (True, True)])
def test_gemm_ex_matches_float64(cp, rng, relerr, precision, transpose_a, transpose_b):
    m, k, p = 96, 257, 33
    a = rng.standard_normal((k, m) if transpose_a else (m, k)).astype(np.float32)
    b = rng.standard_normal((p, k) if transpose_b else (k, p)).astype(np.float32)
    got = cm.gemm_ex(cp, cp.asarray(a), cp.asarray(b), transpose_a=transpose_a,
                     transpose_b=transpose_b, precision=precision)
    want = (a.T if transpose_a else a).astype(np.float64) @ (b.T if transpose_b else b)
    assert got.dtype == cp.float32 and got.shape == (m, p)
    assert relerr(cp.asnumpy(got), want) < TOL[precision]


def test_fp32_does_not_round_to_tf32(cp):
    # 1 + 2^-12 is exact in fp32 and rounds to 1 in TF32 (10 mantissa bits); whether
    # cuBLAS uses tensor cores for the tf32 compute type is its choice, so only the
    # fp32 side is a guarantee
    a = cp.full((256, 256), 1 + 2 ** -12, dtype=cp.float32)
    b = cp.ones((256, 256), dtype=cp.float32)
    exact = 256 * (1 + 2 ** -12)
    assert float(cm.gemm_ex(cp, a, b, precision="fp32")[0, 0]) == pytest.approx(exact, abs=1e-5)


@pytest.mark.parametrize("precision,value,rounded", [("bf16", 1 + 2 ** -9, 1.0),
                                                     ("fp16", 1 + 2 ** -12, 1.0)])
def test_half_precisions_round_their_operands(cp, precision, value, rounded):
    # below half an ulp of 1 in bf16 (7 mantissa bits) / fp16 (10): the operand
    # conversion is ours (bf16, round to nearest even) or CuPy's astype (fp16),
    # so this fails if the precision is ignored and the product runs in fp32
    a = cp.full((8, 128), value, dtype=cp.float32)
    b = cp.ones((128, 8), dtype=cp.float32)
    got = float(cm.gemm_ex(cp, a, b, precision=precision)[0, 0])
    assert got == pytest.approx(128 * rounded, abs=1e-6)
    assert float(cm.gemm_ex(cp, a, b)[0, 0]) == pytest.approx(128 * value, abs=1e-4)


def test_linear_with_and_without_bias_and_an_empty_product(cp, rng, relerr):
    x = rng.standard_normal((8, 20)).astype(np.float32)
    w = rng.standard_normal((5, 20)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    y = cm.linear(cp, cp.asarray(x), cp.asarray(w), cp.asarray(b), precision="tf32")
    assert relerr(cp.asnumpy(y), x.astype(np.float64) @ w.T + b) < 5e-3
    y16 = cm.linear(cp, cp.asarray(x).astype(cp.float16), cp.asarray(w).astype(cp.float16),
                    precision="fp32")
    assert y16.dtype == cp.float16 and relerr(cp.asnumpy(y16), x.astype(np.float64) @ w.T) < 1e-2
    empty = cm.matmul(cp, cp.ones((3, 0), cp.float32), cp.ones((0, 4), cp.float32),
                      transpose_a=False, transpose_b=False, precision="fp32")
    assert empty.shape == (3, 4) and not cp.asnumpy(empty).any()


#: The algorithm name of the oracle's Linear kernel registered a second time for
#: the test below (``classifier_candidates``).
ORACLE_STANDIN = "oracle-standin"


def classifier_candidates(device: str, precision: str, monkeypatch):
    """The autotuner's report rows for one linear layer (64 x 512 -> 1000).

    On cuda ``cublas`` is Linear's only candidate: the oracle (``reference``)
    no longer competes there where another rule applies (``passes/autotune.py``
    ``_contenders``), and a node with a single candidate is not tuned, so it
    would have no rows. The oracle's kernel is registered again under another
    name for this compile, a second candidate that autotune checks and times
    beside cuBLAS, as the reference was before."""
    from opgraph.backends import registry

    rules = registry.rules_for(og.ops.Linear)
    monkeypatch.setitem(registry._RULES, og.ops.Linear,
                        {**rules, ORACLE_STANDIN: attrs.evolve(rules["reference"], algorithm=ORACLE_STANDIN)})
    g = og.Graph("classifier")
    y = og.linear(g.input("x", (64, 512)), g.param("w", (1000, 512)), name="fc")
    exe = og.compile([y], device=device, policy={"autotune": True, "precision": precision,
                                                 "cache": "off"})
    assert exe.report.node("fc").how == "autotune", exe.report.node("fc")
    return {c.algorithm: c for c in exe.report.node("fc").candidates}


def test_autotune_checks_and_times_cublas_for_a_linear_layer_in_tf32(cp, monkeypatch):
    rows = classifier_candidates("cuda", "tf32", monkeypatch)
    assert set(rows) == {"cublas", ORACLE_STANDIN}, rows
    for algo, row in rows.items():
        assert row.status in ("ok", "chosen") and row.time_ms is not None, (algo, row)
    assert rows["cublas"].options == {"precision": "tf32"}, rows["cublas"]
    assert rows["cublas"].tolerance == 5e-3 and rows["cublas"].rel_error <= 5e-3, rows["cublas"]


def test_a_product_on_our_own_handle_is_captured_and_replayed(cp, rng, relerr):
    # CuPy's bindings refuse cuBLAS during capture; ours (nvmath-python) must not
    pytest.importorskip("nvmath.bindings.cublas")
    from opgraph.graph_replay import capture_stream
    a = cp.asarray(rng.standard_normal((64, 96)).astype(np.float32))
    b = cp.asarray(rng.standard_normal((96, 48)).astype(np.float32))
    out = cp.zeros((64, 48), dtype=cp.float32)
    cm.gemm_ex_into(cp, a, b, out, "fp32")  # eager first: makes the handle outside the capture
    out.fill(0)
    stream = capture_stream()
    with stream:
        stream.begin_capture()
        cm.gemm_ex_into(cp, a, b, out, "fp32")
        graph = stream.end_capture()
        assert float(abs(out).max()) == 0.0  # captured, not run
        graph.launch(stream)
        stream.synchronize()
    assert relerr(cp.asnumpy(out), cp.asnumpy(a).astype(np.float64) @ cp.asnumpy(b)) < 1e-5


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_linear_on_bfloat16_storage(cp, rng, relerr, precision):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf = np.dtype(ml_dtypes.bfloat16)
    x = rng.standard_normal((16, 40)).astype(bf)
    w = rng.standard_normal((7, 40)).astype(bf)
    b = rng.standard_normal(7).astype(bf)
    got = cm.linear(cp, cp.asarray(x), cp.asarray(w), cp.asarray(b), precision=precision)
    assert got.dtype == bf and got.shape == (16, 7)
    want = x.astype(np.float64) @ w.astype(np.float64).T + b.astype(np.float64)
    assert relerr(cp.asnumpy(got).astype(np.float64), want) < 1e-2


@pytest.mark.parametrize("transpose_a,transpose_b", [(True, False), (False, True)])
def test_matmul_writes_bfloat16_storage_directly(cp, rng, relerr, transpose_a, transpose_b):
    # bf16 storage in bf16: cuBLAS rounds the fp32 accumulator once into the bf16 output
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf = np.dtype(ml_dtypes.bfloat16)
    a = rng.standard_normal((300, 64) if transpose_a else (64, 300)).astype(bf)
    b = rng.standard_normal((48, 300) if transpose_b else (300, 48)).astype(bf)
    got = cm.matmul(cp, cp.asarray(a), cp.asarray(b), transpose_a=transpose_a, transpose_b=transpose_b,
                    precision="bf16")
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = (a64.T if transpose_a else a64) @ (b64.T if transpose_b else b64)
    assert got.dtype == bf and got.shape == (64, 48)
    host = cp.asnumpy(got).astype(np.float64)
    assert np.all(np.abs(host - want) <= np.abs(want) * 2.0 ** -8 + 1e-3), relerr(host, want)
    empty = cm.linear(cp, cp.zeros((5, 0), dtype=bf), cp.zeros((3, 0), dtype=bf), cp.ones(3, dtype=bf),
                      precision="bf16")
    assert empty.dtype == bf and float(abs(empty.astype(cp.float32) - 1).max()) == 0.0
