"""The bias gradient's ``vector`` method (``backends/cuda/colsum_vector.py``) on the CPU, through the
g++ emulator of its CUDA text (shared memory and ``__syncthreads`` included): column sums of
bfloat16 and float32 ``(M, C)`` rows against float64 NumPy sums, on one row and on many row
blocks, on one column tile and several, with thread rows that do not divide the block (TW = 12),
on a pitched channel slice of a wider buffer; what it declines; the bias gradient taking it (and
the ``columns`` kernel where it declines); the rules offering
it to the autotuner. The emulator runs threads one after another, so the order of additions is
checked on the GPU (tests/gpu/test_bf16_kernels.py, the ``vector`` tests at its end, which also
compare two runs bit for bit); nvcc compiles the sources here when it is installed."""

from __future__ import annotations

import numpy as np
import pytest

from cuda_cpu_emulator import GXX, NVCC, EmulatedCupy, nvcc_check
from cupy_standin import cupy_replaced
from opgraph import ops
from opgraph.backends.cuda import colsum, colsum_vector, rules
from opgraph.types import TensorType, numpy_dtype

needs_gxx = pytest.mark.skipif(GXX is None, reason="no g++: the kernels' CUDA text cannot run on the CPU")

BF16 = numpy_dtype("bfloat16")


@pytest.fixture
def emu(monkeypatch):
    with cupy_replaced(monkeypatch, EmulatedCupy(), colsum_vector._kernels, colsum._colsum_kernels) as e:
        yield e


def _rows(m, c, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, c)).astype(np.float32).astype(dtype)


def _check(got, rows):
    """got against the float64 sums of rows: the worst case of float32 accumulation of M terms
    (M * 2^-24 of the sum of magnitudes), then one rounding to the storage dtype (half a bfloat16
    ulp: at most 2^-8 of the value)."""
    exact = rows.astype(np.float64).sum(axis=0)
    scale = np.abs(rows.astype(np.float64)).sum(axis=0)
    rounding = 2.0 ** -8 if rows.dtype == BF16 else 0.0
    tol = scale * rows.shape[0] * 2.0 ** -24 + np.abs(exact) * rounding + 1e-30
    err = np.abs(got.astype(np.float64) - exact)
    assert got.dtype == rows.dtype and got.shape == (rows.shape[1],)
    assert (err <= tol).all(), (err / tol).max()


@needs_gxx
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("m, c", [(1, 8), (37, 16), (2000, 64), (5000, 96), (300, 8 * 260)])
def test_column_sums_against_float64(emu, dtype, m, c):
    # (300, 2080) bfloat16 is 260 vector columns: two column tiles of 256 and 4; (5000, 96)
    # bfloat16 12 vector columns, 21 thread rows and 4 idle threads per block, several row blocks
    rows = _rows(m, c, numpy_dtype(dtype))
    got = colsum_vector.column_sums(np, rows)
    _check(got, rows)
    g, tw, rows_per_block = colsum_vector.grid(m, c // colsum_vector.LANES[dtype])
    part, final = [launch for launch in emu.raw_launches][-2:]
    assert part["grid"] == (g, -(-(c // colsum_vector.LANES[dtype]) // tw), 1) and final["block"] == (32, 32, 1)


@needs_gxx
def test_column_sums_of_a_channel_slice(emu):
    # a (N*H*W, 32) slice of a 96-channel buffer, 16-byte aligned at channel 32 (bfloat16)
    wide = _rows(500, 96, BF16, seed=3)
    rows = wide[:, 32:64]
    assert colsum_vector.declines(rows) is None
    _check(colsum_vector.column_sums(np, rows), np.ascontiguousarray(rows))


def test_declines_what_it_cannot_load():
    wide = np.zeros((10, 24), BF16)  # rows 48 bytes apart
    assert wide.ctypes.data % 16 == 0
    assert colsum_vector.declines(wide[:, 8:16]) is None  # a pitched slice 16 bytes in
    assert colsum_vector.declines(wide[1:, 8:16]) is None
    assert "not 16-byte aligned" in colsum_vector.declines(wide[:, 4:12])
    assert "bytes apart" in colsum_vector.declines(np.zeros((10, 20), BF16)[:, :8])  # rows 40 bytes apart
    assert "not a multiple of 8 lanes" in colsum_vector.declines(np.zeros((10, 12), BF16))
    assert "dtype float16" in colsum_vector.declines(np.zeros((10, 16), np.float16))
    assert "no rows" in colsum_vector.declines(np.zeros((0, 16), BF16))
    assert "columns are 40 bytes apart" in colsum_vector.declines(np.zeros((8, 10), np.float32).T)


def test_grid_covers_every_row_with_no_empty_block():
    for m in (1, 7, 255, 256, 4097, 100352, 128 * 112 * 112):
        for cv in (1, 8, 48, 256, 300):
            g, tw, rows_per_block = colsum_vector.grid(m, cv)
            tiles = -(-cv // tw)
            assert tw == min(cv, colsum_vector.THREADS)
            assert (g - 1) * rows_per_block < m <= g * rows_per_block
            assert g * tiles <= max(tiles, colsum_vector.MAX_BLOCKS)


@needs_gxx
def test_bias_gradient_takes_the_vector_method_or_the_columns_kernel(emu, monkeypatch):
    gy = _rows(2 * 5 * 7, 24, BF16, seed=5).reshape(2, 5, 7, 24).transpose(0, 3, 1, 2)  # channels-last
    got = colsum.bias_add_backward(np, gy, method="vector")
    _check(got, gy.transpose(0, 2, 3, 1).reshape(-1, 24))
    assert [launch["name"] for launch in emu.raw_launches] == ["opgraph_colsum_vec_part", "opgraph_colsum_vec_final"]
    # 12 channels are not a multiple of 8 lanes: the columns kernel (its own launch tests:
    # test_cuda_colsum_launch.py) takes the same rows
    taken = []
    monkeypatch.setattr(colsum, "column_sums", lambda xp, rows: taken.append(rows.shape) or "columns")
    odd = _rows(2 * 3 * 3, 12, BF16, seed=6).reshape(2, 3, 3, 12).transpose(0, 3, 1, 2)
    assert colsum.bias_add_backward(np, odd, method="vector") == "columns" and taken == [(18, 12)]
    assert len(emu.raw_launches) == 2


def test_rules_offer_the_vector_method_where_it_applies():
    op = ops.BiasAddBackward()
    nhwc = TensorType((8, 64, 14, 14), "bfloat16", layout="NHWC")
    assert {"method": "vector"} in rules.bias_variants(op, [nhwc], "cuda")
    odd = TensorType((8, 12, 14, 14), "bfloat16", layout="NHWC")
    assert {"method": "vector"} not in rules.bias_variants(op, [odd], "cuda")
    half = TensorType((8, 64, 14, 14), "float16", layout="NHWC")
    assert {"method": "vector"} not in rules.bias_variants(op, [half], "cuda")
    assert rules.bias_variants.revision == 1


@pytest.mark.skipif(NVCC is None, reason="no nvcc")
def test_sources_compile_with_nvcc():
    nvcc_check([colsum_vector.source(d) for d in colsum_vector.LANES])
