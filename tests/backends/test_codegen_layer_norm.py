"""Layer normalisation's generated kernels (``backends/cuda/codegen/layer_norm.py``)
and the sums over leading axes (``SumTo`` to a trailing shape: the ``col``
target), on the CPU through the g++ emulator, against the float64 reference:
fp32, bf16 and fp16 storage (and fp64), normalized shapes of one and two axes,
row counts that are no multiple of a block, one row, K = 1, with and without
weight and bias, inputs stored channels-last (as ConvNeXt's permuted values
are under the NHWC layout), and the sums in CT for half storage."""

from __future__ import annotations

import numpy as np
import pytest

from codegen_cases import TOLERANCE, reference, rel_err
from codegen_emulated import emu, launched, needs_gxx, seeded, steps_per_thread  # noqa: F401  (emu: fixture)
from layer_norm_cases import (DTYPES, LAYER_NORM_CASES, SHAPES, SUM_SHAPES, case_ids, inputs, layout_of,
                              shape_ids)
from opgraph import ops
from opgraph.backends.cuda.codegen.expressions import reduction_target, trailing_axes
from opgraph.backends.cuda.codegen.ir import PlanError
from opgraph.backends.registry import KernelContext, rules_for
from opgraph.types import TensorType, numpy_dtype, storage_order

pytestmark = needs_gxx


#: the ops whose reductions are row sums of one depth and whose output is full-size
#: (``plan.ROW_SWEEP``); the scale gradient's column sums need the row sums first
ONE_KERNEL = (ops.LayerNorm, ops.LayerNormBackwardData, ops.LayerNormDoubleBackward)


def _run(op, arrays, dtype):
    """``op``'s ``codegen`` kernel on ``arrays``: ``(out, its relative error)``
    against the float64 reference, after the rule's check accepted the node."""
    types = tuple(TensorType(a.shape, a.dtype.name, storage_order(a)) for a in arrays)
    rule = rules_for(type(op))["codegen"]
    assert rule.check(op, types, "cuda") is None
    out = rule.kernel(KernelContext(np, "cuda", {}, op.infer(*types)), op, *arrays)
    assert out.dtype.name == dtype and out.shape == op.infer(*types).shape
    return out, rel_err(out, reference(op, arrays))


def _inputs(kinds, shape, k, dtype, layout=None):
    return inputs(seeded(kinds, shape, k, dtype, layout), kinds, shape, k, dtype, layout)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,k", SHAPES, ids=shape_ids(SHAPES))
@pytest.mark.parametrize("op_type,kinds", LAYER_NORM_CASES, ids=case_ids(LAYER_NORM_CASES))
def test_layer_norm_ops_against_the_reference(emu, op_type, kinds, shape, k, dtype):
    op = op_type(normalized_shape=shape[len(shape) - k:], eps=1e-5)
    out, err = _run(op, _inputs(kinds, shape, k, dtype, layout_of(shape, k)), dtype)
    assert err < TOLERANCE[dtype], (op, shape, dtype, err)
    assert launched(emu)  # generated kernels ran
    if op_type in ONE_KERNEL:  # short rows, one block each: the reduction and the sweep in one kernel
        assert launched(emu) == ["rowsweep"]
    half = dtype != "float32"
    assert all(("typedef float CT;" in x["source"]) for x in emu.raw_launches) or not half


@pytest.mark.parametrize("shape,k", [((64, 42), 1), ((8, 9, 22), 1), ((4, 16, 7, 6), 2)], ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rows_loaded_per_iteration_read_their_own_rows_statistics(emu, monkeypatch, shape, k, dtype):
    """The scale gradient's sums over leading axes read each row's mean and
    rstd at that row: with several rows loaded per iteration
    (``plan.ROW_LOAD_BYTES``; rows of 42 and 22 elements are read one element a
    lane, so four rows an iteration) each row still reads its own (a draft read
    the first row's statistics for all four: bf16 error 0.15), the same bits as
    one row at a time."""
    from opgraph.backends.cuda.codegen import launch, plan
    monkeypatch.setattr(plan, "TARGET_BLOCKS", 1)
    monkeypatch.setattr(plan, "MIN_PER_THREAD", 16)  # long runs: four rows at a time, then the last ones
    op = ops.LayerNormBackwardScale(normalized_shape=shape[len(shape) - k:], eps=1e-5)
    arrays = _inputs("xg", shape, k, dtype, layout_of(shape, k))
    outs = []
    for row_bytes in (0, plan.ROW_LOAD_BYTES):
        monkeypatch.setattr(plan, "ROW_LOAD_BYTES", row_bytes)
        launch._PLANS.clear()
        out, err = _run(op, arrays, dtype)
        assert err < TOLERANCE[dtype], (row_bytes, err)
        outs.append(out)
    assert any("ar += 4 * RB" in x["source"] for x in emu.raw_launches)
    assert steps_per_thread() > plan.MAX_ROWS_PER_ITERATION
    assert outs[0].tobytes() == outs[1].tobytes()


@pytest.mark.parametrize("op_type,kinds", LAYER_NORM_CASES[2:6], ids=lambda v: getattr(v, "__name__", v))
def test_float64_storage_computes_in_double(emu, op_type, kinds):
    shape, k = (4, 3, 16), 1
    op = op_type(normalized_shape=(16,), eps=1e-5)
    _, err = _run(op, _inputs(kinds, shape, k, "float64"), "float64")
    assert err < TOLERANCE["float64"]
    assert all("typedef double CT;" in x["source"] for x in emu.raw_launches)
    assert (launched(emu) == ["rowsweep"]) == (op_type in ONE_KERNEL)


def test_the_data_gradient_is_one_kernel_or_a_reduction_and_a_sweep(emu, monkeypatch):
    """The statistics, <g> and <g xhat> in one pass (module docstring of ``layer_norm``): one kernel
    (``plan.ROW_SWEEP``), or without it a reduction and a sweep."""
    from opgraph.backends.cuda.codegen import launch, plan
    op = ops.LayerNormBackwardData(normalized_shape=(24,))
    arrays = _inputs("gxw", (3, 7, 24), 1, "float32")
    _run(op, arrays, "float32")
    assert launched(emu) == ["rowsweep"]
    monkeypatch.setattr(plan, "ROW_SWEEP", False)
    launch._PLANS.clear()
    _run(op, arrays, "float32")
    assert launched(emu) == ["rowsweep", "reduce", "sweep"]


def _plan_and_run(emu, monkeypatch, op, arrays, dtype, row_sweep: bool):
    """``op`` on ``arrays`` with ``plan.ROW_SWEEP`` set: ``(out, err, kinds launched, launches planned)``."""
    from opgraph.backends.cuda.codegen import launch, plan
    monkeypatch.setattr(plan, "ROW_SWEEP", row_sweep)
    launch._PLANS.clear()
    before = len(emu.raw_launches)
    out, err = _run(op, arrays, dtype)
    [(p, *_)] = launch._PLANS.values()
    return out, err, launched(emu)[before:], p.launches


def _sizes(launch_) -> dict:
    """A planned launch's scalar parameters by name."""
    return {name: int(value) for name, (kind, _, value) in launch_.params.items.items() if kind == "scalar"}


#: (op type, kinds, x's shape): rows of a multiple of V and not (K = 5: one lane a vector),
#: row counts that are no multiple of a block's EB rows (inactive rows), one-element rows
ROW_SWEEP_CASES = [(t, kinds, shape) for t, kinds in ((ops.LayerNorm, "xwb"), (ops.LayerNormBackwardData, "gxw"),
                                                      (ops.LayerNormDoubleBackward, "ggxw"))
                   for shape in ((37, 5), (3, 7, 24), (6, 1), (9, 96))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op_type,kinds,shape", ROW_SWEEP_CASES,
                         ids=[f"{t.__name__}-{k}-{'x'.join(map(str, s))}" for t, k, s in ROW_SWEEP_CASES])
def test_one_kernel_and_two_compute_the_same_rows(emu, monkeypatch, op_type, kinds, shape, dtype):
    """The rows reduced and swept in one kernel (``kernels.row_sweep``) and by a reduction and a
    sweep: both within the tolerance, and here the same bits (the same sums in the same order,
    the same formulas; g++ without FMA contraction: on a GPU they need not be)."""
    op = op_type(normalized_shape=shape[-1:], eps=1e-5)
    arrays = _inputs(kinds, shape, 1, dtype)
    one, err_one, kinds_one, _ = _plan_and_run(emu, monkeypatch, op, arrays, dtype, True)
    two, err_two, kinds_two, _ = _plan_and_run(emu, monkeypatch, op, arrays, dtype, False)
    assert kinds_one == ["rowsweep"] and kinds_two == ["reduce", "sweep"]
    assert err_one < TOLERANCE[dtype] and err_two < TOLERANCE[dtype], (err_one, err_two)
    assert one.tobytes() == two.tobytes()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rows,vectors,te", [(300, 1, 1), (37, 12, 4), (11, 96, 32), (3, 1024, 256)],
                         ids=lambda v: str(v))
def test_one_kernel_for_every_row_length_up_to_its_cut_off(emu, monkeypatch, rows, vectors, te, dtype):
    """Rows of ``vectors`` 16-byte vectors: TE = 1 (300 rows of one vector: 256 rows a block,
    212 threads of the second block inactive) up to 256 threads a row (1024 vectors: 4 a
    thread, the cut-off ``plan.ROW_SWEEP_VECTORS``), the forward and the data gradient, against
    the reference; the forward (x alone, 16 bytes a step) loads two vectors an iteration in its
    sum and in its sweep."""
    from opgraph.backends.cuda.codegen import plan
    k = vectors * 16 // numpy_dtype(dtype).itemsize
    for op, kinds in ((ops.LayerNorm(normalized_shape=(k,)), "xwb"),
                      (ops.LayerNormBackwardData(normalized_shape=(k,)), "gxw")):
        _, err, kinds_run, launches = _plan_and_run(emu, monkeypatch, op, _inputs(kinds, (rows, k), 1, dtype),
                                                    dtype, True)
        assert kinds_run == ["rowsweep"] and err < TOLERANCE[dtype], (op, err)
        sizes = _sizes(launches[0])
        assert sizes["TE"] == te and -(-sizes["PER"] // te) <= plan.ROW_SWEEP_VECTORS
        assert launches[0].source.count("jr += 2 * TE") == (2 if kinds == "xwb" else 0)


def test_longer_or_split_rows_keep_two_kernels(emu, monkeypatch):
    """Past ``plan.ROW_SWEEP_VECTORS`` vectors a thread, or a row split over blocks (one row of
    40,000), the reduction and the sweep stay separate launches, still within the tolerance."""
    from opgraph.backends.cuda.codegen import plan
    op = ops.LayerNorm(normalized_shape=(96,))
    arrays = _inputs("xwb", (37, 96), 1, "bfloat16")
    cut_off = plan.ROW_SWEEP_VECTORS
    monkeypatch.setattr(plan, "ROW_SWEEP_VECTORS", 2)  # 12 vectors a row, TE = 4: 3 vectors a thread
    _, err, kinds_run, _ = _plan_and_run(emu, monkeypatch, op, arrays, "bfloat16", True)
    assert kinds_run == ["reduce", "sweep"] and err < TOLERANCE["bfloat16"]
    monkeypatch.setattr(plan, "ROW_SWEEP_VECTORS", cut_off)
    op = ops.LayerNorm(normalized_shape=(40000,))
    _, err, kinds_run, launches = _plan_and_run(emu, monkeypatch, op, _inputs("x", (1, 40000), 1, "bfloat16"),
                                                "bfloat16", True)
    assert kinds_run == ["reduce", "finalize", "sweep"] and _sizes(launches[0])["S"] > 1
    assert err < TOLERANCE["bfloat16"]


def test_one_kernel_with_64_bit_indices(emu, monkeypatch):
    """The one-kernel rows with 64-bit index arithmetic (``plan.INT32_LIMIT``)."""
    from opgraph.backends.cuda.codegen import plan
    monkeypatch.setattr(plan, "INT32_LIMIT", 100)
    for op, kinds in ((ops.LayerNorm(normalized_shape=(24,)), "xwb"),
                      (ops.LayerNormBackwardData(normalized_shape=(24,)), "gxw")):
        _, err, kinds_run, launches = _plan_and_run(emu, monkeypatch, op, _inputs(kinds, (37, 24), 1, "bfloat16"),
                                                    "bfloat16", True)
        assert kinds_run == ["rowsweep"] and "typedef long long IDX;" in launches[0].source
        assert err < TOLERANCE["bfloat16"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_one_kernel_in_place(emu, dtype):
    """The output written into x's own buffer: each thread overwrites only the vectors it has
    just read, and the row's first element (the moments' shift) is read once, before any thread
    of the block stores (a second read in the sweep would find the first thread's output)."""
    from codegen_cases import reference
    from opgraph.backends.cuda.codegen import launch
    op = ops.LayerNorm(normalized_shape=(96,))
    arrays = _inputs("xwb", (37, 96), 1, dtype)
    want = reference(op, arrays)
    x = arrays[0].copy()
    out_t = op.infer(*(TensorType(a.shape, a.dtype.name) for a in arrays))
    got = launch.run(np, op, [x, *arrays[1:]], out_t, out=x)
    assert got is x and launched(emu) == ["rowsweep"]
    assert "__restrict__" not in emu.raw_launches[-1]["source"].split("extern")[-1]
    assert rel_err(x, want) < TOLERANCE[dtype]


def test_rows_too_long_for_one_kernel_are_not_written_in_place(emu):
    """Rows of 8192 float32 (a split row: a reduction, a finish, a sweep): the separate sweep samples
    each row's first element again, after its own thread may have overwritten it (a relative error
    of 4.0 when it ran), so the plan refuses an in-place output there; a fresh output is right."""
    from codegen_cases import reference
    from opgraph.backends.cuda.codegen import launch
    from opgraph.backends.cuda.codegen.ir import PlanError
    op = ops.LayerNorm(normalized_shape=(8192,))
    arrays = _inputs("xwb", (2, 8192), 1, "float32")
    out_t = op.infer(*(TensorType(a.shape, a.dtype.name) for a in arrays))
    x = arrays[0].copy()
    with pytest.raises(PlanError, match="in place"):
        launch.run(np, op, [x, *arrays[1:]], out_t, out=x)
    got = launch.run(np, op, arrays, out_t)
    assert launched(emu)[-3:] == ["reduce", "finalize", "sweep"]
    assert rel_err(got, reference(op, arrays)) < TOLERANCE["float32"]


def test_a_large_offset_keeps_the_variance(emu):
    """A row far from 0 (mean 1000, spread 1): the shifted sums keep var, which
    E[x^2] - E[x]^2 in fp32 would lose entirely."""
    rng = seeded("offset")
    x = (1000.0 + rng.standard_normal((4, 64))).astype(np.float32)
    _, err = _run(ops.LayerNorm(normalized_shape=(64,)), [x], "float32")
    assert err < 1e-4


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,to", SUM_SHAPES, ids=[f"{s}->{t}" for s, t in SUM_SHAPES])
def test_sums_over_the_leading_axes(emu, shape, to, dtype):
    [x] = _inputs("g", shape, 1, dtype, layout_of(shape))
    out, err = _run(ops.SumTo(shape=to), [x], dtype)
    assert err < TOLERANCE[dtype], (shape, to, dtype, err)


def test_sums_of_half_storage_are_ct_sums(emu):
    """4096 bf16 ones summed per column: exact in fp32 (a bf16 accumulator stops at 256)."""
    x = np.ones((64, 64, 8), numpy_dtype("bfloat16"))
    out, _ = _run(ops.SumTo(shape=(8,)), [x], "bfloat16")
    assert np.all(np.asarray(out, np.float64) == 4096.0)


def test_a_fused_gradient_sum_over_leading_axes(emu):
    """GELU's gradient summed to a Linear bias (ConvNeXt's MLP): one program, the
    sum over (N, H, W) of an NHWC-stored (N, H, W, C) value."""
    from codegen_cases import program
    op = program([(ops.GeluBackward(), (0, 1)), (ops.SumTo(shape=(16,)), (2,))], 2, 3)
    x, g = _inputs("xg", (2, 3, 4, 16), 1, "bfloat16", "NHWC")
    want = reference(ops.SumTo(shape=(16,)), [reference(ops.GeluBackward(), [x, g])])
    types = tuple(TensorType(a.shape, a.dtype.name, storage_order(a)) for a in (x, g))
    rule = rules_for(type(op))["codegen"]
    assert rule.check(op, types, "cuda") is None
    out = rule.kernel(KernelContext(np, "cuda", {}, TensorType((16,), "bfloat16")), op, x, g)
    assert rel_err(out, want) < TOLERANCE["bfloat16"]


def test_the_split_is_read_off_the_shapes_once():
    assert trailing_axes((2, 14, 14, 384), (384,)) == 1
    assert trailing_axes((2, 14, 14, 384), (1, 14, 384)) == 2
    assert trailing_axes((2, 14, 14, 384), (14, 1)) is None
    assert trailing_axes((2, 14), (1, 1)) is None
    assert reduction_target((2, 14, 14, 384), (1, 1, 1, 384)) == "col"
    assert reduction_target((8, 384), (1, 384)) == "channel"  # 2-D: the channel sums, as before
    with pytest.raises(PlanError, match="per trailing index"):
        reduction_target((2, 14, 14, 384), (1, 1, 14, 1))


def test_one_program_has_one_split():
    """Two layer norms over different trailing axes cannot share the row/col split."""
    from codegen_cases import program
    from opgraph.backends.cuda.codegen.plan import build
    op = program([(ops.LayerNorm(normalized_shape=(4, 6)), (0,)), (ops.LayerNorm(normalized_shape=(6,)), (1,))],
                 1, 2)
    with pytest.raises(PlanError, match="trailing 2 and 1 axes"):
        build(op, (TensorType((3, 4, 6), "float32"),), TensorType((3, 4, 6), "float32"))


def _has_fma() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return " fma " in f.read()
    except OSError:
        return False


@pytest.fixture
def contracting_emu(emu, monkeypatch, tmp_path):
    """The emulator compiling as NVRTC does by default: ``a * b + c`` contracted into an FMA
    (g++ ``-O2 -mfma -ffp-contract=fast``: g++ forms FMAs from -O2), in a fresh folder and
    library cache."""
    import cuda_cpu_emulator as ce
    if not _has_fma():
        pytest.skip("this CPU has no FMA instruction")
    monkeypatch.setattr(ce, "GXX_FLAGS", [*ce.GXX_FLAGS, "-O2", "-mfma", "-ffp-contract=fast"])
    monkeypatch.setattr(ce, "_LIBS", {})
    monkeypatch.setattr(ce, "_WORKDIR", str(tmp_path))
    return emu


def test_one_element_rows_give_exactly_zero_under_fma_contraction(contracting_emu):
    """A row of one element normalises to 0 whatever its value: its input gradient is exactly
    0. On the H200 it was 1.4e-5 for this case (2026-12-05, ``test_layer_norm_gpu``): NVRTC
    contracted ``gy * weight - <g>`` into an FMA, leaving the product's rounding error times
    1/sqrt(eps); the product is now rounded on its own (``layer_norm.MUL_RN``). The contracting
    emulator gave 3e-6 here before that."""
    op = ops.LayerNormBackwardData(normalized_shape=(1,), eps=1e-5)
    out, _ = _run(op, _inputs("gxw", (6, 1), 1, "float32"), "float32")
    assert launched(contracting_emu) == ["rowsweep"]
    np.testing.assert_array_equal(out, np.zeros_like(out))


def _column_words(source: str, index: int) -> int:
    """The 16-byte loads of input ``index`` in a kernel's source."""
    return source.count(f"reinterpret_cast<const uint4*>(in{index} + ")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("row_sweep", [True, False])
def test_weight_and_bias_read_as_whole_words(emu, monkeypatch, dtype, row_sweep):
    """A layer norm's weight and bias (packed columns of C-order rows of 96) are loaded 16 bytes
    at a time, a vector's V columns from a multiple of V (``emit._col_vector``), in the one-kernel
    and the two-kernel plans, and the rows still match the reference; rows of 5 (one lane a
    vector) and a weight off the 16-byte grid (then every operand lane by lane) still match it."""
    from opgraph.backends.cuda.codegen import launch
    for op, kinds, cols in ((ops.LayerNorm(normalized_shape=(96,), eps=1e-5), "xwb", (1, 2)),
                            (ops.LayerNormBackwardData(normalized_shape=(96,), eps=1e-5), "gxw", (2,))):
        arrays = _inputs(kinds, (9, 96), 1, dtype)
        _, err, _, launches = _plan_and_run(emu, monkeypatch, op, arrays, dtype, row_sweep)
        assert err < TOLERANCE[dtype], (op, err)
        assert all(any(_column_words(x.source, c) for x in launches) for c in cols), op
        # the same weight at an address 2 or 4 bytes past the grid: every load lane by lane
        off = [a.copy() for a in arrays]
        for c in cols:
            grid = np.empty(off[c].size + 1, off[c].dtype)
            grid[1:] = off[c]
            off[c] = grid[1:]
        _, err_off, _, launches = _plan_and_run(emu, monkeypatch, op, off, dtype, row_sweep)
        assert not any(_column_words(x.source, c) for x in launches for c in cols)
        assert err_off < TOLERANCE[dtype], (op, err_off)
        launch._PLANS.clear()
    short = ops.LayerNorm(normalized_shape=(5,))
    _, err, _, launches = _plan_and_run(emu, monkeypatch, short, _inputs("xwb", (37, 5), 1, dtype), dtype, row_sweep)
    assert err < TOLERANCE[dtype] and not any(_column_words(x.source, 1) for x in launches)
