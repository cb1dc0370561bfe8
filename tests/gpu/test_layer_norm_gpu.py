"""Layer normalisation's generated kernels and the sums over leading axes
(``backends/cuda/codegen/layer_norm.py``, the ``row`` / ``col`` targets) on the GPU,
against the float64 reference on the same stored inputs: the emulated tests'
cases (``tests/layer_norm_cases.py``) in fp32, bf16 and fp16, then ConvNeXt's
sizes (stage one's 56x56 rows of 96, its 384-wide MLP's bias sums), and the rows of
every stage both as one kernel (``plan.ROW_SWEEP``) and as a reduction and a sweep.
Nothing is timed here."""

from __future__ import annotations

import pytest

from opgraph import ops
from opgraph.backends.device import cuda_status
from opgraph.backends.registry import KernelContext, rules_for
from opgraph.types import TensorType, storage_order

from codegen_cases import TOLERANCE, reference, rel_err
from layer_norm_cases import (DTYPES, LAYER_NORM_CASES, SHAPES, SUM_SHAPES, case_ids, inputs, layout_of,
                              shape_ids)
from test_codegen_gpu import dev, host

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_status()[0], reason=f"no GPU: {cuda_status()[1]}")]


def check(cp, op, arrays, dtype):
    """``op``'s ``codegen`` kernel on the device copies of host ``arrays``, within the tolerance;
    returns its output on the host."""
    types = tuple(TensorType(a.shape, a.dtype.name, storage_order(a)) for a in arrays)
    rule = rules_for(type(op))["codegen"]
    assert rule.check(op, types, "cuda") is None
    t = op.infer(*types)
    got = rule.kernel(KernelContext(cp, "cuda", {}, t), op, *(dev(cp, a) for a in arrays))
    assert got.dtype.name == dtype and tuple(got.shape) == t.shape
    out = host(cp, got)
    err = rel_err(out, reference(op, arrays))
    assert err < TOLERANCE[dtype], (op, [a.shape for a in arrays], dtype, err)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,k", SHAPES, ids=shape_ids(SHAPES))
@pytest.mark.parametrize("op_type,kinds", LAYER_NORM_CASES, ids=case_ids(LAYER_NORM_CASES))
def test_layer_norm_ops(cp, rng, op_type, kinds, shape, k, dtype):
    op = op_type(normalized_shape=shape[len(shape) - k:], eps=1e-5)
    check(cp, op, inputs(rng, kinds, shape, k, dtype, layout_of(shape, k)), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,to", SUM_SHAPES, ids=[f"{s}->{t}" for s, t in SUM_SHAPES])
def test_sums_over_the_leading_axes(cp, rng, shape, to, dtype):
    check(cp, ops.SumTo(shape=to), inputs(rng, "g", shape, 1, dtype, layout_of(shape)), dtype)


@pytest.mark.parametrize("op_type,kinds", LAYER_NORM_CASES[2:6], ids=case_ids(LAYER_NORM_CASES[2:6]))
def test_convnext_stage_one_sizes(cp, rng, op_type, kinds):
    """Batch 8 of ConvNeXt-tiny's first stage, permuted channels-last: 25,088 rows of 96."""
    shape = (8, 56, 56, 96)
    check(cp, op_type(normalized_shape=(96,), eps=1e-6), inputs(rng, kinds, shape, 1, "bfloat16", "NHWC"),
          "bfloat16")


def test_convnext_mlp_bias_sums(cp, rng):
    """Stage one's 384-wide hidden layer's bias gradient: 25,088 rows summed per column, in bf16."""
    check(cp, ops.SumTo(shape=(384,)), inputs(rng, "g", (8, 56, 56, 384), 1, "bfloat16", "NHWC"), "bfloat16")


def test_float64_storage(cp, rng):
    op = ops.LayerNormBackwardData(normalized_shape=(16,))
    check(cp, op, inputs(rng, "gxw", (4, 3, 16), 1, "float64"), "float64")


#: (rows, C): ConvNeXt-tiny's four stages at batch 8 (N*H*W rows of C channels), rows of 4096
#: (fp32: 1024 vectors, 256 threads a row of 4 vectors each, the cut-off ``plan.ROW_SWEEP_VECTORS``),
#: 300 rows of 8 (bf16: TE = 1, a block's 256 rows and an unfilled one), one-element rows
ROW_SWEEP_SHAPES = [(25088, 96), (6272, 192), (1568, 384), (392, 768), (64, 4096), (300, 8), (6, 1)]


def _kinds(cp, op, arrays, dtype) -> list[str]:
    """The kernel kinds of ``op``'s cached plan on the device copies of ``arrays``."""
    from opgraph.backends.cuda.codegen import launch
    types = tuple(TensorType(a.shape, a.dtype.name, storage_order(a)) for a in arrays)
    plan = launch.plan_for(op, [dev(cp, a) for a in arrays], op.infer(*types))
    return [x.name.split("_")[2] for x in plan.launches]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("rows,c", ROW_SWEEP_SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("op_type,kinds", [(ops.LayerNorm, "xwb"), (ops.LayerNormBackwardData, "gxw")],
                         ids=["LayerNorm", "LayerNormBackwardData"])
def test_rows_in_one_kernel_and_in_two(cp, rng, monkeypatch, op_type, kinds, rows, c, dtype):
    """Each shape's layer norm and data gradient as one kernel (``kernels.row_sweep``) and as a
    reduction and a sweep (``plan.ROW_SWEEP`` off), each within the tolerance of the float64
    reference; the one-element rows' gradient exactly 0 in both."""
    from opgraph.backends.cuda.codegen import launch, plan
    op = op_type(normalized_shape=(c,), eps=1e-6)
    arrays = inputs(rng, kinds, (rows, c), 1, dtype)
    outs = []
    for row_sweep, want in ((True, ["rowsweep"]), (False, None)):
        monkeypatch.setattr(plan, "ROW_SWEEP", row_sweep)
        monkeypatch.setattr(launch, "_PLANS", {})
        outs.append(check(cp, op, arrays, dtype))
        got = _kinds(cp, op, arrays, dtype)
        assert (got == want) if want else "rowsweep" not in got, (row_sweep, got)
    if c == 1 and op_type is ops.LayerNormBackwardData:
        assert not any(o.astype("float64").any() for o in outs)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_rows_in_one_kernel_in_place(cp, rng, dtype):
    """The layer norm written over its own input (every element read before its thread writes it)."""
    from opgraph.backends.cuda.codegen import launch
    op = ops.LayerNorm(normalized_shape=(96,), eps=1e-6)
    arrays = inputs(rng, "xwb", (25088, 96), 1, dtype)
    want = reference(op, arrays)
    d = [dev(cp, a) for a in arrays]
    t = op.infer(*(TensorType(a.shape, a.dtype.name) for a in arrays))
    got = launch.run(cp, op, d, t, out=d[0])
    assert got is d[0] and _kinds(cp, op, arrays, dtype) == ["rowsweep"]
    assert rel_err(host(cp, got), want) < TOLERANCE[dtype]


# ---- ln-backward-sums: the data gradient that fills its weight gradient (backends/cuda/codegen_ln_sums.py)

def check_sums(cp, arrays, dtype):
    """``LayerNormBackwardDataSums``'s ``codegen`` kernel on the device copies of host ``(gy, x, w)``,
    its slot allocated by the slot's rule and poisoned with NaN: dx and the weight gradient each
    within the tolerance of their float64 references; returns the kinds of the launches planned."""
    import numpy as np
    from opgraph.backends.cuda.codegen import launch
    gy, x, w = arrays
    ns = w.shape
    op, slot = ops.LayerNormBackwardDataSums(normalized_shape=ns, eps=1e-6), \
        ops.LayerNormBackwardScaleSlot(normalized_shape=ns, eps=1e-6)
    d = [dev(cp, a) for a in arrays]
    dw = rules_for(type(slot))["codegen"].kernel(KernelContext(cp, "cuda", {}, TensorType(ns, dtype)), slot, d[0], d[1])
    dw.view(cp.uint16 if dtype in ("bfloat16", "float16") else dw.dtype)[...] = \
        dev(cp, np.full(ns, np.nan, dtype=w.dtype)).view(cp.uint16 if dtype in ("bfloat16", "float16") else dw.dtype)
    types = tuple(TensorType(a.shape, a.dtype.name, storage_order(a)) for a in (*arrays, w))
    rule = rules_for(type(op))["codegen"]
    assert rule.check(op, types, "cuda") is None
    dx = rule.kernel(KernelContext(cp, "cuda", {}, op.infer(*types)), op, *d, dw)
    data, scale = ops.LayerNormBackwardData(**op.params()), ops.LayerNormBackwardScale(**op.params())
    dx_err = rel_err(host(cp, dx), reference(data, list(arrays)))
    dw_err = rel_err(host(cp, dw), reference(scale, [x, gy]))
    assert dx_err < TOLERANCE[dtype] and dw_err < TOLERANCE[dtype], (gy.shape, dtype, dx_err, dw_err)
    plan = launch.plan_for(op, [*d, dw], op.infer(*types))
    return [x.name.split("_")[2] for x in plan.launches]


@pytest.mark.parametrize("dtype", [*DTYPES, "float64"])
@pytest.mark.parametrize("shape,k", SHAPES, ids=shape_ids(SHAPES))
def test_data_gradient_filling_its_weight_gradient(cp, rng, shape, k, dtype):
    assert check_sums(cp, inputs(rng, "gxw", shape, k, dtype, layout_of(shape, k)), dtype) == ["rowsweep", "fillsums"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("rows,c", ROW_SWEEP_SHAPES, ids=lambda v: str(v))
def test_data_gradient_filling_its_weight_gradient_at_convnext_stage_widths(cp, rng, rows, c, dtype):
    """Every stage's rows (thousands of blocks' partial sums added by the finish), the cut-off rows
    of 4096, TE = 1, one-element rows."""
    assert check_sums(cp, inputs(rng, "gxw", (rows, c), 1, dtype), dtype) == ["rowsweep", "fillsums"]


def test_data_gradient_filling_its_weight_gradient_channels_last_stage_one(cp, rng):
    """Batch 8 of stage one permuted channels-last, as the ConvNeXt step stores it."""
    check_sums(cp, inputs(rng, "gxw", (8, 56, 56, 96), 1, "bfloat16", "NHWC"), "bfloat16")
