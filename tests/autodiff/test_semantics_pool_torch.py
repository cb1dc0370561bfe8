"""SEMANTICS.md "Pooling" and ReLU rules, one edge case each, against PyTorch (CPU,
float64): forward, input gradient and second derivatives, through ``og.compile``'s
default CPU pipeline (which routes max pooling through its argmax / scan / fused
ReLU kernels where it can).

PyTorch agrees with SEMANTICS.md on the ceil-mode drop rule, the average divisors
(ceil-mode overhang never counted) and, on the CPU, on routing a tied maximum to
the first maximum in row-major window order. Its padding is symmetric, so
``'same'`` (extra pixel bottom/right) is applied with ``F.pad`` using the amounts
computed here from SEMANTICS.md's formula."""

import math

import numpy as np
import pytest

import opgraph as og

from .torch_compare import compare

torch = pytest.importorskip("torch")
F = torch.nn.functional

# name -> (x shape, kernel, stride, padding, ceil_mode)
CASES = {
    "floor": ((2, 2, 7, 6), 3, 2, 1, False),
    "ceil_drops_window_starting_in_padding": ((1, 2, 5, 5), 2, 2, 1, True),
    "ceil_overhang_no_padding": ((1, 2, 6, 6), 3, 2, 0, True),
    "ceil_overhang_with_padding": ((2, 1, 7, 8), 3, 2, 1, True),
    "stride_larger_than_kernel": ((1, 2, 7, 8), 2, 3, 0, False),
    "stride_not_tiling": ((1, 2, 8, 7), 3, 2, 0, False),
    "rectangular": ((1, 2, 6, 9), (2, 3), (1, 2), (1, 0), True),
    "padding_half_kernel": ((1, 1, 4, 5), 2, 1, 1, False),
}


def _ties(shape, seed=0):
    """Small integers: most windows hold tied maxima."""
    return np.random.default_rng(seed).integers(0, 3, size=shape).astype(np.float64)


@pytest.mark.parametrize("case", sorted(CASES))
def test_max_pool_with_ties_matches_torch(case):
    xs, k, s, p, ceil = CASES[case]
    grads = compare(lambda x: og.max_pool2d(x, k, s, p, ceil),
                    lambda x: F.max_pool2d(x, k, s, p, ceil_mode=ceil), {"x": _ties(xs)}, ["x"])
    assert grads["x"].shape == xs


@pytest.mark.parametrize("path", ["argmax", "scan"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_max_pool_saved_winners_route_ties_as_torch(case, path):
    """The pool-argmax / pool-scan fusions' ops (winners saved as window indices, then
    gathered): forward and tied gradient as PyTorch's."""
    from opgraph import ops

    xs, k, s, p, ceil = CASES[case]
    params = ops.MaxPool2d(kernel_size=k, stride=s, padding=p, ceil_mode=ceil).params()
    x_val = _ties(xs)
    g = og.Graph()
    x = g.input("x", xs, "float64")
    if path == "argmax":
        idx = g.apply(ops.MaxPool2dArgmax, dict(params, relu=False), [x])
        y = g.apply(ops.MaxPool2dTake, dict(params, masked=False), [x, idx])
    else:
        idx = g.apply(ops.MaxPool2dArgmaxSlot, dict(params, relu=False), [x])
        y = g.apply(ops.MaxPool2dScan, dict(params, relu=False), [x, idx])
    gy, zero = g.input("gy", y.shape, "float64"), g.input("zero", y.shape, "float64")
    gy_after_y = og.add(gy, og.mul(y, zero))  # the gather runs after the scan fills the slot
    gx = g.apply(ops.MaxPool2dBackwardIndices, dict(params, masked=False, input_shape=xs), [idx, gy_after_y])
    gy_val = np.random.default_rng(9).standard_normal(y.shape)
    got_y, got_gx = og.compile([y, gx], dtype="float64")(x=x_val, gy=gy_val, zero=np.zeros(y.shape))
    tx = torch.tensor(x_val, requires_grad=True)
    ty = F.max_pool2d(tx, k, s, p, ceil_mode=ceil)
    (tgx,) = torch.autograd.grad(ty, tx, torch.tensor(gy_val))
    np.testing.assert_array_equal(got_y, ty.detach().numpy())
    np.testing.assert_allclose(got_gx, tgx.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cip", [True, False])
@pytest.mark.parametrize("case", sorted(CASES))
def test_avg_pool_divisor_matches_torch(case, cip):
    xs, k, s, p, ceil = CASES[case]
    x = np.random.default_rng(1).standard_normal(xs)
    compare(lambda x: og.avg_pool2d(x, k, s, p, ceil, cip),
            lambda x: F.avg_pool2d(x, k, s, p, ceil_mode=ceil, count_include_pad=cip), {"x": x}, ["x"])


def _same(size, k, s):
    out = math.ceil(size / s)
    total = max((out - 1) * s + k - size, 0)
    return total // 2, total - total // 2


@pytest.mark.parametrize("kind", ["max", "avg_include_pad", "avg_exclude_pad"])
@pytest.mark.parametrize("xs, k, s", [((1, 2, 6, 5), 3, 2), ((2, 1, 5, 4), 2, 1), ((1, 1, 7, 7), (3, 2), (2, 3))])
def test_same_padding_puts_the_extra_pixel_bottom_right(kind, xs, k, s):
    kh, kw = (k, k) if isinstance(k, int) else k
    sh, sw = (s, s) if isinstance(s, int) else s
    (t, b), (l, r) = _same(xs[2], kh, sh), _same(xs[3], kw, sw)
    pads = (l, r, t, b)
    x = _ties(xs, 2) if kind == "max" else np.random.default_rng(2).standard_normal(xs)

    def ours(x):
        if kind == "max":
            return og.max_pool2d(x, k, s, "same")
        return og.avg_pool2d(x, k, s, "same", count_include_pad=kind == "avg_include_pad")

    def theirs(x):
        if kind == "max":
            return F.max_pool2d(F.pad(x, pads, value=-math.inf), k, s)
        y = F.avg_pool2d(F.pad(x, pads), k, s)
        if kind == "avg_include_pad":
            return y
        return y / F.avg_pool2d(F.pad(torch.ones_like(x), pads), k, s)

    compare(ours, theirs, {"x": x}, ["x"])


def test_same_padding_is_asymmetric_in_these_cases():
    """The cases above do reach an odd total (else they would not test the rule)."""
    assert _same(6, 3, 2) == (0, 1) and _same(4, 2, 1) == (0, 1) and _same(7, 2, 3) == (0, 1)


@pytest.mark.parametrize("case", ["floor", "ceil_overhang_with_padding", "rectangular"])
def test_max_pool_nan_propagates(case):
    xs, k, s, p, ceil = CASES[case]
    x = np.random.default_rng(3).standard_normal(xs)
    x.reshape(-1)[[3, 17, 30]] = np.nan
    g = og.Graph()
    xv = g.input("x", xs, "float64")
    y = og.max_pool2d(xv, k, s, p, ceil)
    (got,) = og.compile([y], dtype="float64")(x=x)
    want = F.max_pool2d(torch.tensor(x), k, s, p, ceil_mode=ceil).numpy()
    assert np.isnan(want).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[~np.isnan(want)], want[~np.isnan(want)])


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", ["floor", "ceil_overhang_with_padding", "padding_half_kernel"])
def test_max_pool_all_minus_inf_window(case, dtype):
    """Windows of -inf input cells (and -inf padding) give -inf; the gradient is
    finite and each window's gradient (non-overlapping windows) sums to its own."""
    xs, k, s, p, ceil = CASES[case]
    x = np.random.default_rng(4).standard_normal(xs)
    x[..., :3, :] = -np.inf
    g = og.Graph()
    xv = g.input("x", xs, dtype)
    y = og.max_pool2d(xv, k, s, p, ceil)
    (gx,) = og.grad(y, [xv])
    gy = np.random.default_rng(5).standard_normal(y.shape).astype(dtype)
    got_y, got_gx = og.compile([y, gx], dtype=dtype)(x=x.astype(dtype), grad_outputs={y: gy})
    want = F.max_pool2d(torch.tensor(x), k, s, p, ceil_mode=ceil).numpy()
    assert np.isneginf(want).any()
    np.testing.assert_array_equal(got_y, want.astype(dtype))
    assert np.all(np.isfinite(got_gx))
    np.testing.assert_allclose(got_gx.sum(), gy.astype(np.float64).sum(), rtol=1e-5)


def test_conv_bias_relu_max_pool_block_ties_from_relu_match_torch():
    """ReLU's zeros make tied maxima; the fused conv + bias + ReLU and the max-pool
    kernels of the default pipeline route them as PyTorch does, and ReLU's gradient
    at exactly 0 is 0 (zero weights and bias: every pre-activation is 0)."""
    rng = np.random.default_rng(6)
    feeds = {"x": rng.standard_normal((2, 3, 7, 7)), "w": rng.standard_normal((4, 3, 3, 3)),
             "b": rng.standard_normal(4) - 1.0}
    build = lambda x, w, b: og.max_pool2d(og.relu(og.conv2d(x, w, b, padding=1)), 3, 2, 1, True)  # noqa: E731
    theirs = lambda x, w, b: F.max_pool2d(F.relu(F.conv2d(x, w, b, padding=1)), 3, 2, 1, ceil_mode=True)  # noqa: E731
    compare(build, theirs, feeds, ["x", "w", "b"])
    zero = dict(feeds, w=np.zeros((4, 3, 3, 3)), b=np.zeros(4))
    grads = compare(build, theirs, zero, ["x", "w", "b"], double=False)
    assert np.all(grads["w"] == 0) and np.all(grads["b"] == 0)


def test_relu_nan_propagates_and_gradient_at_zero_is_zero():
    """An input holding NaN, +0.0 and -0.0: NaN stays NaN, the gradient at 0 is 0."""
    x = np.array([[[[-1.0, 0.0, 2.0], [np.nan, 0.0, -0.0]]]])
    g = og.Graph()
    xv = g.input("x", x.shape, "float64")
    y = og.relu(xv)
    (gx,) = og.grad(y, [xv])
    gy = np.full(x.shape, 3.0)
    got_y, got_gx = og.compile([y, gx], dtype="float64")(x=x, grad_outputs={y: gy})
    tx = torch.tensor(x, requires_grad=True)
    ty = F.relu(tx)
    (tgx,) = torch.autograd.grad(ty, tx, torch.tensor(gy))
    np.testing.assert_array_equal(got_y, ty.detach().numpy())  # NaN where NaN, equal elsewhere
    finite = ~np.isnan(x)
    np.testing.assert_array_equal(got_gx[finite], tgx.numpy()[finite])
    assert np.all(got_gx[x == 0] == 0)


@pytest.mark.parametrize("alg", ["direct", "gemm", "fft", "winograd"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_relu_fused_into_conv_propagates_nan(alg, dtype):
    """The inference pipeline fuses conv + bias + ReLU; a NaN input still gives NaN
    (not 0) in every output its window reads, as PyTorch."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 2, 6, 6))
    x[0, 1, 2, 3] = np.nan
    w, b = rng.standard_normal((3, 2, 3, 3)), rng.standard_normal(3)
    g = og.Graph()
    xv, wv, bv = g.input("x", x.shape, dtype), g.param("w", w.shape, dtype), g.param("b", b.shape, dtype)
    y = og.neg(og.relu(og.conv2d(xv, wv, bv, padding=1)))  # the fused chain is not an output
    run = og.compile([y], dtype=dtype, policy={"prefer": {"conv": [alg]}, "autotune": False})
    assert any(c.startswith(f"{alg}[cpu]:Conv2dBias") for c in run.choices.values()), run.choices
    (got,) = run(x=x.astype(dtype), w=w.astype(dtype), b=b.astype(dtype))
    want = -F.relu(F.conv2d(torch.tensor(x), torch.tensor(w), torch.tensor(b), padding=1)).numpy()
    nan = np.isnan(want)
    assert nan.sum() == 3 * 9
    if alg in ("fft", "winograd"):  # the transforms spread one NaN over a plane or tile
        assert np.all(np.isnan(got[nan]))
    else:
        np.testing.assert_array_equal(np.isnan(got), nan)
        np.testing.assert_allclose(got[~nan], want[~nan], rtol=1e-4, atol=1e-5)


def test_relu_gradient_at_zero_through_the_fused_gradient_kernels():
    """conv2(relu(conv1(x))) with half of conv1's channels exactly 0 before the ReLU:
    the fused backward-data + ReLU-gradient and ReLU-gradient + bias-sum kernels give
    those cells gradient 0, as PyTorch."""
    rng = np.random.default_rng(8)
    w1 = rng.standard_normal((4, 2, 3, 3))
    w1[:2] = 0.0
    feeds = {"x": rng.standard_normal((2, 2, 5, 5)), "w1": w1, "b1": np.array([0.0, 0.0, 0.3, -0.2]),
             "w2": rng.standard_normal((3, 4, 3, 3))}
    compare(lambda x, w1, b1, w2: og.conv2d(og.relu(og.conv2d(x, w1, b1, padding=1)), w2),
            lambda x, w1, b1, w2: F.conv2d(F.relu(F.conv2d(x, w1, b1, padding=1)), w2),
            feeds, ["x", "w1", "b1", "w2"], double=False,
            choices=lambda c: None if any("Conv2dBackwardDataRelu" in v for v in c.values()) else
            pytest.fail(f"no fused dgrad-relu node: {c}"))
