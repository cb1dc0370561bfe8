"""The ReLU gradient that writes its per-channel sums (``backends/cuda/colsum_relu.py``) on the CPU,
through the g++ emulator of its CUDA text: bfloat16 and float32, NHWC 4-D (C of one vector, C
over one column tile, C not a multiple of the lanes' tile) and 2-D ``(N, C)``, a pitched gy (a
channel slice of a wider buffer); NaN, infinities and -0.0 in y and gy. ``g`` equals
``relu.relu_backward``'s bit for bit; the sums are within the bias gradient's tolerance of float64,
bit for bit those of ``colsum_vector.column_sums(g)`` (the same order of additions) and the same run
to run. What it declines, the fallback of the node kernel (NCHW, float16, unaligned) giving the
same values, and the ``cuda`` node kernels against the reference rules. The emulator runs threads
one after another, so scheduling is checked on the GPU (tests/gpu/test_relu_bias_sums_gpu.py)."""

from __future__ import annotations

from types import SimpleNamespace

import attrs
import numpy as np
import pytest

import opgraph as og
from codegen_emulated import codegen_emulated, emulated_cuda_executable
from cuda_cpu_emulator import GXX, NVCC, EmulatedCupy, nvcc_check
from cupy_standin import cupy_replaced
from fused_training_steps import pooled, step_failures, training_step
from opgraph import ops
from opgraph.backends.cuda import colsum, colsum_relu, colsum_vector, relu, rules, storage
from opgraph.backends.reference import elementwise as ref_elementwise
from opgraph.backends.registry import KernelContext, rules_for
from opgraph.executable import Executable
from opgraph.types import TensorType, is_channels_last, numpy_dtype

needs_gxx = pytest.mark.skipif(GXX is None, reason="no g++: the kernels' CUDA text cannot run on the CPU")

BF16 = numpy_dtype("bfloat16")
DTYPES = ["bfloat16", "float32"]


@pytest.fixture
def emu(monkeypatch):
    with cupy_replaced(monkeypatch, EmulatedCupy(), colsum_relu._kernel, colsum_vector._kernels,
                       colsum._colsum_kernels, colsum._rowsum_kernel, storage.elementwise_kernel) as e:
        yield e


def out_of_place(exe):
    """The same executable with every step allocating its output (``Step.inplace`` None)."""
    copy = Executable.__new__(Executable)
    copy.__dict__.update(exe.__dict__)
    copy.steps = [attrs.evolve(st, inplace=None) for st in exe.steps]
    return copy


def _values(shape, dtype, seed, special=False):
    """Normal values in ``dtype``; with ``special`` about 1 in 8 replaced by -0.0, +0.0, NaN, +-inf."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape).astype(np.float32)
    if special:
        picks = np.array([-0.0, 0.0, np.nan, np.inf, -np.inf, -0.0], np.float32)
        where = rng.random(shape) < 0.125
        a[where] = picks[rng.integers(0, len(picks), size=int(where.sum()))]
    return a.astype(dtype)


def _nhwc(shape, dtype, seed, special=False, channels=None):
    """A logical ``(N, C, H, W)`` channels-last array; with ``channels`` a slice ``[lo, hi)`` of
    a wider buffer of ``channels[2]`` channels (a pitched view)."""
    n, c, h, w = shape
    if channels is None:
        return _values((n, h, w, c), dtype, seed, special).transpose(0, 3, 1, 2)
    lo, hi, wide = channels
    assert hi - lo == c
    return _values((n, h, w, wide), dtype, seed, special)[..., lo:hi].transpose(0, 3, 1, 2)


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _rows(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1)).reshape(-1, a.shape[1]) if a.ndim == 4 else a


def _check_sums(got, g):
    """got against the float64 column sums of ``g``: the worst case of float32 accumulation of M
    terms (M * 2^-24 of the sum of magnitudes), then one rounding to the storage dtype (half a
    bfloat16 or float16 ulp); NaN exactly where a NaN (or inf - inf) enters the column."""
    r = _rows(g).astype(np.float64)
    with np.errstate(invalid="ignore"):
        exact = r.sum(axis=0)
    scale = np.abs(r).sum(axis=0)
    rounding = {BF16: 2.0 ** -8, np.dtype(np.float16): 2.0 ** -11}.get(g.dtype, 0.0)
    got64 = got.astype(np.float64)
    assert got.dtype == g.dtype and got.shape == (g.shape[1],)
    np.testing.assert_array_equal(np.isnan(got64), np.isnan(exact))
    finite = np.isfinite(exact)
    np.testing.assert_array_equal(got64[~finite], exact[~finite])  # NaN and the infinities
    tol = scale[finite] * r.shape[0] * 2.0 ** -24 + np.abs(exact[finite]) * rounding + 1e-30
    err = np.abs(got64[finite] - exact[finite])
    assert (err <= tol).all(), (err / tol).max()


def _check_fused(emu, y, gy):
    """Run the fused path twice: g bit for bit ``relu.relu_backward``'s (dense channels-last for
    4-D), sums as :func:`_check_sums` and bit for bit ``colsum_vector.column_sums(g)``'s and the
    second run's; two launches (pass 1, colsum_vector's pass 2)."""
    assert colsum_relu.declines(y, gy) is None
    before = len(emu.raw_launches)
    g, sums = colsum_relu.relu_backward_sums(np, y, gy)
    assert [r["name"] for r in emu.raw_launches[before:]] == ["opgraph_colsum_relu_part", "opgraph_colsum_vec_final"]
    want = relu.relu_backward(np, y, gy)
    assert g.dtype == gy.dtype and g.shape == y.shape
    assert is_channels_last(g) or g.ndim == 2 or g.shape[2:] == (1, 1)
    np.testing.assert_array_equal(_bits(g), _bits(want))
    _check_sums(sums, g)
    np.testing.assert_array_equal(_bits(sums), _bits(colsum_vector.column_sums(np, _rows(g))))
    again = colsum_relu.relu_backward_sums(np, y, gy)
    np.testing.assert_array_equal(_bits(again[1]), _bits(sums))
    np.testing.assert_array_equal(_bits(again[0]), _bits(g))
    return g, sums


@needs_gxx
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 8, 3, 5), (3, 64, 7, 9), (2, 1000, 3, 2), (1, 2080, 2, 3)],
                         ids=["C8", "C64", "C1000", "C2080"])
def test_fused_nhwc_equals_relu_backward_and_its_sums(emu, dtype, shape):
    # C=2080 bfloat16: 260 vector columns, two column tiles (256 and 4); C=1000: 125 (bf16) or
    # 250 (fp32) vector columns, thread rows that do not divide the block; (3, 64, 7, 9): several
    # row blocks
    dt = numpy_dtype(dtype)
    _check_fused(emu, _nhwc(shape, dt, 1), _nhwc(shape, dt, 2))


@needs_gxx
@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_inf_and_signed_zeros(emu, dtype):
    """A NaN or -0.0 y blocks (g +0.0), a NaN gy at an open lane propagates into g and its
    channel's sum, a -0.0 gy at an open lane stays -0.0 in g; infinities sum to inf (or NaN)."""
    dt = numpy_dtype(dtype)
    shape = (2, 16, 5, 6)
    y, gy = _nhwc(shape, dt, 3, special=True), _nhwc(shape, dt, 4, special=True)
    y.transpose(0, 2, 3, 1)[0, 0, 0, :4] = np.array([np.nan, -0.0, 1.0, 1.0], np.float32).astype(dt)
    gy.transpose(0, 2, 3, 1)[0, 0, 0, :4] = np.array([np.nan, 5.0, np.nan, -0.0], np.float32).astype(dt)
    y.transpose(0, 2, 3, 1)[:, :, :, 5] = 1.0  # channel 5 open everywhere, ...
    gy.transpose(0, 2, 3, 1)[:, :, :, 5] = 0.5  # ... finite
    g, sums = _check_fused(emu, y, gy)
    lane = _bits(g.transpose(0, 2, 3, 1)[0, 0, 0, :4])
    zero, neg_zero = 0, (0x8000 if dtype == "bfloat16" else 0x80000000)
    assert lane[0] == zero and lane[1] == zero and lane[3] == neg_zero and np.isnan(np.float32(g[0, 2, 0, 0]))
    assert np.isnan(np.float32(sums[2])) and float(sums[5]) == 0.5 * 2 * 5 * 6


@needs_gxx
@pytest.mark.parametrize("dtype", DTYPES)
def test_pitched_gy_and_y(emu, dtype):
    """gy a 16-byte-aligned channel slice of a wider buffer (a concatenated gradient's), y dense;
    then both pitched (y a slice of another buffer)."""
    dt = numpy_dtype(dtype)
    v = colsum_vector.LANES[dtype]
    shape = (2, 4 * v, 5, 3)
    gy = _nhwc(shape, dt, 5, channels=(2 * v, 6 * v, 9 * v))
    assert colsum_relu.rows(gy).strides[0] == 9 * v * gy.itemsize and not is_channels_last(gy)
    _check_fused(emu, _nhwc(shape, dt, 6), gy)
    _check_fused(emu, _nhwc(shape, dt, 7, channels=(v, 5 * v, 7 * v)), gy)


@needs_gxx
@pytest.mark.parametrize("dtype", DTYPES)
def test_two_dimensional_rows(emu, dtype):
    """``(N, C)`` (a linear layer's gradient), dense and a pitched column slice."""
    dt = numpy_dtype(dtype)
    _check_fused(emu, _values((37, 24), dt, 8, special=True), _values((37, 24), dt, 9, special=True))
    wide = _values((300, 64), dt, 10)
    _check_fused(emu, _values((300, 32), dt, 11), wide[:, 16:48])


def _check_in_place(emu, y, gy):
    """The fused path with ``out=gy`` (an in-place step): g is gy's array, its bits and the sums'
    those of the same call out of place on copies; pass 1 ran the source without
    ``__restrict__`` (g is gy's buffer: ``colsum_relu.source(aliased=True)``)."""
    want_g, want_sums = colsum_relu.relu_backward_sums(np, y.copy(order="K"), gy.copy(order="K"))
    dtype = storage.dtype_name(gy.dtype)
    before = len(emu.raw_launches)
    g, sums = colsum_relu.relu_backward_sums(np, y, gy, out=gy)
    part = emu.raw_launches[before]
    assert part["name"] == "opgraph_colsum_relu_part" and part["source"] == colsum_relu.source(dtype, aliased=True)
    assert "__restrict__ y" not in part["source"] and "__restrict__ y" in colsum_relu.source(dtype)
    assert g is gy
    np.testing.assert_array_equal(_bits(g), _bits(want_g))
    np.testing.assert_array_equal(_bits(sums), _bits(want_sums))
    _check_sums(sums, want_g)


@needs_gxx
@pytest.mark.parametrize("dtype", DTYPES)
def test_in_place_into_gy_gives_the_same_bits(emu, dtype):
    """gy overwritten by g (``out=gy``): dense NHWC with NaN, infinities and signed zeros, 2-D,
    a pitched gy (g written through gy's row pitch, the channels beside it untouched) and y
    itself as gy (``ReluBackward(y, y)``: a ReLU output passed back as its own gradient)."""
    dt = numpy_dtype(dtype)
    v = colsum_vector.LANES[dtype]
    _check_in_place(emu, _nhwc((2, 24, 5, 3), dt, 20, special=True), _nhwc((2, 24, 5, 3), dt, 21, special=True))
    _check_in_place(emu, _values((37, 16), dt, 22), _values((37, 16), dt, 23))
    wide = _nhwc((2, 9 * v, 5, 3), dt, 24, channels=(0, 9 * v, 9 * v))
    gy = wide[:, 2 * v:6 * v]
    outside = _bits(wide[:, :2 * v]).copy(), _bits(wide[:, 6 * v:]).copy()
    _check_in_place(emu, _nhwc((2, 4 * v, 5, 3), dt, 25), gy)
    np.testing.assert_array_equal(_bits(wide[:, :2 * v]), outside[0])
    np.testing.assert_array_equal(_bits(wide[:, 6 * v:]), outside[1])
    y = _nhwc((2, 16, 4, 4), dt, 26, special=True)
    _check_in_place(emu, y, y)


@needs_gxx
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_separate_out_keeps_restrict_and_gy_as_a_new_view_is_in_place(emu, dtype):
    """An ``out`` sharing no memory with y or gy is written through the ``__restrict__`` source
    (``colsum_relu.source(aliased=False)``, no second module); gy's memory as another view
    (``gy[:]``: its first element and strides) is still the in-place step."""
    dt = numpy_dtype(dtype)
    y, gy = _nhwc((2, 24, 5, 3), dt, 40, special=True), _nhwc((2, 24, 5, 3), dt, 41, special=True)
    want_g, want_sums = colsum_relu.relu_backward_sums(np, y, gy)
    out = _nhwc((2, 24, 5, 3), dt, 42)
    before = len(emu.raw_launches)
    g, sums = colsum_relu.relu_backward_sums(np, y, gy, out=out)
    assert g is out and emu.raw_launches[before]["source"] == colsum_relu.source(dtype)
    np.testing.assert_array_equal(_bits(g), _bits(want_g))
    np.testing.assert_array_equal(_bits(sums), _bits(want_sums))
    assert not colsum_relu.out_is_gy(np, y, gy, out) and not colsum_relu.out_is_gy(np, y, gy, None)
    before = len(emu.raw_launches)
    view = gy[:]
    g, _ = colsum_relu.relu_backward_sums(np, y, gy, out=view)
    assert g is view and emu.raw_launches[before]["source"] == colsum_relu.source(dtype, aliased=True)
    np.testing.assert_array_equal(_bits(gy), _bits(want_g))


def _rows_in(buf, offset, pitch, shape):
    """``(M, C)`` rows of ``buf``'s flat elements from ``offset``, ``pitch`` elements apart."""
    flat = buf.reshape(-1)[offset:]
    return np.lib.stride_tricks.as_strided(flat, shape, (pitch * buf.itemsize, buf.itemsize))


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_out_that_partly_overlaps_y_or_gy_is_refused(dtype):
    """``out`` is gy's memory or shares none with y or gy: rows of gy's buffer at another pitch, gy's
    rows one vector on, y's memory (not gy's), or gy's while y partly overlaps it, would race
    (a thread storing where another has yet to load): a ValueError naming the array, before any
    launch (no emulator here: a launch would fail on the missing cupy)."""
    dt = numpy_dtype(dtype)
    v = colsum_vector.LANES[dtype]
    m, c = 12, 4 * v
    buf = _values((4 * m * c,), dt, 43)
    y = _values((m, c), dt, 44)
    gy = _rows_in(buf, 0, c, (m, c))
    for out, name in [(_rows_in(buf, 0, 2 * c, (m, c)), "gy"),  # gy's first row, then twice its pitch
                      (_rows_in(buf, v, c, (m, c)), "gy"),  # gy's rows one 16-byte vector on
                      (y, "y")]:  # y's own memory: only gy's is the in-place step
        assert colsum_relu.declines(y, out) is None
        with pytest.raises(ValueError, match=f"out overlaps {name} without being gy's own memory"):
            colsum_relu.relu_backward_sums(np, y, gy, out=out)
        if name == "gy":  # the same rows overlapping y, gy apart
            with pytest.raises(ValueError, match="out overlaps y without"):
                colsum_relu.relu_backward_sums(np, gy, y, out=out)
    y_over_gy = _rows_in(buf, 2 * c, c, (m, c))  # gy's rows from its third on
    with pytest.raises(ValueError, match="out is gy's memory, which y partly overlaps"):
        colsum_relu.relu_backward_sums(np, y_over_gy, gy, out=gy)


@needs_gxx
@pytest.mark.parametrize("dtype", DTYPES)
def test_an_out_interleaved_with_y_or_gy_but_sharing_no_element_is_taken(emu, dtype):
    """Two channel slices of one NHWC buffer share no element, though their byte ranges
    interleave (each pixel holds both): ``out`` may be one while gy or y is the other, and gy
    may be written in place while y is the other slice of its buffer. The bounds' test refused
    them; g and the sums are those of copies, and the other slice is left as it was."""
    dt = numpy_dtype(dtype)
    v = colsum_vector.LANES[dtype]
    shape = (2, 4 * v, 5, 3)
    gy = _nhwc(shape, dt, 50, channels=(0, 4 * v, 8 * v))
    beside = gy.base[..., 4 * v:].transpose(0, 3, 1, 2)  # the buffer's other channels
    y = _nhwc(shape, dt, 51, special=True)
    assert np.may_share_memory(gy, beside) and not np.shares_memory(gy, beside)
    want_g, want_sums = colsum_relu.relu_backward_sums(np, y, gy.copy(order="K"))
    kept = _bits(gy).copy()
    g, sums = colsum_relu.relu_backward_sums(np, y, gy, out=beside)  # out beside gy
    assert g is beside and not colsum_relu.out_is_gy(np, y, gy, beside)
    np.testing.assert_array_equal(_bits(g), _bits(want_g))
    np.testing.assert_array_equal(_bits(sums), _bits(want_sums))
    np.testing.assert_array_equal(_bits(gy), kept)
    want_g, want_sums = colsum_relu.relu_backward_sums(np, beside.copy(order="K"), y)
    g, sums = colsum_relu.relu_backward_sums(np, beside, y, out=gy)  # out gy's slice, y the other one
    assert g is gy
    np.testing.assert_array_equal(_bits(g), _bits(want_g))
    np.testing.assert_array_equal(_bits(sums), _bits(want_sums))
    y2 = beside.copy(order="K")
    want_g, want_sums = colsum_relu.relu_backward_sums(np, y2, gy.copy(order="K"))
    g, sums = colsum_relu.relu_backward_sums(np, beside, gy, out=gy)  # in place, y the other slice
    assert g is gy and colsum_relu.out_is_gy(np, beside, gy, gy)
    assert emu.raw_launches[-2]["source"] == colsum_relu.source(dtype, aliased=True)
    np.testing.assert_array_equal(_bits(g), _bits(want_g))
    np.testing.assert_array_equal(_bits(sums), _bits(want_sums))
    np.testing.assert_array_equal(_bits(beside), _bits(y2))


def _random_view(rng, buf):
    """A view of ``buf`` (1-D): reshaped, then sliced with random starts, stops and steps
    (negative ones included), axes swapped, and now and then an axis of stride 0."""
    a = buf[int(rng.integers(0, 3)):][:48].reshape(4, 3, 4)
    a = a[tuple(slice(int(rng.integers(0, n)), None, int(rng.choice([-2, -1, 1, 2]))) for n in a.shape)]
    a = a.transpose(rng.permutation(3))
    if rng.random() < 0.3:
        axis = int(rng.integers(0, 3))
        a = np.lib.stride_tricks.as_strided(a, a.shape[:axis] + (3,) + a.shape[axis + 1:],
                                            a.strides[:axis] + (0,) + a.strides[axis + 1:])
    return a


def test_shares_memory_is_numpys_exact_answer_on_numpy_and_device_views():
    """``colsum_relu.shares_memory`` against ``numpy.shares_memory`` on random pairs of views of one
    buffer (negative steps, stride 0, an offset of one element or one byte), on the arrays and on
    stand-ins that give only what a CuPy array does (``data.ptr``, shape, strides, itemsize):
    the same answer every time, including pairs whose bounds overlap and that share nothing."""
    def device(host):  # what colsum_relu reads of a CuPy array
        return SimpleNamespace(host=host, shape=host.shape, strides=host.strides, itemsize=host.itemsize,
                               size=host.size, data=SimpleNamespace(ptr=host.__array_interface__["data"][0]))

    device_xp = SimpleNamespace(may_share_memory=lambda a, b: np.may_share_memory(a.host, b.host))
    rng = np.random.default_rng(0)
    raw = np.zeros(260, np.uint8)
    seen = set()
    for trial in range(600):
        shift = int(rng.integers(0, 2))  # 1: the second view one byte on, elements misaligned
        a = _random_view(rng, raw[:256].view(np.float32))
        b = _random_view(rng, raw[shift:256 + shift].view(np.float32))
        want = bool(np.shares_memory(a, b))
        assert colsum_relu.shares_memory(np, a, b) == want, (a.strides, b.strides)
        assert colsum_relu.shares_memory(device_xp, device(a), device(b)) == want
        seen.add((bool(np.may_share_memory(a, b)), want))
    assert seen == {(True, True), (True, False), (False, False)}


def test_shares_memory_falls_back_to_the_bounds_when_the_exact_answer_costs_too_much():
    """Beyond ``max_work`` steps the answer is the bounds' (True: the call is refused, never
    wrongly taken); with :data:`colsum_relu.MAX_WORK` this pair is solved, sharing nothing."""
    buf = np.zeros(100_000, np.uint8)
    a = np.lib.stride_tricks.as_strided(buf, (16, 2, 2), (393, 992, 1203))
    b = np.lib.stride_tricks.as_strided(buf[44:], (29, 23, 9), (1032, 1498, 1770))
    assert np.may_share_memory(a, b) and not np.shares_memory(a, b)
    with pytest.raises(np.exceptions.TooHardError):
        np.shares_memory(a, b, max_work=1)
    assert colsum_relu.shares_memory(np, a, b, max_work=1)
    assert not colsum_relu.shares_memory(np, a, b)


@pytest.mark.parametrize("case", ["NHWC", "NCHW"])
def test_the_node_kernel_refuses_an_overlapping_out_on_either_path(case):
    """The node kernel asks before it chooses: the fallback's elementwise kernel (NCHW) would race
    on a partly overlapping ``out`` as the fused one would."""
    shape, layout = CASES[case]
    dt = numpy_dtype("float32")
    n, c, h, w = shape
    if layout == "NHWC":  # gy the first C channels of an (N, H, W, 2C) buffer, out the same rows a vector on
        buf = _values((n, h, w, 2 * c), dt, 45)
        gy = buf[..., :c].transpose(0, 3, 1, 2)
        out = np.lib.stride_tricks.as_strided(buf.reshape(-1)[4:], gy.shape, gy.strides)
    else:  # gy and out dense NCHW, out one vector on in the same buffer
        buf = _values((2 * n * c * h * w,), dt, 45)
        gy, out = buf[:n * c * h * w].reshape(shape), buf[4:4 + n * c * h * w].reshape(shape)
    assert np.shares_memory(out, gy) and (layout == "NCHW" or colsum_relu.declines(gy, out) is None)
    y = _values(shape, dt, 46) if layout == "NCHW" else _nhwc(shape, dt, 46)
    slot_op, op = ops.ReluBackwardSumsSlot(), ops.ReluBackwardSums()
    yt = gt = TensorType(y.shape, "float32", layout)
    st = slot_op.infer(yt, gt)
    sums = np.zeros(st.shape, dt)
    with pytest.raises(ValueError, match="out overlaps gy without being gy's own memory"):
        rules.NODE_KERNELS[ops.ReluBackwardSums](_ctx(op.infer(yt, gt, st)), op, y, gy, sums, out=out)


def test_declines_what_it_cannot_load():
    v = colsum_vector.LANES["bfloat16"]
    y = _nhwc((2, 2 * v, 3, 3), BF16, 0)
    assert colsum_relu.declines(y, y) is None
    nchw = np.ascontiguousarray(y)
    assert "neither 2-D nor 4-D stored channels-last" in colsum_relu.declines(nchw, nchw)
    assert "y (2, 16, 3, 3) and gy" in colsum_relu.declines(y, y[:1])
    assert "differ in dtype" in colsum_relu.declines(y, y.astype(np.float32))
    assert "dtype float16" in colsum_relu.declines(*(2 * [y.astype(np.float16)]))
    assert "dtype float64" in colsum_relu.declines(*(2 * [y.astype(np.float64)]))
    odd = _nhwc((2, 12, 3, 3), BF16, 0)
    assert "not a multiple of 8 lanes" in colsum_relu.declines(odd, odd)
    sliced = _nhwc((2, 16, 3, 3), BF16, 0, channels=(4, 20, 32))  # 8 bytes in: not 16-byte aligned
    assert "gy: the data pointer is not 16-byte aligned" in colsum_relu.declines(y, sliced)
    three = np.zeros((4, 16, 5), BF16)
    assert "neither 2-D" in colsum_relu.declines(three, three)
    assert "no rows" in colsum_relu.declines(*(2 * [np.zeros((0, 16), np.float32)]))
    with pytest.raises(Exception, match="neither 2-D"):
        colsum_relu.relu_backward_sums(np, nchw, nchw)


# ---- the node kernels, emulated, against the reference rules

def _ctx(out_type):
    return KernelContext(np, "cuda", {}, out_type)


def _node_pair(y, gy, layout):
    """The slot's and the filler's ``cuda`` node kernels: ``(g, sums, launch names)``."""
    dtype = storage.dtype_name(gy.dtype)
    slot_op, op = ops.ReluBackwardSumsSlot(), ops.ReluBackwardSums()
    yt, gt = TensorType(y.shape, dtype, layout), TensorType(gy.shape, dtype, layout)
    st = slot_op.infer(yt, gt)
    sums = rules.NODE_KERNELS[ops.ReluBackwardSumsSlot](_ctx(st), slot_op, y, gy)
    assert sums.shape == st.shape and sums.dtype == gy.dtype and sums.flags.c_contiguous
    sums[...] = np.nan  # a value left unwritten shows
    g = rules.NODE_KERNELS[ops.ReluBackwardSums](_ctx(op.infer(yt, gt, st)), op, y, gy, sums)
    return g, sums


def _reference_pair(y, gy):
    """The reference rules of the slot and the filler (on a copy of the slot): ``(g, sums)``."""
    ref_ctx = KernelContext(np, "cpu", {}, None)
    value = rules_for(ops.ReluBackwardSumsSlot)["reference"].kernel(ref_ctx, ops.ReluBackwardSumsSlot(), y, gy)
    sums = np.full_like(value, np.nan)
    g = rules_for(ops.ReluBackwardSums)["reference"].kernel(ref_ctx, ops.ReluBackwardSums(), y, gy, sums)
    np.testing.assert_array_equal(_bits(sums), _bits(value))  # the filler writes the slot's own value
    return g, sums


CASES = {"NHWC": ((2, 24, 4, 5), "NHWC"), "NCHW": ((2, 24, 4, 5), "NCHW"), "2-D": ((20, 24), "NCHW"),
         "NHWC-odd": ((2, 10, 4, 5), "NHWC")}


def _emulable_bias_gradient(monkeypatch, dtype, case):
    """The fallback's bias gradient (``colsum.bias_add_backward``) where the emulator cannot run
    it: float16 loads through PTX ``cvt`` and bfloat16 NCHW row sums through warp shuffles, which
    g++ has not; there the reference sums stand in (the column and row kernels have their own
    tests: test_cuda_colsum_launch.py, tests/gpu), recorded so that the call is still checked."""
    calls = []
    if dtype == "float16" or (dtype == "bfloat16" and case == "NCHW"):
        def standin(xp, g):
            calls.append(g.shape)
            return ref_elementwise.bias_add_backward(xp, g)
        monkeypatch.setattr(colsum, "bias_add_backward", standin)
    return calls


@needs_gxx
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float16"])
def test_the_node_kernels_equal_the_reference_rules(emu, monkeypatch, dtype, case):
    """g bit for bit the reference's; the sums within the bias gradient's tolerance of float64
    as the reference's are; the fused kernels ran exactly where the arrays qualify (bfloat16 or
    float32, channels-last or 2-D, C a multiple of the lanes), the fallback elsewhere, and the
    slot allocated without a launch."""
    shape, layout = CASES[case]
    dt = numpy_dtype(dtype)
    make = (lambda s: _nhwc(shape, dt, s, special=True)) if layout == "NHWC" else (
        lambda s: np.ascontiguousarray(_values(shape, dt, s, special=True)))
    y, gy = make(12), make(13)
    standin = _emulable_bias_gradient(monkeypatch, dtype, case)
    before = len(emu.raw_launches) + len(emu.launches)
    with np.errstate(invalid="ignore"):  # inf - inf in the NumPy sums of the fallback's small arrays
        g, sums = _node_pair(y, gy, layout)
    names = [r["name"] for r in emu.raw_launches + emu.launches][before:]
    with np.errstate(invalid="ignore"):
        want_g, want_sums = _reference_pair(y, gy)
    np.testing.assert_array_equal(_bits(g), _bits(want_g))
    assert g.shape == y.shape and g.dtype == gy.dtype
    fused = dtype != "float16" and case in ("NHWC", "2-D")
    assert ("opgraph_colsum_relu_part" in names) == fused, names
    assert standin in ([], [shape]) and not (fused and standin)
    # against the float64 sums of g, never the reference rule's own sums: where the emulator cannot
    # run the bias gradient's kernels the stand-in is that rule, and would be compared with itself
    _check_sums(sums, want_g)
    assert want_sums.shape == sums.shape


@needs_gxx
@pytest.mark.parametrize("case", ["NHWC", "NCHW"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_node_kernel_writes_into_gy_when_asked(emu, monkeypatch, dtype, case):
    """``out=gy`` (the in-place step the memory pass plans, ``rules.INPLACE``), on the fused path
    and on the fallback (NCHW, float16): gy's own array returned, holding the reference's g bit
    for bit, and the sums within the bias gradient's tolerance of float64 (of g as written)."""
    shape, layout = CASES[case]
    dt = numpy_dtype(dtype)
    make = (lambda s: _nhwc(shape, dt, s, special=True)) if layout == "NHWC" else (
        lambda s: np.ascontiguousarray(_values(shape, dt, s, special=True)))
    y, gy = make(30), make(31)
    standin = _emulable_bias_gradient(monkeypatch, dtype, case)
    with np.errstate(invalid="ignore"):
        want_g, _ = _reference_pair(y, gy.copy(order="K"))
    slot_op, op = ops.ReluBackwardSumsSlot(), ops.ReluBackwardSums()
    yt = gt = TensorType(y.shape, dtype, layout)
    st = slot_op.infer(yt, gt)
    sums = np.full(st.shape, np.nan, dt)
    before = len(emu.raw_launches)
    with np.errstate(invalid="ignore"):
        g = rules.NODE_KERNELS[ops.ReluBackwardSums](_ctx(op.infer(yt, gt, st)), op, y, gy, sums, out=gy)
    assert g is gy and standin in ([], [shape])
    fused = [r["source"] for r in emu.raw_launches[before:] if r["name"] == "opgraph_colsum_relu_part"]
    assert fused == ([colsum_relu.source(dtype, aliased=True)] if dtype != "float16" and case == "NHWC" else [])
    np.testing.assert_array_equal(_bits(g), _bits(want_g))
    _check_sums(sums, want_g)


@needs_gxx
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_training_step_lowered_for_cuda_runs_the_sums_in_place_with_the_same_results(emu, monkeypatch, dtype):
    """``pooled`` lowered for cuda (NHWC, ``relu-bias-sums`` on by default), the two fused nodes
    through their own kernels on the emulator, every other step as the reference rounded to the
    run type: the memory pass has the first ReLU gradient overwrite the pooling's gradient (gy),
    as ``ReluBackward`` would; the run equals the same steps out of place bit for bit and passes
    the training-step criterion against the float64 reference and the unfused compile."""
    outs, feeds, n_grads = training_step(pooled, np.random.default_rng(0))
    ref = og.compile(outs, pipeline="reference", dtype="float64")(**feeds)
    policy = {"layout": "NHWC", "exclude": ["pool-relu-backward"]}
    fused = (ops.ReluBackwardSums, ops.ReluBackwardSumsSlot)
    with codegen_emulated(monkeypatch, emu, colsum_relu._kernel, colsum_vector._kernels):
        exe = emulated_cuda_executable(outs, policy, dtype, kernels=fused)
        off = emulated_cuda_executable(outs, {"layout": "NHWC", "exclude": ["pool-relu-backward", "relu-bias-sums"]},
                                       dtype)
        names = {st.node: st.name for st in exe.steps}
        in_place = {st.name: names[st.writes_into] for st in exe.steps
                    if st.writes_into is not None and st.op.op.name == "ReluBackwardSums"}
        assert in_place == {"relu1.grad/relu_backward": "pool1.grad/max_pool2d_backward"}
        assert all(st.inplace in (None, 1) for st in exe.steps if st.op.op.name == "ReluBackwardSums")
        # no in-place step lost to the fusion: the unfused ReLU gradient overwrote the same gy
        assert sum(st.writes_into is not None for st in exe.steps) == sum(st.writes_into is not None
                                                                         for st in off.steps)
        before = len(emu.raw_launches)
        got = exe(**feeds)
        parts = [r["source"] for r in emu.raw_launches[before:] if r["name"] == "opgraph_colsum_relu_part"]
        assert sorted(parts) == sorted([colsum_relu.source(dtype), colsum_relu.source(dtype, aliased=True)])
        apart = out_of_place(exe)(**feeds)
        unfused = off(**feeds)
    for a, b in zip(got, apart):
        np.testing.assert_array_equal(_bits(a), _bits(b))
    assert not step_failures(got, unfused, ref, n_grads, dtype)


def test_the_slot_allocates_without_a_kernel(emu):
    y = _nhwc((2, 16, 3, 3), BF16, 0)
    op = ops.ReluBackwardSumsSlot()
    kernel = rules.NODE_KERNELS[ops.ReluBackwardSumsSlot]
    typed = kernel(_ctx(TensorType((16,), "float32")), op, y, y)  # the node's dtype (compile's) wins
    untyped = kernel(_ctx(None), op, y, y)
    assert not emu.raw_launches and not emu.launches
    assert typed.dtype == np.float32 and typed.shape == (16,)
    assert untyped.dtype == BF16 and untyped.shape == (16,)


def test_the_rules_register_both_ops_capturable_and_fused():
    for op_type in (ops.ReluBackwardSumsSlot, ops.ReluBackwardSums):
        cuda, ref = rules_for(op_type)["cuda"], rules_for(op_type)["reference"]
        # the ReLU gradient may write into gy (input 1), as ReluBackward does; never into its slot
        want = (1,) if op_type is ops.ReluBackwardSums else ()
        assert cuda.inplace == ref.inplace == want == rules_for(ops.ReluBackward)["cuda"].inplace[:len(want)]
        assert cuda.capturable is True and cuda.fresh_output
        assert {"fused", "cuda", "gpu"} <= cuda.tags and "fused" in ref.tags
        assert op_type not in rules.OPTIONS
    assert rules.bias_variants.revision == colsum_vector.REVISION == 1
    # one variant: autotune caches no decision of the fused node, so no key needs its code's fingerprint
    op, t = ops.ReluBackwardSums(), TensorType((2, 16, 4, 4), "bfloat16", "NHWC")
    assert rules_for(ops.ReluBackwardSums)["cuda"].variants(op, [t, t, TensorType((16,), "bfloat16")], "cuda") == [{}]


@pytest.mark.skipif(NVCC is None, reason="no nvcc")
def test_sources_compile_with_nvcc():
    nvcc_check([colsum_relu.source(d, aliased) for d in colsum_vector.LANES for aliased in (False, True)])
