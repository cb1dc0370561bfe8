"""SEMANTICS.md "Others" rules against PyTorch (CPU, float64), through ``og.compile``'s
default CPU pipeline: LRN's window (odd sizes: ``F.local_response_norm``; even sizes:
the ONNX window, written here in PyTorch ops), linear with no input features,
numerically stable softmax / log-softmax / cross-entropy on huge logits (float32
storage too), and concat of empty inputs."""

import numpy as np
import pytest

import opgraph as og

from .torch_compare import compare

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _lrn_onnx(x, size, alpha, beta, k):
    """SEMANTICS.md's window: c - floor((size-1)/2) .. c + ceil((size-1)/2), clipped."""
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = F.pad((x * x).unsqueeze(1), (0, 0, 0, 0, lo, hi)).squeeze(1)  # zero channels outside
    window = sum(sq[:, i:i + x.shape[1]] for i in range(size))
    return x / (k + alpha / size * window) ** beta


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("channels", [1, 3, 7])
def test_lrn_window_matches_torch_and_onnx(size, channels):
    x = np.random.default_rng(size).standard_normal((2, channels, 3, 2)) * 2.0
    alpha, beta, k = 0.3, 0.75, 1.5
    compare(lambda x: og.local_response_norm(x, size, alpha, beta, k),
            lambda x: _lrn_onnx(x, size, alpha, beta, k), {"x": x}, ["x"], double=False)
    if size % 2:  # the same as PyTorch's own for odd sizes
        compare(lambda x: og.local_response_norm(x, size, alpha, beta, k),
                lambda x: F.local_response_norm(x, size, alpha, beta, k), {"x": x}, ["x"], double=False)


def test_lrn_even_size_differs_from_torch():
    """The documented difference: PyTorch puts an even window's extra channel low."""
    x = torch.tensor(np.random.default_rng(0).standard_normal((1, 5, 2, 2)))
    assert not torch.allclose(_lrn_onnx(x, 4, 1.0, 0.75, 1.0), F.local_response_norm(x, 4, 1.0, 0.75, 1.0))


@pytest.mark.parametrize("n", [0, 3])
def test_linear_with_zero_in_features_is_the_bias(n):
    rng = np.random.default_rng(1)
    feeds = {"x": np.zeros((n, 0)), "w": np.zeros((4, 0)), "b": rng.standard_normal(4)}
    compare(lambda x, w, b: og.linear(x, w, b), F.linear, feeds, ["x", "w", "b"])


def test_linear_matches_torch():
    rng = np.random.default_rng(2)
    feeds = {"x": rng.standard_normal((3, 5)), "w": rng.standard_normal((4, 5)), "b": rng.standard_normal(4)}
    compare(lambda x, w, b: og.linear(x, w, b), F.linear, feeds, ["x", "w", "b"])


HUGE = np.array([[1e4, -1e4, 3.0, 1e4 - 1.0], [-3e4, -3e4 + 2.0, -3e4 + 1.0, -1e5], [80.0, 90.0, 100.0, 110.0]])


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
def test_softmax_family_on_huge_logits_matches_torch(fn):
    compare(lambda x: getattr(og, fn)(x), lambda x: getattr(F, fn)(x, dim=1), {"x": HUGE}, ["x"], double=False)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_cross_entropy_on_huge_logits_is_finite_and_matches_torch(reduction, dtype):
    target = np.array([1, 3, 0])
    g = og.Graph()
    x = g.input("x", HUGE.shape, dtype)
    t = g.input("t", target.shape, "int64")
    outs = [og.cross_entropy(x, t, reduction), og.softmax(x), og.log_softmax(x)]
    (gx,) = og.grad(outs[0], [x])
    got = og.compile([*outs, gx], dtype=dtype)(x=HUGE.astype(dtype), t=target)
    tx = torch.tensor(HUGE, requires_grad=True)
    tl = F.cross_entropy(tx, torch.tensor(target), reduction=reduction)
    (tgx,) = torch.autograd.grad(tl, tx)
    want = [tl.detach().numpy(), F.softmax(tx, 1).detach().numpy(), F.log_softmax(tx, 1).detach().numpy(),
            tgx.numpy()]
    rtol = 1e-10 if dtype == "float64" else 1e-5
    for name, o, w in zip(["loss", "softmax", "log_softmax", "grad"], got, want):
        assert np.all(np.isfinite(o)), name
        np.testing.assert_allclose(np.asarray(o, np.float64), w, rtol=rtol, atol=rtol * np.abs(w).max(), err_msg=name)


def test_concat_with_empty_inputs_matches_torch():
    rng = np.random.default_rng(3)
    feeds = {"a": rng.standard_normal((2, 0, 3, 3)), "b": rng.standard_normal((2, 2, 3, 3)),
             "c": rng.standard_normal((2, 0, 3, 3)), "d": rng.standard_normal((2, 3, 3, 3))}
    compare(lambda a, b, c, d: og.concat([a, b, c, d]), lambda a, b, c, d: torch.cat([a, b, c, d], 1),
            feeds, ["a", "b", "c", "d"])


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # the overflow is the point
@pytest.mark.parametrize("alg", ["direct", "gemm", "fft", "winograd"])
def test_float16_storage_overflow_gives_inf_not_a_clamped_value(alg):
    """Sums accumulate in float32 and round once to float16: 3 * 3 * 90000 > 65504 is inf
    (PyTorch float64 gives the finite value; its float16 rounding is inf)."""
    x = np.full((1, 1, 4, 4), 300.0, np.float16)
    w = np.full((2, 1, 3, 3), 100.0, np.float16)
    w[1] = 0.5  # 9 * 150 = 1350: finite
    g = og.Graph()
    xv, wv = g.input("x", x.shape, "float16"), g.param("w", w.shape, "float16")
    y = og.conv2d(xv, wv, padding=1)
    (got,) = og.compile([y], policy={"prefer": {"conv": [alg]}, "autotune": False})(x=x, w=w)
    want = F.conv2d(torch.tensor(x, dtype=torch.float64), torch.tensor(w, dtype=torch.float64), padding=1)
    want16 = want.numpy().astype(np.float16)
    assert got.dtype == np.float16
    assert np.isposinf(want16[0, 0]).any()
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want16))
    np.testing.assert_allclose(got[0, 1].astype(np.float64), want.numpy()[0, 1], rtol=1e-3)
