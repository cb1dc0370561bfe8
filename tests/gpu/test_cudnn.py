"""cuDNN convolution lowering against the float64 reference, on the GPU.

Forward, backward-data and backward-filter over a parameter grid (stride,
asymmetric padding, dilation, groups incl. depthwise, a stride that does not
tile the input) x precision (fp32 < 1e-4, tf32 < 5e-3, bf16/fp16 < 1e-2,
relative to a float64 reference on the host) x layout (NCHW, NHWC); every
engine of one convolution on a NaN-poisoned output; TF32 really excluded
from fp32; the fused conv + bias + ReLU; the registry rules.

The kernels take symmetric padding only (the rules are tagged
``symmetric_padding_only``): asymmetric cases are run as the legalize pass
runs them, the excess as explicit zero padding of x (fprop, wgrad) or a
crop of a larger dx (dgrad), and refused when called unlegalized.
"""

from __future__ import annotations

import numpy as np
import pytest

from opgraph.backends.device import cuda_status
from opgraph.backends.reference import conv as ref
from opgraph.errors import LoweringError

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_status()[0], reason=f"no GPU: {cuda_status()[1]}")]

TOL = {"fp32": 1e-4, "tf32": 5e-3, "bf16": 1e-2, "fp16": 1e-2}


def P(stride=(1, 1), padding=((0, 0), (0, 0)), dilation=(1, 1), groups=1):
    return dict(stride=stride, padding=padding, dilation=dilation, groups=groups)


#: (id, x shape, w shape, params)
CASES = [
    ("3x3_pad1", (2, 4, 11, 9), (6, 4, 3, 3), P(padding=((1, 1), (1, 1)))),
    ("stride2_asym", (2, 4, 11, 9), (6, 4, 3, 3), P(stride=(2, 2), padding=((0, 1), (1, 0)))),
    ("dil_groups_asym", (2, 4, 11, 9), (6, 2, 3, 2), P(stride=(1, 2), padding=((2, 0), (0, 1)),
                                                        dilation=(2, 1), groups=2)),
    ("depthwise", (2, 6, 10, 10), (6, 1, 3, 3), P(stride=(2, 1), padding=((1, 1), (0, 0)), groups=6)),
    ("untiled_stride3", (2, 4, 10, 11), (8, 4, 3, 3), P(stride=(3, 3))),
    ("1x1_stride2", (2, 8, 9, 9), (4, 8, 1, 1), P(stride=(2, 2))),
]


def _data(rng, xs, ws, p):
    x = rng.standard_normal(xs, dtype=np.float32)
    w = rng.standard_normal(ws, dtype=np.float32)
    y = ref.conv2d_forward(np, x.astype(np.float64), w.astype(np.float64), **p)
    gy = rng.standard_normal(y.shape, dtype=np.float32)
    return x, w, gy, y


def _dev(cp, a, layout, to_cl):
    d = cp.asarray(a)
    return to_cl(d) if layout == "NHWC" else d


def _is_cl(a):
    return not a.flags.c_contiguous and a.transpose(0, 2, 3, 1).flags.c_contiguous


def legalized(p):
    """``(params, extra)``: the padding split as the legalize pass splits it for
    a ``symmetric_padding_only`` rule: ``min(pre, post)`` per axis stays in the
    op, the rest is explicit."""
    keep = tuple((min(t, b), min(t, b)) for t, b in p["padding"])
    extra = tuple((t - k, b - k) for (t, b), (k, _) in zip(p["padding"], keep))
    return dict(p, padding=keep), extra


def _pad(a, extra):
    return np.pad(a, ((0, 0), (0, 0)) + tuple(extra))


def run_direction(cp, direction, x, w, gy, p, xs, ws, dev=None, **options):
    """One cuDNN call of ``direction`` on host arrays, legalized (:func:`legalized`);
    ``dev`` puts a host array on the device (default ``cp.asarray``)."""
    from opgraph.backends.cuda import cudnn
    dev = dev or cp.asarray
    q, extra = legalized(p)
    if direction == "fprop":
        xp_ = _pad(x, extra)
        out_shape = ref.conv_geometry(xp_.shape, ws, **q).y_shape
        return cudnn.conv2d(cp, dev(xp_), dev(w), **q, out_shape=out_shape, **options)
    if direction == "wgrad":
        return cudnn.conv2d_backward_filter(cp, dev(_pad(x, extra)), dev(gy), **q, weight_shape=ws, **options)
    (et, eb), (el, er) = extra
    big = (xs[0], xs[1], xs[2] + et + eb, xs[3] + el + er)
    dx = cudnn.conv2d_backward_data(cp, dev(gy), dev(w), **q, input_shape=big, **options)
    return dx[:, :, et:et + xs[2], el:el + xs[3]]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("precision", list(TOL))
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("direction", ["fprop", "dgrad", "wgrad"])
def test_conv_matches_float64_reference(cp, rng, relerr, to_cl, direction, case, precision, layout):
    _, xs, ws, p = case
    x, w, gy, y64 = _data(rng, xs, ws, p)
    x64, w64, gy64 = (a.astype(np.float64) for a in (x, w, gy))
    want = {"fprop": lambda: y64,
            "dgrad": lambda: ref.conv2d_backward_data(np, gy64, w64, **p, input_shape=xs),
            "wgrad": lambda: ref.conv2d_backward_filter(np, x64, gy64, **p, weight_shape=ws)}[direction]()
    out = run_direction(cp, direction, x, w, gy, p, xs, ws, dev=lambda a: _dev(cp, a, layout, to_cl),
                        precision=precision)
    assert out.dtype == np.float32 and out.shape == want.shape
    if direction != "dgrad" or legalized(p)[1] == ((0, 0), (0, 0)):  # a crop is a view
        assert _is_cl(out) == (layout == "NHWC" and min(out.shape[1:]) > 1)
    err = relerr(cp.asnumpy(out), want)
    assert err < TOL[precision], f"{direction} {case[0]} {precision} {layout}: rel err {err:.2e}"


@pytest.mark.parametrize("direction", ["fprop", "dgrad", "wgrad"])
def test_asymmetric_padding_is_refused_unlegalized(cp, rng, direction):
    """The kernels never pad on their own: asymmetric padding is the legalize
    pass's to make explicit (docs/gpu.md: cuDNN 9.19 is not trusted with it)."""
    from opgraph.backends.cuda import cudnn
    xs, ws, p = (2, 4, 9, 9), (6, 4, 3, 3), P(padding=((1, 0), (1, 1)))
    x, w, gy, y64 = _data(rng, xs, ws, p)
    x, w, gy = cp.asarray(x), cp.asarray(w), cp.asarray(gy)
    with pytest.raises(LoweringError, match="asymmetric.*legalize"):
        if direction == "fprop":
            cudnn.conv2d(cp, x, w, **p, out_shape=y64.shape)
        elif direction == "dgrad":
            cudnn.conv2d_backward_data(cp, gy, w, **p, input_shape=xs)
        else:
            cudnn.conv2d_backward_filter(cp, x, gy, **p, weight_shape=ws)


def _plan(direction, xs, ws, p, precision="fp32", channels_last=False):
    """The route of a symmetric-padding convolution's signature (packed NCHW, or NHWC)."""
    from opgraph.backends.cuda import cudnn
    ys = ref.conv_geometry(xs, ws, **p).y_shape
    shapes = {"fprop": [xs, ws, ys], "dgrad": [ys, ws, xs], "wgrad": [xs, ys, ws]}[direction]
    sig = cudnn.signature(direction, "none", shapes, precision, p["padding"], p["stride"],
                          p["dilation"], channels_last)
    return cudnn.route(sig), shapes


@pytest.mark.parametrize("direction", ["fprop", "dgrad", "wgrad"])
def test_every_engine_on_poisoned_output(cp, rng, relerr, direction):
    """Each cuDNN engine of one conv writes every output element correctly."""
    from opgraph.backends.cuda import cudnn_graph as cg
    xs, ws, p = (2, 8, 12, 12), (16, 8, 3, 3), P(padding=((1, 1), (1, 1)))
    (plan, epilogue), shapes = _plan(direction, xs, ws, p)
    assert epilogue == "none"
    x, w, gy, y64 = _data(rng, xs, ws, p)
    x64, w64, gy64 = (a.astype(np.float64) for a in (x, w, gy))
    ins, want = {"fprop": ((x, w), y64),
                 "dgrad": ((gy, w), ref.conv2d_backward_data(np, gy64, w64, **p, input_shape=xs)),
                 "wgrad": ((x, gy), ref.conv2d_backward_filter(np, x64, gy64, **p, weight_shape=ws))}[direction]
    ins = [cp.asarray(a) for a in ins]
    engines = plan.engines()
    assert engines and engines[0] == plan.pick_default()
    for i in engines:
        out = cp.full(shapes[-1], np.nan, dtype=cp.float32)
        scratch = cg.workspace(plan.ensure(i))
        plan.execute([a.data.ptr for a in ins] + [out.data.ptr], i, cg.pointer(scratch))
        err = relerr(cp.asnumpy(out), want)
        assert err < TOL["fp32"], f"engine {i} ({plan.name(i)}): rel err {err:.2e}"


@pytest.mark.parametrize("direction", ["fprop", "dgrad", "wgrad"])
def test_every_engine_with_asymmetric_padding(cp, rng, relerr, direction):
    """Asymmetric padding and stride 2, legalized, one call per engine (first
    call on the frontend's public path, second on the fast path)."""
    xs, ws, p = (2, 8, 12, 11), (16, 8, 3, 3), P(stride=(2, 2), padding=((1, 0), (2, 1)))
    x, w, gy, y64 = _data(rng, xs, ws, p)
    x64, w64, gy64 = (a.astype(np.float64) for a in (x, w, gy))
    want = {"fprop": y64,
            "dgrad": ref.conv2d_backward_data(np, gy64, w64, **p, input_shape=xs),
            "wgrad": ref.conv2d_backward_filter(np, x64, gy64, **p, weight_shape=ws)}[direction]
    q, ((et, eb), (el, er)) = legalized(p)
    (plan, _), _ = _plan(direction, (xs[0], xs[1], xs[2] + et + eb, xs[3] + el + er), ws, q)
    for i in plan.engines():
        first = run_direction(cp, direction, x, w, gy, p, xs, ws, engine=i)
        second = run_direction(cp, direction, x, w, gy, p, xs, ws, engine=i)
        err = relerr(cp.asnumpy(first), want)
        assert err < TOL["fp32"], f"engine {i} ({plan.name(i)}): rel err {err:.2e}"
        # equal up to the reduction order of nondeterministic (atomic) engines
        assert relerr(cp.asnumpy(second), cp.asnumpy(first)) < 1e-6, f"engine {i}: fast path differs"


def _tf32_errors(cp, precision):
    """Relative error of each engine on inputs 1 + 2^-12, which TF32 (10-bit
    mantissa) rounds to 1: exact float32 gives 144 (1 + 2^-11), TF32 gives 144."""
    from opgraph.backends.cuda import cudnn_graph as cg
    xs, ws, p = (2, 16, 8, 8), (8, 16, 3, 3), P()
    (plan, _), shapes = _plan("fprop", xs, ws, p, precision)
    v = np.float32(1 + 2.0 ** -12)
    x, w = cp.full(xs, v, dtype=cp.float32), cp.full(ws, v, dtype=cp.float32)
    exact = 144 * (float(v) ** 2)
    errs = {}
    for i in plan.engines():
        out = cp.full(shapes[-1], np.nan, dtype=cp.float32)
        scratch = cg.workspace(plan.ensure(i))
        plan.execute([x.data.ptr, w.data.ptr, out.data.ptr], i, cg.pointer(scratch))
        errs[i] = float(cp.abs(out - exact).max()) / exact
    return errs


def test_fp32_excludes_tf32_engines(cp):
    errs = _tf32_errors(cp, "fp32")
    assert errs and max(errs.values()) < 1e-5, errs


def test_tf32_precision_offers_tf32_engines(cp):
    """The filter is not vacuous: with 'tf32' some engine rounds to TF32."""
    errs = _tf32_errors(cp, "tf32")
    assert max(errs.values()) > 1e-4, errs


@pytest.mark.parametrize("precision,layout", [("fp32", "NCHW"), ("bf16", "NHWC"), ("fp16", "NHWC"),
                                              ("tf32", "NCHW")])
def test_conv2d_bias_relu(cp, rng, relerr, to_cl, precision, layout):
    from opgraph.backends.cuda import cudnn
    xs, ws, p = (4, 16, 14, 14), (32, 16, 3, 3), P(padding=((1, 1), (1, 1)))
    x, w, _, y64 = _data(rng, xs, ws, p)
    b = rng.standard_normal(ws[0], dtype=np.float32)
    want = np.maximum(y64 + b[None, :, None, None], 0)
    out = cudnn.conv2d_bias_relu(cp, _dev(cp, x, layout, to_cl), _dev(cp, w, layout, to_cl),
                                 cp.asarray(b), **p, out_shape=y64.shape, precision=precision)
    assert relerr(cp.asnumpy(out), want) < TOL[precision]
    out_b = cudnn.conv2d(cp, _dev(cp, x, layout, to_cl), _dev(cp, w, layout, to_cl), cp.asarray(b),
                         **p, out_shape=y64.shape, precision=precision)
    assert relerr(cp.asnumpy(out_b), y64 + b[None, :, None, None]) < TOL[precision]


def test_rules(cp, rng, relerr):
    from opgraph.backends.cuda import cudnn_rules  # noqa: F401  (registers the rules)
    from opgraph.backends.registry import KernelContext, rules_for
    from opgraph.ops.conv import Conv2d, Conv2dBackwardData, Conv2dBackwardFilter
    from opgraph.types import TensorType
    xs, ws, p = (2, 8, 12, 12), (16, 8, 3, 3), P(stride=(2, 2), padding=((1, 1), (0, 0)))
    x, w, gy, y64 = _data(rng, xs, ws, p)
    b = rng.standard_normal(ws[0], dtype=np.float32)
    x64, w64, gy64 = (a.astype(np.float64) for a in (x, w, gy))
    cases = [(Conv2d(**p), (x, w, b), y64 + b[None, :, None, None]),
             (Conv2dBackwardData(**p, input_shape=xs), (gy, w),
              ref.conv2d_backward_data(np, gy64, w64, **p, input_shape=xs)),
             (Conv2dBackwardFilter(**p, weight_shape=ws), (x, gy),
              ref.conv2d_backward_filter(np, x64, gy64, **p, weight_shape=ws))]
    for op, arrays, want in cases:
        rule = rules_for(type(op))["cudnn"]
        types = tuple(TensorType(a.shape) for a in arrays)
        assert rule.decline_reason(op, types, "cuda") is None
        assert rule.decline_reason(op, tuple(TensorType(a.shape, "float64") for a in arrays), "cuda")
        variants = rule.variants(op, types, "cuda")
        assert variants and all(set(v) == {"engine"} for v in variants)
        assert "symmetric_padding_only" in rule.tags and "fused" not in rule.tags
        for options in (dict(variants[0], precision="fp32"), dict(variants[-1], precision="fp32"),
                        {"precision": "tf32"}):
            assert rule.workspace(op, types, options) >= 0
            out = rule.kernel(KernelContext(cp, "cuda", options), op, *[cp.asarray(a) for a in arrays])
            tol = TOL[options["precision"]]
            assert relerr(cp.asnumpy(out), want) < tol, (op, options)


def test_empty_batch_and_cache(cp, rng):
    from opgraph.backends.cuda import cudnn, cudnn_graph as cg
    p = P(padding=((1, 1), (1, 1)))
    x = cp.zeros((0, 4, 8, 8), dtype=cp.float32)
    w = cp.asarray(rng.standard_normal((6, 4, 3, 3), dtype=np.float32))
    assert cudnn.conv2d(cp, x, w, **p, out_shape=(0, 6, 8, 8)).shape == (0, 6, 8, 8)
    gw = cudnn.conv2d_backward_filter(cp, x, cp.zeros((0, 6, 8, 8), cp.float32), **p,
                                      weight_shape=(6, 4, 3, 3))
    assert gw.shape == (6, 4, 3, 3) and not cp.any(gw)
    x = cp.asarray(rng.standard_normal((2, 4, 8, 8), dtype=np.float32))
    cudnn.conv2d(cp, x, w, **p, out_shape=(2, 6, 8, 8))
    before = cg.cache_size()
    y1 = cudnn.conv2d(cp, x, w, **p, out_shape=(2, 6, 8, 8))
    y2 = cudnn.conv2d(cp, x, w, **p, out_shape=(2, 6, 8, 8))
    assert cg.cache_size() == before
    assert cp.allclose(y1, y2, rtol=1e-6, atol=0)


@pytest.mark.parametrize("direction", ["dgrad", "wgrad"])
def test_a_channel_slice_of_an_nhwc_buffer_runs_nhwc(cp, rng, relerr, to_cl, direction):
    """A DenseNet layer's gradient arrives as a channel slice of the NHWC concat
    gradient (a strided view, neither packed layout). It must run the NHWC
    graph, as the autotune pass timed it on packed NHWC inputs, and give NHWC
    out: it used to be copied NCHW, which flipped the layout downstream and
    ran a tuned NHWC engine index on the NCHW graph, where it did not exist
    (DenseNet-121 fp32 on the H200, 2026-12-02)."""
    from opgraph.backends.cuda import cudnn
    xs, ws, p = (4, 16, 7, 7), (8, 16, 3, 3), P(padding=((1, 1), (1, 1)))
    x, w, _, _ = _data(rng, xs, ws, p)
    big = to_cl(cp.asarray(rng.standard_normal((4, 24, 7, 7), dtype=np.float32)))
    gy = big[:, 8:16]  # the channel slice
    assert not _is_cl(gy) and not gy.flags.c_contiguous
    host_gy = cp.asnumpy(gy).astype(np.float64)
    q = dict(p, precision="fp32")
    if direction == "dgrad":
        want = ref.conv2d_backward_data(np, host_gy, w.astype(np.float64), **p, input_shape=xs)
        (plan, _), _ = _plan("dgrad", xs, ws, p, channels_last=True)  # the graph the autotune pass times
        engines = plan.engines()
        assert engines
        for engine in [None, *engines]:
            got = cudnn.conv2d_backward_data(cp, gy, to_cl(cp.asarray(w)), **q, input_shape=xs, engine=engine)
            assert _is_cl(got)
            assert relerr(cp.asnumpy(got), want) < TOL["fp32"], engine
    else:
        want = ref.conv2d_backward_filter(np, x.astype(np.float64), host_gy, **p, weight_shape=ws)
        got = cudnn.conv2d_backward_filter(cp, to_cl(cp.asarray(x)), gy, **q, weight_shape=ws)
        assert relerr(cp.asnumpy(got), want) < TOL["fp32"]
