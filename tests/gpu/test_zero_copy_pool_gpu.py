"""On the GPU: zero-copy concat through cuDNN's strided output (passes/zero_copy.py,
cuda/cudnn.py) and the max-pool kernels with saved 1-byte indices
(cuda/pool_indices.py), alone and as the pool-argmax rule makes them, each
against the float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.backends.cuda import pool_indices as cuda_idx
from opgraph.backends.device import cuda_status
from opgraph.backends.reference import pool as ref_pool
from opgraph.backends.reference.pool_indices import max_pool2d_backward_indices, max_pool2d_with_indices
from opgraph.buffer_views import AssembleConcat, WriteInto

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_status()[0], reason=f"no GPU: {cuda_status()[1]}")]


def _inception():
    g = og.Graph("inception")
    x = g.input("x", (4, 16, 12, 12))
    params = []

    def conv_relu(h, cout, k, name):
        w, b = g.param(f"{name}.w", (cout, h.shape[1], k, k)), g.param(f"{name}.b", (cout,))
        params.extend([w, b])
        return og.relu(og.conv2d(h, w, b, padding=k // 2))

    y1 = conv_relu(x, 8, 1, "b1")
    y2 = conv_relu(conv_relu(x, 8, 1, "b2r"), 16, 3, "b2")
    y4 = conv_relu(og.max_pool2d(x, 3, 1, 1), 8, 1, "b4")
    cat = og.concat([y1, y2, y4], 1, name="inception")
    return conv_relu(cat, 8, 3, "next"), params


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype,precision,tol", [("float32", "fp32", 1e-4), ("bfloat16", "bf16", 5e-2)])
def test_inception_producers_write_into_the_concat_through_cudnn(cp, relerr, layout, dtype, precision, tol):
    y, params = _inception()
    outs = [y, *og.grad(y, params)]
    rng = np.random.default_rng(0)
    feeds = {p.name: rng.standard_normal(p.shape).astype(np.float32) for p in params}
    feeds["x"] = rng.standard_normal((4, 16, 12, 12)).astype(np.float32)
    gy = rng.standard_normal(y.shape)
    want = og.compile(outs, device="cpu", pipeline="reference", dtype="float64")(grad_outputs={y: gy}, **feeds)
    exe = og.compile(outs, device="cuda", dtype=dtype,
                     policy=og.LoweringPolicy(prefer={"conv": ["cudnn"]}, layout=layout, precision=precision))
    concat = next(st for st in exe.steps if st.name == "inception")
    assert isinstance(concat.view, AssembleConcat) and concat.view.copies == ()
    producers = [st for st in exe.steps if st.node in exe.graph.input_ids(concat.node)]
    # cuDNN writes NHWC channel slices itself; an NCHW slice gets the dense result copied in
    assert all(isinstance(st.view, WriteInto) and st.view.copy == (layout == "NCHW") for st in producers)
    got = exe(grad_outputs={y: gy.astype(np.float32)}, **feeds)
    assert relerr(cp.asnumpy(got[0].astype(cp.float32)), want[0]) < tol
    for p, a, w in zip(params, got[1:], want[1:]):
        assert relerr(cp.asnumpy(a.astype(cp.float32)), w) < (4e-1 if dtype == "bfloat16" else tol), p.name


CASES = [((2, 3, 9, 8), (3, 3), (2, 2), ((1, 1), (1, 1)), False),
         ((2, 3, 8, 7), (3, 2), (2, 3), ((1, 0), (1, 1)), True),
         ((4, 64, 56, 56), (2, 2), (2, 2), ((0, 0), (0, 0)), False)]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_max_pool_with_indices_matches_the_reference(cp, rng, case, ties, dtype, layout):
    from opgraph.types import numpy_dtype
    shape, k, s, p, ceil = case
    x64 = rng.integers(0, 3, shape).astype(np.float64) if ties else rng.standard_normal(shape)
    x = x64.astype(numpy_dtype(dtype))  # the stored values both sides compare
    g = ref_pool._checked("max_pool2d", x64, k, s, p, ceil)
    dev = cp.asarray(x)
    if layout == "NHWC":
        dev = cp.ascontiguousarray(dev.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    y, idx = cuda_idx.max_pool2d_with_indices(cp, dev, g)
    want_y, want_idx = max_pool2d_with_indices(np, x.astype(np.float64), g)
    np.testing.assert_array_equal(cp.asnumpy(idx), want_idx)
    np.testing.assert_array_equal(cp.asnumpy(y).astype(np.float64), want_y)
    gy = rng.standard_normal(want_y.shape).astype(numpy_dtype(dtype))
    gx = cuda_idx.max_pool2d_backward_indices(cp, idx, cp.asarray(gy), g, shape)
    want = max_pool2d_backward_indices(np, want_idx, gy.astype(np.float64), g, shape)
    tol = 1e-6 if dtype == "float32" else 8e-3
    np.testing.assert_allclose(cp.asnumpy(gx).astype(np.float64), want, rtol=tol, atol=tol)
    np.testing.assert_allclose(want, ref_pool.max_pool2d_backward(np, x.astype(np.float64), gy.astype(np.float64),
                                                                 kernel_size=k, stride=s, padding=p, ceil_mode=ceil))


def pooled_inception_step():
    """``(z, params, x, outputs)``: the inception block, a 3x3/2 ceil-mode max pool of it, and the
    training step's outputs (z and the gradients of the parameters and of the input x)."""
    y, params = _inception()
    z = og.max_pool2d(y, 3, 2, ceil_mode=True)
    x = next(s.output for s in z.graph.sources() if s.name == "x")
    return z, params, x, [z, *og.grad(z, [*params, x])]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype,precision,tol", [("float32", "fp32", 1e-4), ("bfloat16", "bf16", 5e-2)])
def test_the_training_step_through_saved_pool_winners(cp, relerr, layout, dtype, precision, tol):
    """The ``pool-argmax`` rule on the device: every max pooling of an
    inception-like step runs as argmax + take, its gradient as the gather;
    every output against the float64 reference (the inception pool's input
    is the step's input: its plain gradient form; the next pool reads a
    ReLU: the masked form). ``pool-scan`` (on by default since the twenty-second session)
    would take the inception's 3x3/1 pool: excluded here, ``test_pool_scan_gpu`` covers it
    (the premise is checked without a GPU: ``test_gpu_premises.py``)."""
    z, params, x, outs = pooled_inception_step()
    rng = np.random.default_rng(1)
    feeds = {p.name: rng.standard_normal(p.shape).astype(np.float32) for p in params}
    feeds["x"] = rng.standard_normal((4, 16, 12, 12)).astype(np.float32)
    gz = rng.standard_normal(z.shape)
    want = og.compile(outs, device="cpu", pipeline="reference", dtype="float64")(grad_outputs={z: gz}, **feeds)
    exe = og.compile(outs, device="cuda", dtype=dtype, policy=og.LoweringPolicy(layout=layout, precision=precision,
                                                                                exclude=["pool-scan"]))
    kinds = [st.op.op.name for st in exe.steps]
    assert kinds.count("MaxPool2dTake") == kinds.count("MaxPool2dArgmax") == 2, kinds
    assert "MaxPool2dBackward" not in kinds and "MaxPool2dBackwardRelu" not in kinds
    got = exe(grad_outputs={z: gz.astype(np.float32)}, **feeds)
    assert relerr(cp.asnumpy(got[0].astype(cp.float32)), want[0]) < tol
    for p, a, w in zip([*params, x], got[1:], want[1:]):
        assert relerr(cp.asnumpy(a.astype(cp.float32)), w) < (4e-1 if dtype == "bfloat16" else tol), p.name
    # against the same compile with the rule off: the same routing, so the same values but for
    # the order of float32 sums in the ops the rule does not touch (bf16: one rounding)
    off = og.compile(outs, device="cuda", dtype=dtype, policy=og.LoweringPolicy(
        layout=layout, precision=precision, exclude=["pool-argmax", "pool-scan"]))(
            grad_outputs={z: gz.astype(np.float32)}, **feeds)
    for p, a, b in zip(["z", *[q.name for q in params], "x"], got, off):
        a, b = (cp.asnumpy(v.astype(cp.float32)) for v in (a, b))
        assert relerr(a, b) < (1e-2 if dtype == "bfloat16" else 1e-5), p
