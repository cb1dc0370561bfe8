"""The layer norm's data gradient that fills its weight gradient (``LayerNormBackwardDataSums``,
``backends/cuda/codegen_ln_sums.py``): the one-kernel row sweep summing ``gy * xhat`` per column
over each block's rows, then a fixed-order finish over the blocks (``kernels.row_sweep``,
``plan._filled``), on the CPU through the g++ emulator, against the float64 references of
``LayerNormBackwardData`` and ``LayerNormBackwardScale``: fp32, bf16, fp16 and fp64 storage, row
counts that are no multiple of a block's rows, one-element rows, rows of 1 to 256 threads (TE),
inputs stored channels-last; the rule's check declining where the plan cannot run, the kernel's
fallback to the pair's own kernels where one call's arrays take another plan, and a sabotaged
block tree that the tolerance catches."""

from __future__ import annotations

import numpy as np
import pytest

from codegen_cases import TOLERANCE, reference, rel_err
from codegen_emulated import emu, launched, needs_gxx, seeded  # noqa: F401, F811  (emu: fixture)
from layer_norm_cases import DTYPES, SHAPES, inputs, layout_of, shape_ids
from opgraph import ops
from opgraph.backends.cuda.codegen import kernels, launch, plan
from opgraph.backends.registry import KernelContext, rules_for
from opgraph.types import TensorType, numpy_dtype, storage_order

pytestmark = needs_gxx


def _types(arrays):
    return tuple(TensorType(a.shape, a.dtype.name, storage_order(a)) for a in arrays)


def _arrays(shape, k, dtype, layout=None):
    gy, x, w = inputs(seeded("ln-sums", shape, k, dtype, layout), "gxw", shape, k, dtype, layout)
    return gy, x, w


def _run(shape, k, dtype, layout=None, arrays=None, check=True):
    """The fused node's ``codegen`` kernel: ``(dx error, dw error, kinds launched)`` against the
    float64 references, after its slot's rule allocated ``dw`` (filled with NaN first, so that an
    entry the kernel does not write fails)."""
    gy, x, w = arrays if arrays is not None else _arrays(shape, k, dtype, layout)
    ns = tuple(shape[len(shape) - k:])
    op, slot = ops.LayerNormBackwardDataSums(normalized_shape=ns), ops.LayerNormBackwardScaleSlot(normalized_shape=ns)
    dw = rules_for(type(slot))["codegen"].kernel(KernelContext(np, "cuda", {}, slot.infer(*_types([gy, x]))),
                                                 slot, gy, x)
    assert dw.shape == ns and dw.dtype == x.dtype
    dw[...] = np.nan
    types = _types([gy, x, w, dw])
    rule = rules_for(type(op))["codegen"]
    if check:
        assert rule.check(op, types, "cuda") is None
    before = len(launched(emu_now[0]))
    dx = rule.kernel(KernelContext(np, "cuda", {}, op.infer(*types)), op, gy, x, w, dw)
    assert dx.dtype.name == dtype and dx.shape == x.shape
    data, scale = ops.LayerNormBackwardData(normalized_shape=ns), ops.LayerNormBackwardScale(normalized_shape=ns)
    return (rel_err(dx, reference(data, [gy, x, w])), rel_err(dw, reference(scale, [x, gy])),
            launched(emu_now[0])[before:])


#: the emulator of the running test (set by the autouse fixture)
emu_now: list = [None]


@pytest.fixture(autouse=True)
def _current(emu):
    emu_now[0] = emu
    yield
    emu_now[0] = None


@pytest.mark.parametrize("dtype", [*DTYPES, "float64"])
@pytest.mark.parametrize("shape,k", SHAPES, ids=shape_ids(SHAPES))
def test_dx_and_the_filled_weight_gradient_against_the_reference(shape, k, dtype):
    """SHAPES: K a multiple of 8, K odd with rows no multiple of a block's (inactive rows), two
    normalised axes, one row, one-element rows (K = 1), a 4-D channels-last value."""
    dx_err, dw_err, kinds = _run(shape, k, dtype, layout_of(shape, k))
    assert kinds == ["rowsweep", "fillsums"]
    assert dx_err < TOLERANCE[dtype] and dw_err < TOLERANCE[dtype], (dx_err, dw_err)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rows,vectors,te", [(300, 1, 1), (37, 12, 4), (11, 96, 32), (3, 1024, 256), (70, 24, 8)],
                         ids=lambda v: str(v))
def test_every_row_length_up_to_the_cut_off(monkeypatch, rows, vectors, te, dtype):
    """TE = 1 (256 rows a block, the second block mostly inactive) up to 256 threads a row (one
    row a block: no tree), and 70 rows of 24 vectors (TE = 8, 32 rows a block: three blocks, the
    last part-full), so the blocks' partial sums are many and the finish adds them all."""
    k = vectors * 16 // numpy_dtype(dtype).itemsize
    launch._PLANS.clear()
    dx_err, dw_err, kinds = _run((rows, k), 1, dtype)
    assert kinds == ["rowsweep", "fillsums"]
    [(p, *_)] = launch._PLANS.values()
    sizes = {n: int(v) for n, (kind, _, v) in p.launches[0].params.items.items() if kind == "scalar"}
    assert sizes["TE"] == te and p.temps["part"] == p.launches[0].grid[0] * k
    assert dx_err < TOLERANCE[dtype] and dw_err < TOLERANCE[dtype], (dx_err, dw_err)


def test_half_storage_sums_in_float32_and_rounds_once():
    """bf16 storage: the kernels compute in float32 (CT), the partial sums are float32."""
    _, dw_err, _ = _run((37, 24), 1, "bfloat16")
    assert dw_err < TOLERANCE["bfloat16"]
    assert all("typedef float CT;" in x["source"] for x in emu_now[0].raw_launches)


def test_the_check_declines_where_the_row_sweep_cannot_run(monkeypatch):
    """Rows past ``plan.ROW_SWEEP_VECTORS`` vectors a thread, a row split over blocks, or the row
    sweep turned off: the rule declines, so the fuse pass keeps the pair apart."""
    rule = rules_for(ops.LayerNormBackwardDataSums)["codegen"]

    def why(k, rows=37):
        t, w = TensorType((rows, k), "bfloat16"), TensorType((k,), "bfloat16")
        return rule.check(ops.LayerNormBackwardDataSums(normalized_shape=(k,)), (t, t, w, w), "cuda")
    assert why(96) is None
    assert "row sweep" in why(40000, 1)
    monkeypatch.setattr(plan, "ROW_SWEEP_VECTORS", 2)  # 12 vectors a row, TE = 4: 3 a thread
    assert "row sweep" in why(96)
    monkeypatch.setattr(plan, "ROW_SWEEP_VECTORS", 4)
    monkeypatch.setattr(plan, "ROW_SWEEP", False)
    assert "row sweep" in why(96)


def test_arrays_another_plan_takes_run_the_pairs_own_kernels(monkeypatch):
    """A call whose arrays the fused plan cannot take (here: the row sweep turned off after the
    check) runs the data gradient's and the weight gradient's own kernels: the same values."""
    monkeypatch.setattr(plan, "ROW_SWEEP", False)
    dx_err, dw_err, kinds = _run((37, 24), 1, "float32", check=False)
    assert "rowsweep" not in kinds and "fillsums" not in kinds
    assert dx_err < TOLERANCE["float32"] and dw_err < TOLERANCE["float32"]


def test_a_sabotaged_block_tree_is_caught(monkeypatch):
    """The check of the weight gradient is sharp: with the block's tree over its rows dropped (each
    block writes its first row's terms alone), the weight gradient is far off the reference while
    the data gradient (the row sums' own tree kept) stays right."""
    tree = kernels._tree
    monkeypatch.setattr(kernels, "_tree",
                        lambda slots, lane, *a, **k: "" if lane == "e" else tree(slots, lane, *a, **k))
    launch._PLANS.clear()
    dx_err, dw_err, kinds = _run((70, 24), 1, "float32")
    assert kinds == ["rowsweep", "fillsums"] and dx_err < TOLERANCE["float32"] and dw_err > 0.1


def test_an_unaligned_call_falls_back_to_the_pairs_own_kernels(emu):
    """Review: fp32 rows of 1032 with gy 4 bytes off the 16-byte grid take V = 1 at run time, 5
    vectors a thread, past ``plan.ROW_SWEEP_VECTORS``: the kernel runs the pair's own kernels, the
    weight gradient written into the slot (an output of its own, not in place: it raised PlanError
    when any ``out=`` counted as in place), both within the tolerance."""
    from opgraph.backends.cuda import codegen_ln_sums
    rng = np.random.default_rng(3)
    k = 1032
    x, w = rng.standard_normal((7, k)).astype(np.float32), rng.standard_normal(k).astype(np.float32)
    grid = np.empty(7 * k + 1, np.float32)
    gy = grid[1:].reshape(7, k)  # 4 bytes past the grid
    gy[...] = rng.standard_normal((7, k))
    dw = np.full(k, np.nan, np.float32)
    op = ops.LayerNormBackwardDataSums(normalized_shape=(k,))
    dx = codegen_ln_sums.data_sums_kernel(KernelContext(np, "cuda", {}, TensorType((7, k), "float32")),
                                          op, gy, x, w, dw)
    want_dx = reference(ops.LayerNormBackwardData(normalized_shape=(k,)), [gy, x, w])
    want_dw = reference(ops.LayerNormBackwardScale(normalized_shape=(k,)), [x, gy])
    assert rel_err(dx, want_dx) < TOLERANCE["float32"] and rel_err(dw, want_dw) < TOLERANCE["float32"]
