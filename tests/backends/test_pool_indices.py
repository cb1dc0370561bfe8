"""Max pooling with saved 1-byte window indices (reference/pool_indices.py,
cuda/pool_indices.py): the oracle against today's ``max_pool2d`` and
``max_pool2d_backward`` in float64 (ties, NaN, -inf next to padding,
ceil_mode, asymmetric padding), and the CUDA kernels' own text run on the
CPU through the g++ emulator in float32 and bfloat16 bits, NCHW and NHWC."""

from __future__ import annotations

import numpy as np
import pytest

from opgraph.backends.cuda import pool as cuda_pool, pool_indices as cuda_idx
from opgraph.backends.reference import pool as ref_pool
from opgraph.backends.reference.pool_indices import (max_pool2d_backward_indices, max_pool2d_with_indices)
from opgraph.errors import ParameterError, ShapeError
from opgraph.types import is_channels_last, to_layout
from bf16_asserts import bf16
from cuda_cpu_emulator import GXX, EmulatedCupy
from cupy_standin import cupy_replaced

#: (x shape, kernel, stride, padding, ceil_mode): overlapping windows, ceil-mode
#: overhang, asymmetric padding, a 1-wide kernel axis, a 16x16 window (256 cells).
CASES = [
    ((2, 3, 9, 8), (3, 3), (2, 2), ((1, 1), (1, 1)), False),
    ((1, 2, 10, 9), (3, 2), (2, 1), ((1, 0), (1, 1)), True),
    ((2, 2, 7, 7), (2, 2), (2, 2), ((0, 0), (0, 0)), True),
    ((1, 1, 16, 17), (16, 16), (1, 1), ((0, 0), (0, 0)), False),
]
KINDS = ["normal", "ties", "nan", "neg_inf"]


def _input(rng, shape, kind):
    x = rng.standard_normal(shape)
    if kind == "ties":
        x = rng.integers(-1, 2, shape).astype(np.float64)
    elif kind == "nan":
        x.flat[rng.choice(x.size, max(1, x.size // 15), replace=False)] = np.nan
    elif kind == "neg_inf":
        x[:, :, : shape[2] // 2] = -np.inf
    return x


def _geometry(case):
    shape, k, s, p, ceil = case
    return ref_pool._checked("max_pool2d", np.empty(shape), k, s, p, ceil)


def _kw(case):
    return dict(kernel_size=case[1], stride=case[2], padding=case[3], ceil_mode=case[4])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", CASES)
def test_the_saved_indices_route_as_max_pool2d_backward(case, kind):
    rng = np.random.default_rng(0)
    x = _input(rng, case[0], kind)
    g = _geometry(case)
    y, idx = max_pool2d_with_indices(np, x, g)
    assert idx.dtype == np.uint8 and idx.shape == y.shape
    np.testing.assert_array_equal(y, ref_pool.max_pool2d(np, x, **_kw(case)))
    gy = rng.standard_normal(y.shape)
    np.testing.assert_array_equal(max_pool2d_backward_indices(np, idx, gy, g, x.shape),
                                  ref_pool.max_pool2d_backward(np, x, gy, **_kw(case)))


def test_ties_go_to_the_first_cell_in_row_major_order():
    x = np.zeros((1, 1, 2, 2))
    g = ref_pool._checked("max_pool2d", x, 2, 2, 0, False)
    _, idx = max_pool2d_with_indices(np, x, g)
    assert idx.item() == 0
    x[0, 0, 1, 0] = x[0, 0, 1, 1] = 1.0
    _, idx = max_pool2d_with_indices(np, x, g)
    assert idx.item() == 2  # (row 1, column 0) of a 2-wide window


def test_a_window_over_256_cells_is_refused():
    x = np.zeros((1, 1, 17, 17))
    with pytest.raises(ParameterError, match="kernel_size.*289 cells"):
        max_pool2d_with_indices(np, x, ref_pool._checked("max_pool2d", x, 17, 1, 0, False))


def test_indices_and_gradient_of_another_shape_are_refused():
    x = np.zeros((1, 1, 4, 4))
    g = ref_pool._checked("max_pool2d", x, 2, 2, 0, False)
    _, idx = max_pool2d_with_indices(np, x, g)
    with pytest.raises(ShapeError, match=r"idx \(1, 1, 2, 2\) and gy \(1, 1, 3, 2\) must both be \(1, 1, 2, 2\)"):
        max_pool2d_backward_indices(np, idx, np.zeros((1, 1, 3, 2)), g, x.shape)


@pytest.fixture
def emu(monkeypatch):
    if GXX is None:
        pytest.skip("no g++: the kernels' CUDA text cannot run on the CPU")
    with cupy_replaced(monkeypatch, EmulatedCupy(), cuda_pool._compiled) as e:
        yield e


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind", ["ties", "nan", "neg_inf"])
@pytest.mark.parametrize("case", CASES[:3])
def test_cuda_kernel_sources_match_the_reference(emu, case, kind, dtype, layout):
    """The CUDA text of both kernels, emulated: y and idx equal the oracle's on
    the same stored values; the gradient equals it within fp32 summation
    (bf16: one rounding of the float32 sum)."""
    rng = np.random.default_rng(1)
    x64 = _input(rng, case[0], kind)
    x = bf16(x64) if dtype == "bfloat16" else x64.astype(np.float32)
    x = to_layout(np, x, layout)
    g = _geometry(case)
    y, idx = cuda_idx.max_pool2d_with_indices(np, x, g)
    want_y, want_idx = max_pool2d_with_indices(np, x.astype(np.float64), g)
    np.testing.assert_array_equal(idx, want_idx)
    np.testing.assert_array_equal(y.astype(np.float64), want_y)
    assert y.dtype == x.dtype and (layout == "NHWC") == is_channels_last(y) == is_channels_last(idx)
    gy64 = rng.standard_normal(y.shape)
    gy = bf16(gy64) if dtype == "bfloat16" else gy64.astype(np.float32)
    gx = cuda_idx.max_pool2d_backward_indices(np, idx, gy, g, x.shape)
    want = max_pool2d_backward_indices(np, want_idx, gy.astype(np.float64), g, x.shape)
    assert gx.dtype == gy.dtype and gx.shape == x.shape
    tol = 8e-3 if dtype == "bfloat16" else 1e-6
    np.testing.assert_allclose(gx.astype(np.float64), want, rtol=tol, atol=tol)
    names = [c["name"] for c in emu.launches]
    assert any("maxpool_idx_bwd" in n for n in names) and not any(n.startswith("opgraph_maxpool_arg") for n in names)
