"""Every convolution algorithm x direction x parameter form against the float64
direct reference (SEMANTICS.md tolerances), their decline reasons, and the
registry glue of ``opgraph.backends.algorithms.rules``."""

import numpy as np
import pytest

from opgraph.backends.algorithms import fft, gemm, winograd
from opgraph.backends.reference import conv as ref
from opgraph.backends.registry import KernelContext, lookup, rules_for
from opgraph.errors import LoweringError, ParameterError
from opgraph.ops.conv import Conv2d, Conv2dBackwardData, Conv2dBackwardFilter
from opgraph.params import pair
from opgraph.types import TensorType

# (x shape, w shape, params)
CASES = {
    "basic": ((2, 3, 6, 5), (4, 3, 3, 3), dict(padding=1)),
    "stride2_asym_pad": ((2, 3, 7, 6), (4, 3, 3, 3), dict(stride=2, padding=((0, 1), (2, 0)))),
    "stride3_dil2": ((1, 2, 11, 9), (3, 2, 3, 2), dict(stride=3, dilation=2, padding=((1, 0), (0, 2)))),
    "stride_dil_hw": ((2, 2, 8, 7), (2, 2, 2, 3), dict(stride=(1, 2), dilation=(2, 1))),
    "dilation2_s1": ((1, 2, 9, 8), (2, 2, 3, 3), dict(dilation=2, padding=2)),
    "groups2": ((2, 4, 6, 6), (6, 2, 3, 3), dict(padding=1, groups=2)),
    "depthwise": ((2, 3, 5, 7), (3, 1, 3, 3), dict(padding=((1, 1), (0, 2)), groups=3)),
    "depthwise_x2": ((1, 2, 5, 5), (4, 1, 3, 3), dict(padding=2, groups=2)),
    "kernel_gt_input": ((1, 2, 2, 3), (3, 2, 3, 3), dict(padding=1)),
    "kernel_gt_input_5x4": ((1, 2, 2, 2), (2, 2, 5, 4), dict(padding=((2, 1), (1, 1)))),
    "1x1_stride2": ((2, 3, 5, 6), (4, 3, 1, 1), dict(stride=2)),
    "1x1": ((2, 3, 5, 6), (4, 3, 1, 1), {}),  # gemm's no-im2col path (gemm_pointwise)
    "1x1_groups2_dil": ((2, 4, 3, 5), (6, 2, 1, 1), dict(groups=2, dilation=2)),
    "batch0": ((0, 4, 5, 5), (4, 2, 3, 3), dict(padding=1, groups=2)),
    "ragged_tiles": ((1, 2, 9, 7), (3, 2, 3, 3), dict(padding=((0, 2), (3, 0)))),
    "stride_not_tiling": ((1, 2, 8, 8), (2, 2, 3, 3), dict(stride=3)),
    "pad_wider_than_kernel": ((1, 1, 3, 3), (2, 1, 3, 3), dict(padding=3)),
}

# name -> (module, options)
ALGORITHMS = {
    "gemm": (gemm, {}),
    "gemm_chunked": (gemm, {"workspace_limit": 1}),  # one image per chunk
    "fft": (fft, {}),
    "fft_chunks2": (fft, {"chunks": 2}),  # the fft-chunked rule's option: channels in runs
    "fft_chunks3": (fft, {"chunks": 3}),  # runs of unequal length (6 channels: 2+2+2; 4: 2+2; 3: 1+1+1)
    "winograd2": (winograd, {"tile": 2}),
    "winograd4": (winograd, {"tile": 4}),
}

TOLERANCE = {  # relative error vs the float64 reference (SEMANTICS.md "Numbers")
    ("gemm", "float32"): 1e-5, ("fft", "float32"): 1e-3, ("winograd", "float32"): 1e-3,
    ("gemm", "float64"): 1e-12, ("fft", "float64"): 1e-10, ("winograd", "float64"): 1e-10,
}

DIRECTIONS = ("forward", "backward_data", "backward_filter")


def winograd_applies(case):
    """Written from the paper's scope, independently of winograd.check."""
    _, ws, params = CASES[case]
    return (ws[2:] == (3, 3) and pair("s", params.get("stride", 1), minimum=1) == (1, 1)
            and pair("d", params.get("dilation", 1), minimum=1) == (1, 1))


def applies(alg, case):
    return ALGORITHMS[alg][0] is not winograd or winograd_applies(case)


GRID = [(alg, case, direction) for alg in ALGORITHMS for case in CASES for direction in DIRECTIONS
        if applies(alg, case)]


def rel_err(out, expect):
    assert out.shape == expect.shape
    assert np.all(np.isfinite(out)), "NaN/inf never passes"
    norm = np.linalg.norm(expect)
    return np.linalg.norm(out.astype(np.float64) - expect) / (norm if norm else 1.0)


def run(module, direction, arrays, shapes, params, options, xp=np):
    xs, ws = shapes
    if direction == "forward":
        return module.conv2d_forward(xp, *arrays, **params, **options)
    if direction == "backward_data":
        return module.conv2d_backward_data(xp, *arrays, input_shape=xs, **params, **options)
    return module.conv2d_backward_filter(xp, *arrays, weight_shape=ws, **params, **options)


def inputs(case, direction, dtype, seed=0):
    """The direction's two inputs in ``dtype`` and the float64 reference result
    computed from exactly those (rounded) values."""
    xs, ws, params = CASES[case]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    ys = ref.conv_geometry(xs, ws, **params).y_shape
    gy = rng.standard_normal(ys).astype(dtype)
    arrays = {"forward": (x, w), "backward_data": (gy, w), "backward_filter": (x, gy)}[direction]
    expect = run(ref, direction, [a.astype(np.float64) for a in arrays], (xs, ws), params, {})
    return arrays, expect


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("alg, case, direction", GRID)
def test_matches_reference(alg, case, direction, dtype):
    module, options = ALGORITHMS[alg]
    xs, ws, params = CASES[case]
    arrays, expect = inputs(case, direction, dtype)
    out = run(module, direction, arrays, (xs, ws), params, options)
    assert out.dtype == np.dtype(dtype)
    family = module.__name__.rsplit(".", 1)[-1]
    assert rel_err(out, expect) < TOLERANCE[(family, dtype)]
    if direction == "backward_filter" and xs[0] == 0:
        assert np.all(out == 0), "batch 0 gives a zero weight gradient"


@pytest.mark.parametrize("alg", ["fft", "winograd2", "winograd4"])
def test_float32_accuracy_at_layer_size(alg):
    """A conv3-like layer (AlexNet-style channel counts, small batch): within 1e-3."""
    module, options = ALGORITHMS[alg]
    xs, ws, params = (2, 64, 13, 13), (96, 64, 3, 3), dict(padding=1)
    rng = np.random.default_rng(3)
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal(ws) / 24).astype(np.float32)
    gy = rng.standard_normal((2, 96, 13, 13)).astype(np.float32)
    for direction, arrays in (("forward", (x, w)), ("backward_data", (gy, w)), ("backward_filter", (x, gy))):
        expect = run(ref, direction, [a.astype(np.float64) for a in arrays], (xs, ws), params, {})
        out = run(module, direction, arrays, (xs, ws), params, options)
        assert rel_err(out, expect) < 1e-3, direction


# --- decline reasons -------------------------------------------------------------------

def node(case, direction):
    """The abstract op and input types of ``case`` in ``direction``."""
    xs, ws, params = CASES[case]
    g = ref.conv_geometry(xs, ws, **params)
    p = dict(stride=g.stride, padding=g.padding, dilation=g.dilation, groups=g.groups)
    xt, wt, yt = TensorType(xs), TensorType(ws), TensorType(g.y_shape)
    if direction == "forward":
        return Conv2d(**p), (xt, wt)
    if direction == "backward_data":
        return Conv2dBackwardData(**p, input_shape=xs), (yt, wt)
    return Conv2dBackwardFilter(**p, weight_shape=ws), (xt, yt)


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("case", CASES)
def test_winograd_check(case, direction):
    op, types = node(case, direction)
    reason = winograd.check(direction, op, types, "cpu")
    if winograd_applies(case):
        assert reason is None
    else:
        assert reason and reason.startswith("winograd needs")
        xs, ws, params = CASES[case]
        arrays, _ = inputs(case, direction, "float64")
        with pytest.raises(LoweringError, match="winograd needs"):
            run(winograd, direction, arrays, (xs, ws), params, {})


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("case", CASES)
def test_gemm_and_fft_accept_every_valid_form(case, direction):
    op, types = node(case, direction)
    assert gemm.check(direction, op, types, "cpu") is None
    assert fft.check(direction, op, types, "cpu") is None


def test_winograd_reason_names_the_kernel():
    op, types = node("kernel_gt_input_5x4", "forward")
    assert winograd.check("forward", op, types, "cpu") == "winograd needs a 3x3 kernel, got 5x4"


def test_huge_sizes_are_declined_not_miscomputed():
    """A 65536x65536 image: Ho*Wo = 2^32 overflows a 32-bit GEMM dimension and an FFT plane."""
    op = Conv2d()
    types = (TensorType((1, 1, 2**16, 2**16)), TensorType((1, 1, 1, 1)))
    assert "32-bit" in gemm.check("forward", op, types, "cpu")
    assert "exceeds" in fft.check("forward", op, types, "cpu")


def test_winograd_rejects_unknown_tile():
    x, w = np.ones((1, 1, 4, 4)), np.ones((1, 1, 3, 3))
    with pytest.raises(ParameterError) as err:
        winograd.conv2d_forward(np, x, w, tile=3)
    assert err.value.param == "tile"


def test_gemm_batch_chunks_respect_the_workspace_limit():
    g = ref.conv_geometry((10, 3, 8, 8), (4, 3, 3, 3), padding=1)
    per_image = gemm.col_bytes_per_image(g, 4)
    assert per_image == 3 * 9 * 64 * 4
    assert gemm.batch_chunk(g, 4, 3 * per_image) == 3
    assert gemm.batch_chunk(g, 4, 1) == 1  # one image always runs
    assert gemm.batch_chunk(g, 4, 10**12) == 10


def test_winograd_matrices_compute_f2_and_f4_on_one_tile():
    """1-D check of the paper's matrices: A^T[(G g) * (B^T d)] = correlation of d with g."""
    rng = np.random.default_rng(5)
    for m in (2, 4):
        bt, gm, at = winograd.matrices(np, m, np.float64)
        d, g = rng.standard_normal(m + 2), rng.standard_normal(3)
        expect = np.array([d[i:i + 3] @ g for i in range(m)])
        np.testing.assert_allclose(at @ ((gm @ g) * (bt @ d)), expect, rtol=1e-12, atol=1e-12)


# --- registry glue ---------------------------------------------------------------------

NAMES = ("direct", "reference", "gemm", "fft", "winograd")


@pytest.mark.parametrize("op_type", [Conv2d, Conv2dBackwardData, Conv2dBackwardFilter])
def test_every_algorithm_is_registered(op_type):
    assert set(NAMES) <= set(rules_for(op_type))


@pytest.mark.parametrize("name", NAMES)
def test_rule_kernels_run_with_bias_and_options(name):
    xs, ws, params = CASES["groups2"]
    rng = np.random.default_rng(7)
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    b = rng.standard_normal(ws[0])
    op, _ = node("groups2", "forward")
    options = {"tile": 2} if name == "winograd" else {}
    y = lookup(Conv2d, name).kernel(KernelContext(np, "cpu", options), op, x, w, b)
    expect = ref.conv2d_forward(np, x, w, **params) + b[None, :, None, None]
    np.testing.assert_allclose(y, expect, rtol=1e-10, atol=1e-10)

    gy = rng.standard_normal(expect.shape)
    dop, _ = node("groups2", "backward_data")
    fop, _ = node("groups2", "backward_filter")
    ctx = KernelContext(np, "cpu", options)
    np.testing.assert_allclose(lookup(Conv2dBackwardData, name).kernel(ctx, dop, gy, w),
                               ref.conv2d_backward_data(np, gy, w, input_shape=xs, **params), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(lookup(Conv2dBackwardFilter, name).kernel(ctx, fop, x, gy),
                               ref.conv2d_backward_filter(np, x, gy, weight_shape=ws, **params), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", ["gemm", "fft", "winograd"])
def test_float16_computes_in_float32(name):
    xs, ws, params = CASES["basic"]
    rng = np.random.default_rng(8)
    x, w = rng.standard_normal(xs).astype(np.float16), rng.standard_normal(ws).astype(np.float16)
    op, _ = node("basic", "forward")
    y = lookup(Conv2d, name).kernel(KernelContext(np), op, x, w)
    assert y.dtype == np.float16
    expect = ref.conv2d_forward(np, x.astype(np.float64), w.astype(np.float64), **params)
    assert rel_err(y, expect) < 1e-2


def test_rule_decline_reason_variants_and_workspace():
    op, types = node("stride2_asym_pad", "forward")
    assert lookup(Conv2d, "winograd").decline_reason(op, types, "cpu") == "winograd needs stride 1, got (2, 2)"
    assert lookup(Conv2d, "gemm").decline_reason(op, types, "cpu") is None
    assert lookup(Conv2d, "direct").decline_reason(op, types, "tpu") == "direct has no tpu implementation"
    op, types = node("basic", "backward_filter")
    rule = lookup(Conv2dBackwardFilter, "winograd")
    assert rule.variants(op, types, "cpu") == [{"tile": 2}, {"tile": 4}]
    assert rule.workspace(op, types, {"tile": 4}) > 0
    for name in ("gemm", "fft"):
        assert lookup(Conv2dBackwardFilter, name).workspace(op, types, {}) > 0
    assert {"conv", "winograd"} <= lookup(Conv2dBackwardData, "winograd").tags



# --- the same kernels on CuPy ----------------------------------------------------------

def _cupy_or_skip():
    from opgraph.backends.device import cuda_status

    usable, why = cuda_status()
    if not usable:
        pytest.skip(why)
    import cupy

    return cupy


GPU_ALGORITHMS = dict(ALGORITHMS, direct=(ref, {}))


@pytest.mark.gpu
@pytest.mark.parametrize("alg", GPU_ALGORITHMS)
def test_same_code_runs_on_cupy(alg):
    """Each algorithm, every applicable case and direction, on CuPy float32 arrays
    against the NumPy float64 reference (the kernels are written against ``xp``)."""
    cp = _cupy_or_skip()
    module, options = GPU_ALGORITHMS[alg]
    family = module.__name__.rsplit(".", 1)[-1]
    tol = 1e-5 if family in ("gemm", "conv") else 1e-3
    for case in CASES:
        if not (module is not winograd or winograd_applies(case)):
            continue
        xs, ws, params = CASES[case]
        for direction in DIRECTIONS:
            arrays, expect = inputs(case, direction, "float32")
            out = run(module, direction, [cp.asarray(a) for a in arrays], (xs, ws), params, options, xp=cp)
            assert isinstance(out, cp.ndarray) and out.dtype == np.float32
            assert rel_err(cp.asnumpy(out), expect) < tol, (case, direction)



@pytest.mark.parametrize("algo", ["gemm", "direct"])
def test_a_half_precision_convolution_with_bias_is_rounded_once(algo):
    # computed in float32, the bias added before the one rounding to bf16 storage
    # (adding it after rounded 31 % of outputs twice)
    import opgraph as og
    from opgraph.types import numpy_dtype

    bf = numpy_dtype("bfloat16")
    g = og.Graph()
    x, w, b = g.input("x", (4, 8, 10, 10), "bfloat16"), g.param("w", (6, 8, 3, 3), "bfloat16"), \
        g.param("b", (6,), "bfloat16")
    y = og.conv2d(x, w, b, padding=1)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((4, 8, 10, 10)).astype(bf),
             "w": rng.standard_normal((6, 8, 3, 3)).astype(bf), "b": (3 * rng.standard_normal(6)).astype(bf)}
    (got,) = og.compile(y, policy={"prefer": {"conv": [algo]}, "exclude": ["fused"]})(**feeds)
    (exact,) = og.compile(y, pipeline="reference", dtype="float64")(**feeds)
    assert got.dtype == bf
    np.testing.assert_array_equal(got.astype(np.float64), exact.astype(bf).astype(np.float64))


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_fft_products_are_one_batched_product(monkeypatch, direction):
    """FFT's per-frequency channel sums go through ``products.matmul`` (on CuPy our
    capturable cuBLAS handle), frequencies and groups merged into one batch axis."""
    calls = []

    def recording(xp, a, b, **kw):
        calls.append((a.shape, b.shape))
        return np.matmul(a, b)
    monkeypatch.setattr(fft, "matmul", recording)
    arrays, expect = inputs("groups2", direction, "float64")
    got = run(fft, direction, arrays, CASES["groups2"][:2], CASES["groups2"][2], {})
    assert rel_err(got, expect) < TOLERANCE[("fft", "float64")]
    assert len(calls) == 1 and len(calls[0][0]) == len(calls[0][1]) == 3


@pytest.mark.parametrize("chunks", [1, 2, 3])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_fft_chunks_split_the_products_not_the_sums(monkeypatch, direction, chunks):
    """``chunks = k``: k products, each over every channel summed (the input channels forward,
    the output channels backward-data, the batch backward-filter) and a run of the others."""
    calls = []

    def recording(xp, a, b, **kw):
        calls.append((a.shape, b.shape))
        return np.matmul(a, b)
    monkeypatch.setattr(fft, "matmul", recording)
    xs, ws, params = CASES["groups2"]  # 2 groups of 2 input, 3 output channels
    arrays, expect = inputs("groups2", direction, "float64")
    got = run(fft, direction, arrays, (xs, ws), params, {"chunks": chunks})
    assert rel_err(got, expect) < TOLERANCE[("fft", "float64")]
    chunked = 2 if direction == "backward_data" else 3
    assert len(calls) == min(chunks, chunked)
    summed = {"forward": 2, "backward_data": 3, "backward_filter": xs[0]}[direction]
    assert all(a[-1] == summed and b[-2] == summed for a, b in calls)


def test_fft_chunked_rule_applies_where_the_spectra_are_large():
    """``fft-chunked`` declines nodes whose weight and result spectra are under CHUNKED_FROM (their
    cache keys stay), offers chunks up to the channels chunked, and its workspace falls with
    them: one chunk is fft's own workspace, k chunks hold the whole operand and 1/k of the rest."""
    small, small_types = node("basic", "backward_data")
    rule = lookup(Conv2dBackwardData, "fft-chunked")
    assert "under the 2048 MiB" in rule.decline_reason(small, small_types, "cpu")
    # OverFeat's conv5 backward-data at batch 128: gy (128, 1024, 12, 12), w (1024, 1024, 3, 3)
    big = Conv2dBackwardData(stride=1, padding=1, dilation=1, groups=1, input_shape=(128, 1024, 12, 12))
    big_types = (TensorType((128, 1024, 12, 12), "float32"), TensorType((1024, 1024, 3, 3), "float32"))
    assert rule.decline_reason(big, big_types, "cuda") is None
    assert rule.variants(big, big_types, "cuda") == [{"chunks": 2}, {"chunks": 4}, {"chunks": 8}]
    whole = lookup(Conv2dBackwardData, "fft").workspace(big, big_types, {})
    assert rule.workspace(big, big_types, {"chunks": 1}) == whole > 2 * 2**30
    spectra = [rule.workspace(big, big_types, {"chunks": k}) for k in (2, 4, 8)]
    assert whole > spectra[0] > spectra[1] > spectra[2]
    g = ref.conv_geometry((128, 1024, 12, 12), (1024, 1024, 3, 3), padding=1)
    plane = 2 * 4 * fft.fft_shape(g)[0] * (fft.fft_shape(g)[1] // 2 + 1)  # complex64
    assert spectra[1] == plane * (4 * 128 * 1024 + 3 * (1024 * 1024 + 128 * 1024) // 4)
    depthwise = Conv2d(stride=1, padding=1, dilation=1, groups=1024)  # one output channel per group
    dw_types = (TensorType((128, 1024, 56, 56), "float32"), TensorType((1024, 1, 3, 3), "float32"))
    assert "one output channel per group" in lookup(Conv2d, "fft-chunked").decline_reason(depthwise, dw_types, "cpu")
    assert {"fft", "fast", "conv"} <= rule.tags


@pytest.mark.parametrize("shape", [(8, 32, 64, 30, 3, 1, 1), (4, 8, 64, 24, 3, 2, 1), (4, 32, 32, 20, 3, 1, 4),
                                   (4, 16, 64, 20, 1, 1, 1)], ids=["3x3", "stride2-o8c", "groups4", "1x1"])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_fft_workspace_bounds_what_the_transforms_hold(direction, shape):
    """tracemalloc's peak over one call, less the result, stays under the declared workspace for
    every chunk count, and chunking lowers it: a run's spectra are dropped before the next run's
    are made (review: chunk i's stayed referenced while chunk i+1's were made; numpy.fft's
    float64 temporaries held up to 1.45x the count, hence scipy.fft on NumPy)."""
    import tracemalloc
    n, c, o, hw, k, stride, groups = shape
    xs, ws = (n, c, hw, hw), (o, c // groups, k, k)
    g = ref.conv_geometry(xs, ws, padding=k // 2, stride=stride, groups=groups)
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    gy = rng.standard_normal(g.y_shape).astype(np.float32)
    p = dict(stride=g.stride, padding=g.padding, dilation=g.dilation, groups=groups)
    op, types, call = {
        "forward": (Conv2d(**p), (TensorType(xs), TensorType(ws)), lambda k: fft.forward(np, x, w, g, k)),
        "backward_data": (Conv2dBackwardData(**p, input_shape=xs), (TensorType(g.y_shape), TensorType(ws)),
                          lambda k: fft.backward_data(np, gy, w, g, k)),
        "backward_filter": (Conv2dBackwardFilter(**p, weight_shape=ws), (TensorType(xs), TensorType(g.y_shape)),
                            lambda k: fft.backward_filter(np, x, gy, g, k)),
    }[direction]
    held = {}
    for k in (1, 2, 4, 8):
        tracemalloc.start()
        try:
            out = call(k)
            held[k] = tracemalloc.get_traced_memory()[1] - out.nbytes
        finally:
            tracemalloc.stop()
        assert held[k] <= fft.workspace(direction, op, types, {"chunks": k}), (k, held[k])
    if shape[4] == 3 and shape[5] == 1 and shape[6] == 1:  # the chunked spectra dominate here
        assert held[4] < 0.6 * held[1]


def test_fft_chunks_is_an_int_of_runs_and_no_channels_is_one_run():
    """Review: ``pieces`` divided by zero for a convolution of zero output channels, which broke
    the plain ``fft`` rule too; ``chunks`` values other than ints >= 1 were bent silently."""
    assert fft.pieces(0, 4) == [(0, 0)] and fft.pieces(10, 8) == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]
    for bad in (0, -2, True, 2.5, "x"):
        with pytest.raises(ParameterError, match=r"chunks=.*must be an int >= 1"):
            fft.pieces(4, bad)
    x, w = np.ones((2, 3, 5, 5)), np.ones((0, 3, 3, 3))
    assert fft.conv2d_forward(np, x, w, padding=1).shape == (2, 0, 5, 5)
    assert fft.conv2d_backward_filter(np, x, np.ones((2, 0, 5, 5)), padding=1, weight_shape=(0, 3, 3, 3)).shape == (0, 3, 3, 3)
    assert not fft.conv2d_backward_data(np, np.ones((2, 0, 5, 5)), w, padding=1, input_shape=(2, 3, 5, 5)).any()


def test_fft_weight_gradient_owns_its_memory():
    """A 1x1 kernel's crop of the inverse transform is contiguous: the result must
    still be a copy, not a view keeping the whole transform alive."""
    rng = np.random.default_rng(3)
    x, gy = rng.standard_normal((2, 16, 12, 12)), rng.standard_normal((2, 8, 12, 12))
    gw = fft.conv2d_backward_filter(np, x, gy, weight_shape=(8, 16, 1, 1))
    assert gw.base is None or gw.base.nbytes == gw.nbytes
    want = ref.conv2d_backward_filter(np, x, gy, weight_shape=(8, 16, 1, 1))
    assert rel_err(gw, want) < TOLERANCE[("fft", "float64")]
