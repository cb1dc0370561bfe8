"""``HardtanhBackward`` compares its mask operand with the bounds rounded to
that operand's storage dtype, in the reference kernel and the generated one
(through the g++ emulator). ``Hardtanh.vjp`` passes the stored output, whose
clipped elements hold the rounded bound: with ``hardtanh(x, 0.1, 0.2)`` in
bf16 they hold bf16(0.1) = 0.10009766 > 0.1, and the unrounded mask passed
their gradient (found by a fresh-user review; fp16 leaked at the upper bound)."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph import ops

from codegen_emulated import emu, run_case  # noqa: F401  (emu: the fixture)


def _clipped_gradient(dtype: str, lo: float, hi: float):
    g = og.Graph()
    x = g.input("x", (1, 1, 4, 8))
    y = og.hardtanh(x, lo, hi)
    (gx,) = og.grad(og.mean(og.mul(y, y)), [x])
    xv = np.linspace(-1, 1, 32).reshape(1, 1, 4, 8)
    got = np.asarray(og.compile([gx], device="cpu", dtype=dtype)(x=xv)[0]).astype(np.float64)
    want = og.compile([gx], pipeline="reference", dtype="float64")(x=xv)[0]
    return got, np.asarray(want), xv


@pytest.mark.filterwarnings("error::RuntimeWarning")  # a bound beyond float16's range rounds to inf, quietly
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("lo, hi", [(0.1, 0.2), (-0.3, 0.7), (0.0, 6.0), (-0.5, 70000.0)])
def test_clipped_elements_get_no_gradient(dtype, lo, hi):
    got, want, xv = _clipped_gradient(dtype, lo, hi)
    outside = (xv <= lo) | (xv >= hi)
    assert not got[outside].any(), got[outside]
    assert np.allclose(got[~outside], want[~outside], rtol=2e-2, atol=1e-6)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_generated_kernel_rounds_the_bounds_too(emu, dtype):  # noqa: F811
    op = ops.HardtanhBackward(min_val=0.1, max_val=0.2)
    stored = np.asarray([0.1, 0.2, 0.15, 0.05, 0.3] * 4, dtype=np.float64).reshape(1, 4, 5)
    from opgraph.types import numpy_dtype
    y = stored.astype(numpy_dtype(dtype))  # the stored output: its clipped elements hold the rounded bounds
    gy = np.ones_like(y)
    out, _, _ = run_case(op, None, None, dtype, "NCHW", arrays=[y, gy], compare=False)
    assert list(np.asarray(out, np.float64).ravel()) == [0.0, 0.0, 1.0, 0.0, 0.0] * 4
