"""bfloat16 storage in our CUDA kernels, checked without a GPU.

The kernels themselves run on a GPU in tests/gpu/test_bf16_kernels.py. Here
the CUDA text of every element-wise kernel (preamble with the LD/ST/CT macros,
body) is compiled as C++ and run on NumPy arrays by the g++ stand-in for
CuPy of ``cuda_cpu_emulator.py``, so the bfloat16 paths are computed for real
on the CPU and compared with the NumPy reference in float64 on the same
bfloat16 values: masks, argmax, NaN and -inf exactly, other outputs within one
bfloat16 ulp (forward) or SEMANTICS.md's 1e-2 (backward). The emulator refuses
a bfloat16 array as a kernel argument (our kernels take the uint16 bits), and
the inputs are :class:`StrictBf16` arrays, on which a cast, a copy or any
NumPy computation of the bfloat16 data raises: so a whole-tensor cast before
or after a kernel fails these tests. The column / row sum kernels
(RawModule) are replayed in NumPy in the kernels' order of additions, as
test_cuda_colsum_launch.py does for the other dtypes, and their bfloat16
load/store overloads run through g++. The CUDA text of what ran is compiled
with nvcc (``-ptx``, no GPU needed) where nvcc is installed.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from cuda_cpu_emulator import GXX, NVCC, EmulatedCupy, nvcc_check
from cupy_standin import cupy_replaced
from opgraph.backends.cuda import colsum as cuda_colsum, lrn as cuda_lrn, relu as cuda_relu, storage as cuda_storage
from opgraph.backends.cuda import loss as cuda_loss, pool as cuda_pool, rules as cuda_rules
from opgraph.backends.reference import loss as ref_loss
from opgraph.backends.reference import lrn as ref_lrn
from opgraph.backends.reference import pool as ref_pool
from opgraph.types import is_channels_last

from bf16_asserts import (BF16, assert_same_values, assert_within_ulp, bf16, cell_codes, f64,
                          pool_input, pool_kwargs, rel_err, spy_casts)


needs_gxx = pytest.mark.skipif(GXX is None, reason="no g++: the kernels' CUDA text cannot run on the CPU")

#: every compiled-kernel cache of the three modules (cleared around each test)
CACHES = (cuda_storage.elementwise_kernel, cuda_colsum._colsum_kernels, cuda_colsum._rowsum_kernel, cuda_pool._compiled, cuda_loss._kernel)


# ------------------------------------------------------------------ helpers

class StrictBf16(np.ndarray):
    """A bfloat16 array that behaves as a CuPy one may: views only (transpose,
    reshape, ``view(uint16)``). ``astype``, ``copy``, ufuncs and NumPy
    functions on its bfloat16 data raise, so a cast pass or a computation
    outside our kernels is caught; once viewed as uint16 it is unrestricted."""

    def astype(self, dtype, *args, **kwargs):
        if self.dtype == BF16:
            raise AssertionError(f"astype({dtype}) of a bfloat16 tensor outside the kernels")
        return self.view(np.ndarray).astype(dtype, *args, **kwargs)

    def copy(self, *args, **kwargs):
        if self.dtype == BF16:
            raise AssertionError("copy of a bfloat16 tensor (CuPy may not copy bfloat16)")
        return self.view(np.ndarray).copy(*args, **kwargs)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if any(getattr(a, "dtype", None) == BF16 for a in inputs + tuple(kwargs.get("out") or ())):
            raise AssertionError(f"{ufunc.__name__} computed on bfloat16 outside the kernels")
        inputs = tuple(a.view(np.ndarray) if isinstance(a, StrictBf16) else a for a in inputs)
        return getattr(ufunc, method)(*inputs, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        flat = [*args, *kwargs.values()]
        flat += [b for a in flat if isinstance(a, (list, tuple)) for b in a]
        if any(isinstance(a, np.ndarray) and a.dtype == BF16 for a in flat):
            raise AssertionError(f"np.{func.__name__} on bfloat16 outside the kernels")
        return super().__array_function__(func, types, args, kwargs)


def channels_last(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


def strict(a, layout="NCHW"):
    """The kernel input: ``a`` (bfloat16) in ``layout``, as a :class:`StrictBf16`."""
    return (channels_last(a) if layout == "NHWC" else np.ascontiguousarray(a)).view(StrictBf16)


# ------------------------------------------------------------------ fixtures

class ReplayModules(EmulatedCupy):
    """:class:`EmulatedCupy` plus ``RawModule``: the column-sum and row-sum
    kernels replayed in NumPy as their CUDA source says, after checking each
    launch against the signature the source declares."""

    #: element type in the CUDA source -> the dtype of the array passed
    #: (bfloat16 and float16 travel as their bits).
    ARRAY = {"opgraph_bf16": np.uint16, "unsigned short": np.float16, "float": np.float32,
             "double": np.float64}

    def __init__(self, run=True):
        super().__init__(run)
        self.sources, self.raw_launches = [], []

    def RawModule(self, code, options=()):
        self.sources.append(code)
        acc = {"float": np.float32, "double": np.float64}[re.search(r"typedef (\w+) ACC;", code).group(1)]
        sigs = dict((name, (src, dst)) for name, src, dst in re.findall(
            r"void (opgraph_\w+)\(const ([\w ]+?)\* __restrict__ src, ([\w ]+?)\* __restrict__ dst", code))
        rec = self

        class Module:
            def get_function(self, name):
                src_t, dst_t = (t.replace("ACC", {np.float32: "float", np.float64: "double"}[acc])
                                for t in sigs[name])

                def launch(grid, block, args, shared_mem=0):
                    src, dst = args[:2]
                    rec.raw_launches.append(dict(name=name, grid=grid, block=block, args=args))
                    assert block == (32, 8) and shared_mem == 0
                    assert all(type(v) is np.int64 for v in args[2:])  # long long
                    assert src.dtype == rec.ARRAY[src_t], (name, src.dtype)
                    assert dst.dtype == rec.ARRAY[dst_t], (name, dst.dtype)
                    assert src.flags.c_contiguous and dst.flags.c_contiguous
                    load = (lambda a: a.view(BF16).astype(acc)) if src_t == "opgraph_bf16" else \
                        (lambda a: a.astype(acc))
                    store = (lambda v: v.astype(BF16).view(np.uint16)) if dst_t == "opgraph_bf16" else \
                        (lambda v: v.astype(dst.dtype))
                    if name == "opgraph_rowsum":
                        _replay_rows(src, dst, *map(int, args[2:]), grid, load, store, acc)
                    else:
                        _replay_columns(src, dst, *map(int, args[2:]), grid, load, store, acc)
                return launch
        return Module()


def _replay_columns(src, dst, m, c, rows_per_block, grid, load, store, acc):
    """opgraph_colsum_*: block row y sums rows [y*rpb, min(+rpb, m)); thread
    row ty sums rows ty, ty+8, ... in turn, then partials 0 + 1 + ... + 7."""
    assert (grid[0] - 1) * 32 < c <= grid[0] * 32
    flat = src.reshape(-1)
    for y in range(grid[1]):
        r0, r1 = y * rows_per_block, min((y + 1) * rows_per_block, m)
        chunk = load(flat[r0 * c:r1 * c].reshape(-1, c))
        parts = [np.add.accumulate(chunk[ty::8], axis=0, dtype=acc)[-1] if len(chunk[ty::8])
                 else np.zeros(c, acc) for ty in range(8)]
        s = parts[0]
        for p in parts[1:]:
            s = (s + p).astype(acc)
        dst.reshape(-1)[y * c:(y + 1) * c] = store(s)


def _replay_rows(src, dst, rows, length, grid, load, store, acc):
    """opgraph_rowsum: warp per row; lane l sums elements l, l+32, ... in turn,
    then the shuffle tree (16, 8, 4, 2, 1) folds the lanes into lane 0."""
    assert grid == (-(-rows // 8),)
    pad = -(-length // 32) * 32
    a = np.zeros((rows, pad), acc)
    a[:, :length] = load(src.reshape(rows, length))
    lanes = np.add.accumulate(a.reshape(rows, -1, 32), axis=1, dtype=acc)[:, -1]
    for k in (16, 8, 4, 2, 1):
        lanes[:, :32 - k] = lanes[:, :32 - k] + lanes[:, k:]
    dst[:rows] = store(lanes[:, 0])


@pytest.fixture
def emu(monkeypatch):
    """The emulated ``cupy`` (its ``launches`` and CUDA ``cuda_sources``)."""
    if GXX is None:
        pytest.skip("no g++: the kernels' CUDA text cannot run on the CPU")
    with cupy_replaced(monkeypatch, ReplayModules(), *CACHES) as e:
        yield e


@pytest.fixture
def casts(monkeypatch):
    """Every whole-array bf16 <-> f32 conversion, as ``(function, size)``."""
    return spy_casts(monkeypatch)


def _kernel_types(emu, prefix):
    """The placeholder types of the launches whose name starts with ``prefix``."""
    return [c["types"] for c in emu.launches if c["name"].startswith(prefix)]


# ------------------------------------------------------------------ sources per dtype

def test_storage_preamble_per_dtype():
    pre = cuda_storage.storage_preamble("bfloat16")
    assert "__uint_as_float(((unsigned int)b) << 16)" in pre                 # exact load
    assert "(u + 0x7fffu + ((u >> 16) & 1u)) >> 16" in pre                    # round to nearest even
    assert "(u & 0x7fffffffu) > 0x7f800000u" in pre and "| 0x40u" in pre      # NaN stays a quiet NaN
    assert "#define CT float" in pre and "#define LD(e) opgraph_bf16_load(e)" in pre
    assert "#define ST(e, v) ((e) = opgraph_bf16_bits(v))" in pre
    for dtype in ("float16", "float32", "float64"):  # identity: the float kernels compile as before
        plain = cuda_storage.storage_preamble(dtype)
        assert plain == "#define CT T\n#define LD(e) (e)\n#define ST(e, v) ((e) = (v))\n"
        assert "bf16" not in plain
    assert [cuda_storage.kernel_tag(d) for d in ("bfloat16", "float16", "float32", "float64")] == ["_bf16", "", "", ""]
    # the cast kernels (cuDNN / cuBLAS operands) use the same conversions
    assert cuda_storage.BF16_DEVICE in pre


def test_bodies_load_through_the_macros():
    """Every value a kernel compares or computes with is loaded by LD and
    every computed result stored by ST (a bare ``x[...]`` in arithmetic would
    read bfloat16 bits as an integer)."""
    for body in (cuda_pool._MAX, cuda_pool._AVG, cuda_pool._MAX_BWD, cuda_pool._AVG_BWD, cuda_lrn._LRN_FWD,
                 cuda_lrn._LRN_BWD1, cuda_lrn._LRN_BWD2, cuda_loss._SOFTMAX, cuda_loss._LOG_SOFTMAX,
                 cuda_loss._SOFTMAX_BWD, cuda_loss._LOG_SOFTMAX_BWD, cuda_loss._CE_ROWS, cuda_loss._CE_BWD):
        assert "LD(" in body and "T acc" not in body.replace("CT acc", "")
        assert not re.search(r"\bT [a-z]", body), body  # no local of the storage type
        for out in ("y", "gx"):
            assert not re.search(rf"\b{out}\[[^\]]*\] =", body), body  # outputs written through ST
    assert "best > (CT)0" in cuda_pool._STORE_ARG[True]
    for body in (cuda_relu.RELU_BODY, cuda_relu.RELU_BWD_BODY, cuda_relu.THRESHOLD_BODY, cuda_relu.THRESHOLD_BWD_BODY):
        assert "LD(x)" in body


def test_column_and_row_sum_sources_for_bfloat16():
    code = cuda_colsum.colsum_source("bfloat16")
    assert code.startswith("typedef float ACC;") and "struct opgraph_bf16 { unsigned short bits; };" in code
    assert "void opgraph_colsum_part(const opgraph_bf16* __restrict__ src, float* __restrict__ dst" in code
    assert "void opgraph_colsum_final(const float* __restrict__ src, opgraph_bf16* __restrict__ dst" in code
    assert ("void opgraph_colsum_direct(const opgraph_bf16* __restrict__ src, "
            "opgraph_bf16* __restrict__ dst") in code
    assert cuda_colsum._COLSUM_TYPES["bfloat16"] == ("opgraph_bf16", "float")
    rows = cuda_colsum.rowsum_source("bfloat16")
    assert "void opgraph_rowsum(const opgraph_bf16* __restrict__ src, ACC* __restrict__ dst" in rows
    assert rows.startswith("typedef float ACC;") and "__shfl_down_sync" in rows and "atomic" not in rows


def test_cuda_rules_accept_bfloat16():
    from opgraph.types import TensorType

    class Odd:  # a dtype TensorType would refuse: the message lists the accepted ones
        dtype = "complex64"
    types = (TensorType((2, 3, 4, 4), "bfloat16"), TensorType((2,), "int64"))
    assert cuda_rules.check(None, types, "cuda") is None
    msg = cuda_rules.check(None, (Odd(),), "cuda")
    assert msg == "the CuPy kernels take float16, bfloat16, float32, float64; got complex64"


# ------------------------------------------------------------------ conversions

@needs_gxx
def test_bf16_conversions_match_ml_dtypes(emu):
    """The load (all 65536 patterns) and the rounding store (every bf16 high
    half with the low halves around the rounding ties, and random floats)
    bit for bit against ml_dtypes; NaN: a quiet NaN of the same sign."""
    pats = np.arange(2 ** 16, dtype=np.uint16)
    got = cuda_storage.bf16_bits_to_float(np, pats)
    np.testing.assert_array_equal(got.view(np.uint32), pats.view(BF16).astype(np.float32).view(np.uint32))
    lows = np.array([0, 1, 0x7fff, 0x8000, 0x8001, 0xffff, 0x4000, 0xc000], np.uint32)
    u = ((np.arange(2 ** 16, dtype=np.uint32)[:, None] << 16) | lows).ravel()
    u = np.concatenate([u, np.random.default_rng(0).integers(0, 2 ** 32, 2 ** 18, dtype=np.uint32)])
    x = u.view(np.float32)
    out = cuda_storage.float_to_bf16_bits(np, x)
    assert out.dtype == np.uint16
    nan = np.isnan(x)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(BF16).view(np.uint16)
    np.testing.assert_array_equal(out[~nan], want[~nan])
    assert np.isnan(out[nan].view(BF16).astype(np.float32)).all()
    assert ((out[nan] & 0x40) != 0).all() and ((out[nan] >> 15) == (u[nan] >> 31)).all()
    # the column / row kernels' overloads for opgraph_bf16 do the same
    k = emu.ElementwiseKernel("uint16 b, float32 f", "float32 y, uint16 z", """
        opgraph_bf16 v; v.bits = b; y = opgraph_load(v);
        opgraph_bf16 o; opgraph_store(&o, f); z = o.bits""", "colsum_helpers",
                              preamble=cuda_colsum.COLSUM_BF16_HELPERS)
    y, z = k(np.resize(pats, x.size), x, np.empty(x.size, np.float32), np.empty(x.size, np.uint16))
    np.testing.assert_array_equal(y.view(np.uint32), np.resize(got, x.size).view(np.uint32))
    np.testing.assert_array_equal(z, out)


# ------------------------------------------------------------------ ReLU, threshold

def _special(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    x.reshape(-1)[:9] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, 0.49999, 0.50001, -np.nan]
    return bf16(x)


@needs_gxx
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_relu_and_threshold_bf16(emu, casts, layout):
    rng = np.random.default_rng(1)
    x, gy = _special(rng, (2, 3, 4, 5)), _special(rng, (2, 3, 4, 5))
    x32, gy32 = x.astype(np.float32), gy.astype(np.float32)
    dx, dgy = strict(x, layout), strict(gy, layout)
    zero = np.float32(0)
    checks = [(cuda_relu.relu(np, dx), np.where((x32 > 0) | np.isnan(x32), x32, zero)),
              (cuda_relu.relu_backward(np, dx, dgy), np.where(x32 > 0, gy32, zero)),
              (cuda_relu.threshold(np, dx, threshold=0.5, value=-2.0), np.where(x32 <= 0.5, np.float32(-2.0), x32)),
              (cuda_relu.threshold_backward(np, dx, dgy, threshold=0.5), np.where(x32 > 0.5, gy32, zero))]
    for got, want in checks:  # exact: these select stored values
        assert got.dtype == BF16 and got.strides == dx.strides  # layout kept
        assert_same_values(got, want)
    # a blocked cell gives +0.0 (bits 0), a passed cell gy's / x's exact bits
    np.testing.assert_array_equal(np.asarray(checks[1][0]).view(np.uint16)[x32 <= 0], 0)
    passed = np.asarray(checks[0][0]).view(np.uint16)
    np.testing.assert_array_equal(passed[x32 > 0], np.asarray(dx).view(np.uint16)[x32 > 0])
    names = [c["name"] for c in emu.launches]
    assert names == ["opgraph_relu_bf16", "opgraph_relu_bwd_bf16", "opgraph_threshold_bf16",
                     "opgraph_threshold_bwd_bf16"]
    assert all(t["T"] == "unsigned short" for t in _kernel_types(emu, "opgraph_"))
    assert casts == []


@needs_gxx
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_relu_in_place_bf16(emu, casts, layout):
    """``out=`` (an in-place step: out is x, or gy) on bfloat16: written
    through its bits, returned as given."""
    rng = np.random.default_rng(16)
    x, gy = _special(rng, (2, 3, 4, 5)), _special(rng, (2, 3, 4, 5))
    x32, gy32 = x.astype(np.float32), gy.astype(np.float32)
    dx, dgy = strict(x, layout), strict(gy, layout)
    g = cuda_relu.relu_backward(np, dx, dgy, out=dgy)
    assert g is dgy
    assert_same_values(g, np.where(x32 > 0, gy32, np.float32(0)))
    y = cuda_relu.relu(np, dx, out=dx)
    assert y is dx and y.dtype == BF16
    assert_same_values(y, np.where((x32 > 0) | np.isnan(x32), x32, np.float32(0)))
    assert casts == []


@needs_gxx
def test_relu_mixed_and_float32_unchanged(emu, casts):
    rng = np.random.default_rng(2)
    x = _special(rng, (3, 7))
    gy = rng.standard_normal((3, 7)).astype(np.float32)
    got = cuda_relu.relu_backward(np, strict(x), gy)  # bf16 mask on a float32 gradient
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.where(x.astype(np.float32) > 0, gy, 0))
    f = _special(rng, (3, 7)).astype(np.float32)
    np.testing.assert_array_equal(cuda_relu.relu(np, f), np.where((f > 0) | np.isnan(f), f, 0))
    assert [c["name"] for c in emu.launches] == ["opgraph_relu_bwd_bf16", "opgraph_relu"]
    assert emu.launches[1]["preamble"] == cuda_storage.storage_preamble("float32")
    assert emu.launches[0]["types"] == {"T": "unsigned short", "G": "float"}
    assert casts == []


@needs_gxx
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_float_dtypes_keep_their_results(emu, dtype):
    """float16/32/64 through the same (macro) kernel text: exactly the
    reference's selects and pooling maxima, and no bf16 tag or conversion."""
    from opgraph.backends.reference import elementwise as ref_ew
    rng = np.random.default_rng(15)
    x = _special(rng, (2, 3, 5, 6)).astype(dtype)
    gy = rng.standard_normal(x.shape).astype(dtype)
    for layout in ("NCHW", "NHWC"):
        dx, dgy = (channels_last(x), channels_last(gy)) if layout == "NHWC" else (x, gy)
        for got, want in [(cuda_relu.relu(np, dx), ref_ew.relu(np, x)),
                          (cuda_relu.relu_backward(np, dx, dgy), ref_ew.relu_backward(np, x, gy)),
                          (cuda_relu.threshold(np, dx, threshold=0.5, value=1e-3),
                           ref_ew.threshold(np, x, threshold=0.5, value=1e-3)),
                          (cuda_relu.threshold_backward(np, dx, dgy, threshold=0.5),
                           ref_ew.threshold_backward(np, x, gy, threshold=0.5))]:
            assert got.dtype == dtype and got.strides == dx.strides
            np.testing.assert_array_equal(got, want)
        kw = pool_kwargs(POOL_CASES[1])
        y = cuda_pool.max_pool2d(np, dx, **kw)
        assert y.dtype == dtype
        np.testing.assert_array_equal(y, ref_pool.max_pool2d(np, x, **kw))
    assert not any("bf16" in c["name"] or "bf16" in c["preamble"] for c in emu.launches)


# ------------------------------------------------------------------ pooling

#: (x shape, kernel_size, stride, padding, ceil_mode): H*W <= 256, so the
#: cell codes of the select check are exact in bfloat16.
POOL_CASES = [
    ((2, 3, 7, 9), (3, 3), (2, 2), ((0, 0), (0, 0)), False),   # overlapping windows
    ((2, 3, 8, 7), (3, 2), (2, 3), ((1, 0), (1, 1)), True),    # asymmetric padding, ceil overhang
    ((1, 4, 6, 6), (2, 2), (2, 2), ((0, 0), (0, 0)), False),   # tiling windows
]


@needs_gxx
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("kind", ["normal", "ties", "nan", "neg_inf", "signed_zero"])
@pytest.mark.parametrize("case", POOL_CASES)
def test_max_pool_bf16(emu, casts, case, kind, layout):
    rng = np.random.default_rng(3)
    kw = pool_kwargs(case)
    x = pool_input(rng, case[0], kind)
    x64 = x.astype(np.float64)
    y = cuda_pool.max_pool2d(np, strict(x, layout), **kw)
    y_ref = ref_pool.max_pool2d(np, x64, **kw)
    assert y.dtype == BF16 and is_channels_last(y) == (layout == "NHWC")
    assert_same_values(y, y_ref)  # exact, NaN where the reference has NaN, -inf windows -inf
    # argmax exactly: the select reads the winning cell's code
    codes = cell_codes(x.shape)
    sel = cuda_pool.max_pool2d_select(np, strict(x, layout), strict(codes, layout), **kw)
    assert_same_values(sel, ref_pool.max_pool2d_select(np, x64, codes.astype(np.float64), **kw))
    gy = bf16(rng.standard_normal(y_ref.shape))
    gx = cuda_pool.max_pool2d_backward(np, strict(x, layout), strict(gy, layout), **kw)
    assert_within_ulp(gx, ref_pool.max_pool2d_backward(np, x64, gy.astype(np.float64), **kw))
    assert np.isfinite(f64(gx)).all()
    gxr = cuda_pool.max_pool2d_backward_relu(np, strict(x, layout), strict(gy, layout), **kw)
    assert_within_ulp(gxr, ref_pool.max_pool2d_backward_relu(np, x64, gy.astype(np.float64), **kw))
    for t in _kernel_types(emu, "opgraph_maxpool"):
        assert t["T"] == "unsigned short"
    assert {c["name"] for c in emu.launches} == {
        "opgraph_maxpool_bf16_i32", "opgraph_maxpool_arg_bf16_i32", "opgraph_maxpool_select_bf16_i32",
        "opgraph_maxpool_bwd_bf16_i32", "opgraph_maxpool_arg_relu_bf16_i32"}
    assert casts == []


@needs_gxx
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("include_pad", [True, False])
@pytest.mark.parametrize("case", POOL_CASES[:2])
def test_avg_pool_bf16(emu, casts, case, include_pad, layout):
    rng = np.random.default_rng(4)
    kw = dict(pool_kwargs(case), count_include_pad=include_pad)
    x = bf16(rng.standard_normal(case[0]))
    y = cuda_pool.avg_pool2d(np, strict(x, layout), **kw)
    y_ref = ref_pool.avg_pool2d(np, x.astype(np.float64), **kw)
    assert_within_ulp(y, y_ref)  # float32 sum of <= 9 values, one rounding
    gy = bf16(rng.standard_normal(y_ref.shape))
    gx = cuda_pool.avg_pool2d_backward(np, strict(gy, layout), **kw, input_shape=x.shape)
    assert gx.shape == x.shape and gx.strides == strict(x, layout).strides
    assert_within_ulp(gx, ref_pool.avg_pool2d_backward(np, gy.astype(np.float64), **kw, input_shape=x.shape))
    assert casts == []


@needs_gxx
def test_pool_bf16_specialized_and_64_bit_indexing(emu, casts, monkeypatch):
    """Geometry compiled in, and 64-bit indices (forced by a low limit): same results."""
    rng = np.random.default_rng(5)
    case = POOL_CASES[1]
    kw = pool_kwargs(case)
    x = pool_input(rng, case[0], "nan")
    gy = bf16(rng.standard_normal(ref_pool.max_pool2d(np, x.astype(np.float64), **kw).shape))
    want = ref_pool.max_pool2d_backward_relu(np, x.astype(np.float64), gy.astype(np.float64), **kw)
    assert_within_ulp(cuda_pool.max_pool2d_backward_relu(np, strict(x, "NHWC"), strict(gy, "NHWC"), **kw,
                                                         specialize=True), want)
    monkeypatch.setattr(cuda_pool, "_INT32_LIMIT", 10)
    assert_within_ulp(cuda_pool.max_pool2d_backward_relu(np, strict(x), strict(gy), **kw), want)
    assert [c["name"] for c in emu.launches] == [
        "opgraph_maxpool_arg_relu_bf16_const_i32", "opgraph_maxpool_bwd_bf16_const_i32",
        "opgraph_maxpool_arg_relu_bf16_i64", "opgraph_maxpool_bwd_bf16_i64"]
    assert casts == []


@needs_gxx
def test_pool_float32_still_runs_its_own_kernels(emu):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 3, 7, 9)).astype(np.float32)
    kw = pool_kwargs(POOL_CASES[0])
    np.testing.assert_array_equal(cuda_pool.max_pool2d(np, x, **kw), ref_pool.max_pool2d(np, x, **kw))
    (call,) = emu.launches
    assert call["name"] == "opgraph_maxpool_i32" and call["types"] == {"T": "float"}
    assert call["preamble"].startswith("typedef int IDX;\n" + cuda_storage.storage_preamble("float32"))


@needs_gxx
def test_store_rounds_ties_to_even(emu, casts):
    """avg of (1, 1 + 2^-7) = 1 + 2^-8: halfway, rounds to 1 (even); avg of
    (1 + 2^-7, 1 + 2^-6) = 1 + 3*2^-8: halfway, rounds to 1 + 2^-6 (even)."""
    x = bf16([[[[1.0, 1 + 2 ** -7, 1 + 2 ** -7, 1 + 2 ** -6]]]])
    y = cuda_pool.avg_pool2d(np, strict(x), kernel_size=(1, 2), stride=(1, 2), padding=0, ceil_mode=False,
                             count_include_pad=True)
    np.testing.assert_array_equal(f64(y).ravel(), [1.0, 1 + 2 ** -6])
    assert casts == []


# ------------------------------------------------------------------ LRN

@needs_gxx
@pytest.mark.parametrize("shape,layout", [((2, 7, 5, 6), "NCHW"), ((2, 7, 5, 6), "NHWC"),
                                          ((3, 6, 5), "NCHW")])
def test_lrn_bf16(emu, casts, shape, layout):
    rng = np.random.default_rng(7)
    kw = dict(size=5, alpha=1e-2, beta=0.75, k=2.0)
    x, gy = bf16(rng.standard_normal(shape) * 3), bf16(rng.standard_normal(shape))
    dev = (lambda a: strict(a, layout)) if len(shape) == 4 else \
        (lambda a: np.ascontiguousarray(a).view(StrictBf16))
    y = cuda_lrn.local_response_norm(np, dev(x), **kw)
    assert y.strides == dev(x).strides
    assert_within_ulp(y, ref_lrn.local_response_norm(np, x.astype(np.float64), **kw))
    gx = cuda_lrn.local_response_norm_backward(np, dev(x), dev(gy), **kw)
    assert gx.dtype == BF16 and gx.strides == dev(x).strides
    want = ref_lrn.local_response_norm_backward(np, x.astype(np.float64), gy.astype(np.float64), **kw)
    assert rel_err(gx, want) < 1e-2
    assert_within_ulp(gx, want, ulps=4)  # each term is rounded once; cancellation costs a few ulps at most
    bwd = [c for c in emu.launches if c["name"].startswith("opgraph_lrn_bwd")]
    assert [c["types"] for c in bwd] == [{"T": "unsigned short", "A": "float"}] * 2  # float32 intermediates
    assert casts == []


# ------------------------------------------------------------------ softmax family, cross-entropy

@needs_gxx
@pytest.mark.parametrize("shape,axis", [((8, 10), 1), ((2, 5, 3, 4), 1), ((3, 4, 6), 0)])
@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
def test_softmax_family_bf16(emu, casts, fn, shape, axis):
    rng = np.random.default_rng(8)
    x, gy = bf16(rng.standard_normal(shape) * 4), bf16(rng.standard_normal(shape))
    fwd, bwd = getattr(cuda_loss, fn), getattr(cuda_loss, fn + "_backward")
    y = fwd(np, strict(x), axis=axis)
    assert_within_ulp(y, getattr(ref_loss, fn)(np, x.astype(np.float64), axis=axis))
    y_in = bf16(getattr(ref_loss, fn)(np, x.astype(np.float64), axis=axis))
    gx = bwd(np, strict(y_in), strict(gy), axis=axis)
    want = getattr(ref_loss, fn + "_backward")(np, y_in.astype(np.float64), gy.astype(np.float64), axis=axis)
    assert gx.dtype == BF16 and rel_err(gx, want) < 1e-2
    assert casts == []


@needs_gxx
@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
def test_softmax_bf16_edges(emu, fn):
    x = bf16([[1e30, -1e30, 0.0], [-np.inf, -np.inf, -np.inf], [1.0, np.nan, 2.0], [3.0, 3.0, 3.0]])
    got = getattr(cuda_loss, fn)(np, strict(x), axis=1)
    with np.errstate(invalid="ignore"):  # the reference's all -inf row
        want = getattr(ref_loss, fn)(np, x.astype(np.float64), axis=1)
    assert_within_ulp(got, want)
    g = f64(got)
    assert np.isfinite(g[0]).all() and np.isnan(g[1]).all() and np.isnan(g[2]).all()


@needs_gxx
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy_bf16(emu, casts, reduction):
    rng = np.random.default_rng(9)
    n, c = 16, 10
    logits = bf16(rng.standard_normal((n, c)) * 5)
    logits[0, 0] = 3e38  # huge logit stays finite
    target = rng.integers(0, c, n).astype(np.int64)
    gy = bf16(np.float32(rng.standard_normal())).reshape(())
    loss = cuda_loss.cross_entropy(np, strict(logits), target, reduction=reduction)
    assert loss.shape == () and loss.dtype == BF16
    assert_within_ulp(loss, ref_loss.cross_entropy(np, logits.astype(np.float64), target,
                                                   reduction=reduction))
    g = cuda_loss.cross_entropy_backward(np, strict(logits), target, gy.view(StrictBf16), reduction=reduction)
    want = ref_loss.cross_entropy_backward(np, logits.astype(np.float64), target, gy.astype(np.float64),
                                           reduction=reduction)
    assert g.dtype == BF16 and rel_err(g, want) < 1e-2
    assert_within_ulp(g, want, ulps=2)
    assert casts == [("float_to_bf16_bits", 1)]  # only the scalar loss is rounded outside a row kernel
    assert [t["A"] for t in _kernel_types(emu, "opgraph_ce_")] == ["float"] * 3  # float32 lse / loss


@needs_gxx
def test_mixed_dtypes_convert_the_odd_operand_and_empty_inputs(emu, casts):
    """A float32 gradient for a bfloat16 forward value is converted to
    bfloat16 (one pass, the only one), and the result is bfloat16; empty
    inputs come back as bfloat16 copies without a kernel."""
    rng = np.random.default_rng(14)
    y = bf16(ref_loss.softmax(np, rng.standard_normal((4, 6)), axis=1))
    gy = rng.standard_normal((4, 6)).astype(np.float32)
    gx = cuda_loss.softmax_backward(np, strict(y), gy, axis=1)
    want = ref_loss.softmax_backward(np, y.astype(np.float64), bf16(gy).astype(np.float64), axis=1)
    assert gx.dtype == BF16 and rel_err(gx, want) < 1e-2
    x = bf16(rng.standard_normal((2, 4, 3, 3)))
    g = cuda_lrn.local_response_norm_backward(np, strict(x), rng.standard_normal(x.shape).astype(np.float32),
                                        size=3, alpha=1e-2, beta=0.75, k=2.0)
    assert g.dtype == BF16
    assert casts == [("float_to_bf16_bits", 24), ("float_to_bf16_bits", x.size)]
    launched = len(emu.launches)
    e = bf16(np.zeros((0, 4, 3, 3)))
    assert cuda_lrn.local_response_norm(np, strict(e), size=3, alpha=1e-2, beta=0.75, k=2.0).dtype == BF16
    assert cuda_loss.softmax(np, strict(e), axis=1).dtype == BF16
    assert cuda_loss.cross_entropy(np, strict(bf16(np.zeros((0, 3)))), np.zeros(0, np.int64),
                                   reduction="mean").dtype == BF16
    assert len(emu.launches) == launched  # empty: no kernel


# ------------------------------------------------------------------ bias gradient

def _bias_want(gy):
    return gy.astype(np.float64).sum(axis=(0, *range(2, gy.ndim)))


@needs_gxx
@pytest.mark.parametrize("c", [1, 3, 33])
@pytest.mark.parametrize("nhw", [(2, 3, 5), (3, 20, 21)])  # M = 30: one pass; 1260: two passes
def test_bias_grad_bf16_channels_last(emu, casts, c, nhw):
    n, h, w = nhw
    gy = bf16(np.random.default_rng(c).standard_normal((n, c, h, w)))
    got = cuda_colsum.bias_add_backward(np, strict(gy, "NHWC"))
    assert got.shape == (c,)
    assert_within_ulp(got, _bias_want(gy))
    names = [x["name"] for x in emu.raw_launches]
    if c == 1:  # also NCHW-contiguous: the NCHW path
        assert names == ["opgraph_rowsum", "opgraph_colsum_final"]
    else:
        assert names == (["opgraph_colsum_direct"] if n * h * w <= 64 else
                         ["opgraph_colsum_part", "opgraph_colsum_final"])
        if len(names) == 2:
            assert emu.raw_launches[0]["args"][1].dtype == np.float32  # float32 partial sums
    assert emu.raw_launches[0]["args"][0].dtype == np.uint16  # the bits, not a float copy
    assert casts == []


@needs_gxx
@pytest.mark.parametrize("shape", [(3, 5, 4, 6), (2, 7, 1, 257), (4, 16, 20, 30), (2, 3, 9)])
def test_bias_grad_bf16_nchw_rows_then_columns(emu, casts, shape):
    gy = bf16(np.random.default_rng(10).standard_normal(shape))
    got = cuda_colsum.bias_add_backward(np, strict(gy))
    assert_within_ulp(got, _bias_want(gy))
    rows, final = emu.raw_launches
    assert rows["name"] == "opgraph_rowsum" and final["name"] == "opgraph_colsum_final"
    n, c = shape[:2]
    src, part, nrows, length = rows["args"]
    assert src.dtype == np.uint16 and part.dtype == np.float32 and part.shape == (n * c,)
    assert (nrows, length) == (n * c, int(np.prod(shape[2:])))
    assert final["args"][0] is part and final["args"][2:] == (n, c, n) and final["grid"] == (-(-c // 32), 1)
    assert casts == []


@needs_gxx
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shape", [(3, 5, 4, 6), (2, 40, 1, 257), (2, 3, 9), (6, 40, 1, 1)])
def test_large_nchw_bias_grad_of_every_dtype_runs_rows_then_columns(emu, monkeypatch, dtype, shape):
    """From ``BIAS_GRAD_SUM_BELOW`` elements (0 here) an NCHW bias gradient of
    any dtype takes the bfloat16 path's kernels, not cuBLAS products (CuPy
    refuses those during CUDA-graph stream capture, and the cuda rule declares
    itself capturable): partials in the accumulator type, one rounding."""
    monkeypatch.setattr(cuda_colsum, "BIAS_GRAD_SUM_BELOW", 0)
    gy = np.random.default_rng(13).standard_normal(shape).astype(dtype)
    got = cuda_colsum.bias_add_backward(np, gy)
    want = gy.astype(np.float64).sum(axis=(0, *range(2, gy.ndim)))
    assert got.dtype == dtype and got.shape == (shape[1],)
    tol = {np.float16: 2e-3, np.float32: 1e-6, np.float64: 1e-12}[dtype]
    assert np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want) < tol
    n, c = shape[:2]
    length = int(np.prod(shape[2:]))
    if length == 1:  # an (N, C) matrix: the column kernel alone
        assert [x["name"] for x in emu.raw_launches] == ["opgraph_colsum_direct"]
        return
    rows, final = emu.raw_launches
    assert rows["name"] == "opgraph_rowsum" and final["name"] == "opgraph_colsum_final"
    src, part, nrows, ncols = rows["args"]
    assert src.dtype == dtype and (nrows, ncols) == (n * c, length)
    assert part.dtype == (np.float64 if dtype == np.float64 else np.float32) and part.shape == (n * c,)
    assert final["args"][0] is part and final["args"][1] is got and final["args"][2:] == (n, c, n)


@needs_gxx
def test_bias_grad_bf16_matrices_empty_and_gemv(emu, casts):
    rng = np.random.default_rng(11)
    for shape in [(7, 5), (6, 40, 1, 1)]:  # no spatial extent: an (N, C) matrix for the column kernel
        gy = bf16(rng.standard_normal(shape))
        assert_within_ulp(cuda_colsum.bias_add_backward(np, strict(gy)), _bias_want(gy))
    assert [x["name"] for x in emu.raw_launches] == ["opgraph_colsum_direct"] * 2
    empty = cuda_colsum.bias_add_backward(np, strict(bf16(np.zeros((0, 4, 2, 2))), "NHWC"))
    assert empty.dtype == BF16 and empty.shape == (4,) and not f64(empty).any()
    assert not f64(cuda_colsum.column_sums(np, bf16(np.zeros((0, 3))).view(StrictBf16))).any()
    assert casts == []
    gy = bf16(rng.standard_normal((3, 33, 20, 21)))
    got = cuda_colsum.bias_add_backward(np, strict(gy, "NHWC"), method="gemv")  # the cuBLAS variant converts
    assert got.dtype == BF16
    assert_within_ulp(got, _bias_want(gy))
    assert [name for name, _ in casts] == ["bf16_bits_to_float", "float_to_bf16_bits"]


@needs_gxx
def test_column_sums_bf16_over_many_rows(emu, casts):
    """Pass 1 in 512 chunks; pass 2 rounds once (float32 partials)."""
    a = bf16(np.random.default_rng(12).standard_normal((40000, 35)))
    got = cuda_colsum.column_sums(np, a.view(StrictBf16))
    assert_within_ulp(got, a.astype(np.float64).sum(0))
    part, final = emu.raw_launches
    assert part["grid"] == (2, cuda_colsum.colsum_grid(40000, 35)[0]) and part["args"][1].dtype == np.float32
    assert final["args"][1].dtype == np.uint16


# ------------------------------------------------------------------ the CUDA text compiles

@pytest.mark.skipif(NVCC is None, reason="no nvcc")
def test_cuda_text_of_every_bf16_kernel_compiles(monkeypatch):
    """Everything the bfloat16 (and float32) paths launch, as CUDA, through
    ``nvcc -ptx`` for the H200 (sm_90), with the column/row modules (the
    kernels are recorded, not run: no g++ needed)."""
    with cupy_replaced(monkeypatch, ReplayModules(run=False), *CACHES) as emu:
        _launch_every_kernel(emu)


def _launch_every_kernel(emu):
    rng = np.random.default_rng(13)
    x = bf16(rng.standard_normal((2, 3, 6, 6)))
    kw = pool_kwargs(POOL_CASES[2])
    for a in (strict(x), x.astype(np.float32)):
        cuda_relu.relu(np, a), cuda_relu.relu_backward(np, a, a), cuda_relu.threshold(np, a, threshold=0.1, value=0.0)
        cuda_relu.threshold_backward(np, a, a, threshold=0.1)
        cuda_lrn.local_response_norm(np, a, size=3, alpha=1e-2, beta=0.75, k=2.0)
        cuda_lrn.local_response_norm_backward(np, a, a, size=3, alpha=1e-2, beta=0.75, k=2.0)
        for spec in (False, True):
            cuda_pool.max_pool2d(np, a, **kw, specialize=spec)
            cuda_pool.max_pool2d_backward_relu(np, a, a[:, :, ::2, ::2], **kw, specialize=spec)
            cuda_pool.max_pool2d_select(np, a, a, **kw, specialize=spec)
            cuda_pool.avg_pool2d(np, a, **kw, count_include_pad=True, specialize=spec)
            cuda_pool.avg_pool2d_backward(np, a[:, :, ::2, ::2], **kw, count_include_pad=False,
                                          input_shape=a.shape, specialize=spec)
        m = a.reshape(18, 12)
        cuda_loss.softmax_backward(np, cuda_loss.softmax(np, m, axis=1), m, axis=1)
        cuda_loss.log_softmax_backward(np, cuda_loss.log_softmax(np, m, axis=1), m, axis=1)
        t = np.arange(18) % 12
        cuda_loss.cross_entropy_backward(np, m, t, m[0, :1].reshape(()), reduction="mean")
    cuda_storage.bf16_bits_to_float(np, cuda_storage.float_to_bf16_bits(np, np.ones(3, np.float32)))
    names = {k[0] for k in emu.cuda_sources}
    assert len([n for n in names if n.endswith(("_bf16", "_bf16_i32"))]) >= 14
    sources = list(emu.cuda_sources.values())
    sources += [cuda_colsum.colsum_source(d) for d in ("bfloat16", "float16", "float32")]
    sources += [cuda_colsum.rowsum_source(d) for d in ("bfloat16", "float32", "float64")]
    ptx = nvcc_check(sources)
    entries = re.findall(r"\.entry (\w+)\(", ptx)
    assert len(entries) == len(emu.cuda_sources) + 3 * 3 + 3, entries
