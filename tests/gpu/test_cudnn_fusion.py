"""cuDNN's fused convolutions against the float64 reference, on the GPU.

* The forward with its epilogue (``conv_fprop -> bias [-> add] [-> relu | relu
  clipped to 6]``) and backward-data with the ReLU gradient (``conv_dgrad ->
  relu_backward``), each through the fused graph where an engine builds it and
  through the fallback (the unfused graph plus ``reference.conv_epilogue`` on
  CuPy), in fp32 and bf16, NCHW and NHWC.
* Every engine of two fused graphs on a NaN-poisoned output.
* Whole graphs: a ResNet basic block and a ReLU6 convolution in training,
  fused against unfused and against the float64 reference, autotuned (every
  engine of every fused graph timed and checked by the tuner), in bf16
  storage, and the legalized asymmetric padding of a convolution on cuDNN.

Tolerances (SEMANTICS.md, relative to float64): fp32 1e-4, bf16 1e-2 per op.
"""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.backends.device import cuda_status
from opgraph.backends.reference import conv as ref

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_status()[0], reason=f"no GPU: {cuda_status()[1]}")]

TOL = {"fp32": 1e-4, "bf16": 1e-2}
P = dict(stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1)
XS, WS = (4, 16, 14, 14), (32, 16, 3, 3)


def _dev(cp, a, layout, to_cl):
    d = cp.asarray(a)
    return to_cl(d) if layout == "NHWC" else d


@pytest.fixture(params=["fused", "fallback"])
def path(request, monkeypatch):
    """``fused``: the route cuDNN picks (the fused graph where an engine builds
    it); ``fallback``: the unfused graph and the CuPy epilogue, forced."""
    if request.param == "fallback":
        from opgraph.backends.cuda import cudnn, cudnn_graph as cg
        monkeypatch.setattr(cudnn, "route", lambda sig: (
            (cg.plan_for(sig), "none") if sig.epilogue in ("none", "bias")
            else (cg.plan_for(cudnn._unfused(sig)), sig.epilogue)))
    return request.param


def _forward_want(x, w, b, r, activation):
    want = ref.conv2d_forward(np, x.astype(np.float64), w.astype(np.float64), **P) + b[None, :, None, None]
    if r is not None:
        want = want + r
    lo, hi = {"none": (None, None), "relu": (0, None), "relu6": (0, 6)}[activation]
    return np.clip(want, lo, hi) if lo is not None else want


@pytest.mark.parametrize("activation, residual", [("relu", False), ("relu", True), ("relu6", False),
                                                  ("relu6", True), ("none", True)])
@pytest.mark.parametrize("precision, layout", [("fp32", "NCHW"), ("fp32", "NHWC"), ("bf16", "NHWC"),
                                               ("bf16", "NCHW")])
def test_fused_forward(cp, rng, relerr, to_cl, path, activation, residual, precision, layout):
    from opgraph.backends.cuda import cudnn
    x = rng.standard_normal(XS, dtype=np.float32)
    w = (rng.standard_normal(WS, dtype=np.float32) / 4).astype(np.float32)  # outputs spread over 0..6 and past
    b = rng.standard_normal(WS[0], dtype=np.float32)
    ys = ref.conv_geometry(XS, WS, **P).y_shape
    r = (2 * rng.standard_normal(ys)).astype(np.float32) if residual else None
    want = _forward_want(x, w, b, r, activation)
    if activation == "relu6":  # the data reaches both clips (looked at before the activation)
        pre = _forward_want(x, w, b, r, "none")
        assert (pre > 6).any() and (pre < 0).any()
    out = cudnn.conv2d(cp, _dev(cp, x, layout, to_cl), _dev(cp, w, layout, to_cl), cp.asarray(b),
                       None if r is None else _dev(cp, r, layout, to_cl), **P, out_shape=ys,
                       activation=activation, precision=precision)
    assert out.shape == ys and out.dtype == np.float32
    err = relerr(cp.asnumpy(out), want)
    assert err < TOL[precision], f"{path} {activation} residual={residual} {precision} {layout}: {err:.2e}"
    if activation == "relu6":
        host = cp.asnumpy(out)
        assert host.max() <= 6 and host.min() >= 0


@pytest.mark.parametrize("precision, layout", [("fp32", "NCHW"), ("fp32", "NHWC"), ("bf16", "NHWC")])
@pytest.mark.parametrize("stride", [(1, 1), (2, 2)])
def test_backward_data_relu(cp, rng, relerr, to_cl, path, precision, layout, stride):
    """``conv_dgrad -> relu_backward``: the gradient where the ReLU output (many
    exact zeros) is > 0, zero elsewhere."""
    from opgraph.backends.cuda import cudnn
    p = dict(P, stride=stride)
    ys = ref.conv_geometry(XS, WS, **p).y_shape
    gy = rng.standard_normal(ys, dtype=np.float32)
    w = rng.standard_normal(WS, dtype=np.float32)
    y_relu = np.maximum(rng.standard_normal(XS, dtype=np.float32), 0)
    dx = ref.conv2d_backward_data(np, gy.astype(np.float64), w.astype(np.float64), **p, input_shape=XS)
    want = np.where(y_relu > 0, dx, 0.0)
    out = cudnn.conv2d_backward_data(cp, _dev(cp, gy, layout, to_cl), _dev(cp, w, layout, to_cl), **p,
                                     input_shape=XS, relu_output=_dev(cp, y_relu, layout, to_cl),
                                     precision=precision)
    host = cp.asnumpy(out)
    assert not host[y_relu == 0].any(), f"{path}: gradient where the ReLU output is 0"
    err = relerr(host, want)
    assert err < TOL[precision], f"{path} {precision} {layout} stride {stride}: {err:.2e}"


@pytest.mark.parametrize("kind", ["bias_add_relu", "drelu"])
def test_every_engine_of_a_fused_graph(cp, rng, relerr, kind):
    """Each engine of the fused graph (fp32, NHWC) writes every output element
    correctly; skipped where no engine builds it (the fallback then runs)."""
    from opgraph.backends.cuda import cudnn, cudnn_graph as cg
    from opgraph.errors import LoweringError
    ys = ref.conv_geometry(XS, WS, **P).y_shape
    x = rng.standard_normal(XS, dtype=np.float32)
    w = rng.standard_normal(WS, dtype=np.float32)
    if kind == "drelu":
        gy = rng.standard_normal(ys, dtype=np.float32)
        y_relu = np.maximum(rng.standard_normal(XS, dtype=np.float32), 0)
        dx = ref.conv2d_backward_data(np, gy.astype(np.float64), w.astype(np.float64), **P, input_shape=XS)
        shapes, arrays, want = [ys, WS, XS, XS], [gy, w, y_relu], np.where(y_relu > 0, dx, 0.0)
        sig = cudnn.signature("dgrad", "drelu", shapes, "fp32", P["padding"], P["stride"], P["dilation"], True)
    else:
        b, r = rng.standard_normal(WS[0], dtype=np.float32), rng.standard_normal(ys, dtype=np.float32)
        shapes, arrays = [XS, WS, (1, WS[0], 1, 1), ys, ys], [x, w, b, r]
        want = _forward_want(x, w, b, r, "relu")
        sig = cudnn.signature("fprop", kind, shapes, "fp32", P["padding"], P["stride"], P["dilation"], True)
    try:
        plan = cg.plan_for(sig)
    except LoweringError as exc:
        pytest.skip(f"no engine fuses {kind} here (the fallback runs): {exc}"[:300])
    to_nhwc = lambda a: cp.ascontiguousarray(cp.asarray(a).transpose(0, 2, 3, 1)) if a.ndim == 4 else cp.asarray(a)
    ins = [to_nhwc(a) for a in arrays]
    for i in plan.engines():
        n, c, h, wd = shapes[-1]
        out = cp.full((n, h, wd, c), np.nan, dtype=cp.float32)
        scratch = cg.workspace(plan.ensure(i))
        plan.execute([a.data.ptr for a in ins] + [out.data.ptr], i, cg.pointer(scratch))
        err = relerr(cp.asnumpy(out.transpose(0, 3, 1, 2)), want)
        assert err < TOL["fp32"], f"{kind} engine {i} ({plan.name(i)}): rel err {err:.2e}"


def _resnet_and_relu6_step():
    """A ResNet basic block and a ReLU6 1x1 convolution with every parameter gradient."""
    g = og.Graph()
    x = g.input("x", (2, 16, 10, 10))
    shapes = {"w1": (16, 16, 3, 3), "b1": (16,), "w2": (16, 16, 3, 3), "b2": (16,), "w3": (16, 16, 1, 1),
              "b3": (16,)}
    p = {n: g.param(n, s) for n, s in shapes.items()}
    a = og.relu(og.conv2d(x, p["w1"], p["b1"], padding=1, name="conv1"), name="relu1")
    h = og.relu(og.add(og.conv2d(a, p["w2"], p["b2"], padding=1, name="conv2"), x, name="add"), name="relu2")
    m = og.relu6(og.conv2d(h, p["w3"], p["b3"], name="conv3"), name="act3")
    y = og.max_pool2d(m, 2, name="pool")
    return y, list(p.values())


def _feeds(params, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.standard_normal((2, 16, 10, 10)).astype(np.float32)}
    for v in params:
        fan_in = int(np.prod(v.shape[1:])) if len(v.shape) > 1 else 1
        feeds[v.name] = (2 * rng.standard_normal(v.shape) / np.sqrt(fan_in)).astype(np.float32)
    return feeds


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("autotune", [False, True])
def test_fused_training_step_on_cudnn(cp, relerr, tmp_path, layout, autotune):
    y, params = _resnet_and_relu6_step()
    grads = og.grad(y, params)
    outs = [y, *grads]
    feeds = _feeds(params)
    gy = np.random.default_rng(1).standard_normal(y.shape)
    want = og.compile(outs, device="cpu", pipeline="reference", dtype="float64")(grad_outputs={y: gy}, **feeds)
    policy = og.LoweringPolicy(prefer={"conv": ["cudnn"]}, layout=layout, autotune=autotune,
                               cache=str(tmp_path / "cache.json"))
    exe = og.compile(outs, device="cuda", policy=policy)
    fused = sorted(st.op.op.name for st in exe.steps if st.op.op.fused and st.op.family == "conv")
    assert fused == ["Conv2dBackwardDataRelu"] * 2 + ["Conv2dBiasActivation"] * 2 + ["Conv2dBiasRelu"]
    if not autotune:  # the tuner may prefer another algorithm for a node this small
        assert {st.op.algorithm for st in exe.steps if st.op.family == "conv"} == {"cudnn"}
    got = exe(grad_outputs={y: gy.astype(np.float32)}, **feeds)
    unfused = og.compile(outs, device="cuda", policy=og.LoweringPolicy(prefer={"conv": ["cudnn"]}, layout=layout,
                                                                      exclude=["fused"]))
    assert not any(st.op.op.fused for st in unfused.steps)
    plain = unfused(grad_outputs={y: gy.astype(np.float32)}, **feeds)
    for name, a, b, w in zip(["y"] + [p.name for p in params], got, plain, want):
        a, b = cp.asnumpy(a), cp.asnumpy(b)
        assert relerr(a, w) < 1e-3, f"{name}: fused {relerr(a, w):.2e}"
        assert relerr(a, b) < 1e-3, f"{name}: fused against unfused {relerr(a, b):.2e}"


def test_fused_training_step_in_bfloat16_storage(cp, relerr):
    y, params = _resnet_and_relu6_step()
    outs = [y, *og.grad(y, params)]
    feeds = _feeds(params, seed=2)
    gy = np.random.default_rng(3).standard_normal(y.shape)
    want = og.compile(outs, device="cpu", pipeline="reference", dtype="float64")(grad_outputs={y: gy}, **feeds)
    exe = og.compile(outs, device="cuda", dtype="bfloat16",
                     policy=og.LoweringPolicy(prefer={"conv": ["cudnn"]}, layout="NHWC", precision="bf16"))
    assert any(st.op.op.name == "Conv2dBiasActivation" for st in exe.steps)
    got = exe(grad_outputs={y: gy.astype(np.float32)}, **feeds)
    assert relerr(cp.asnumpy(got[0].astype(cp.float32)), want[0]) < 5e-2
    for p, a, w in zip(params, got[1:], want[1:]):
        assert relerr(cp.asnumpy(a.astype(cp.float32)), w) < 4e-1, p.name  # the routing allowance of bf16


def test_asymmetric_padding_is_legalized_before_cudnn(cp, relerr):
    """The rules are tagged symmetric_padding_only: the legalize pass puts Pad /
    PadBackward nodes around the convolution and cuDNN gets symmetric padding."""
    g = og.Graph()
    x, w, b = g.input("x", (2, 8, 12, 11)), g.param("w", (16, 8, 3, 3)), g.param("b", (16,))
    y = og.conv2d(x, w, b, stride=2, padding=((1, 0), (2, 1)), name="conv")
    outs = [y, *og.grad(y, [x, w, b])]
    rng = np.random.default_rng(4)
    feeds = {"x": rng.standard_normal(x.shape).astype(np.float32),
             "w": rng.standard_normal(w.shape).astype(np.float32), "b": rng.standard_normal(16).astype(np.float32)}
    gy = rng.standard_normal(y.shape)
    want = og.compile(outs, device="cpu", pipeline="reference", dtype="float64")(grad_outputs={y: gy}, **feeds)
    exe = og.compile(outs, device="cuda", policy=og.LoweringPolicy(prefer={"conv": ["cudnn"]}))
    kinds = [st.op.op.name for st in exe.steps]
    assert "Pad" in kinds and "PadBackward" in kinds
    assert all(st.op.op.padding[0][0] == st.op.op.padding[0][1] and st.op.op.padding[1][0] == st.op.op.padding[1][1]
               for st in exe.steps if st.op.family == "conv")
    for a, b_ in zip(exe(grad_outputs={y: gy.astype(np.float32)}, **feeds), want):
        assert relerr(cp.asnumpy(a), b_) < 1e-4
