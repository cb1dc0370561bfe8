"""Softmax, log-softmax and cross-entropy on the reference kernels: agreement
with the float64 textbook formulas, stability with huge logits, batch size 0
and central-difference checks of every backward kernel."""

import numpy as np
import pytest

from opgraph.backends.reference import loss
from opgraph.errors import ExecutionError, ParameterError, ShapeError

from central_differences import numgrad


def direct_softmax(x, axis):
    """Textbook softmax, no max subtraction (fine for moderate float64 values)."""
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def direct_ce(logits, target):
    """Per-sample ``-log softmax[target]`` from the textbook formula."""
    p = direct_softmax(logits, 1)
    return -np.log(p[np.arange(len(target)), target])


@pytest.mark.parametrize("axis", [0, 1, -1, 2])
def test_softmax_and_log_softmax_match_direct_formula(axis):
    x = np.random.default_rng(0).standard_normal((3, 4, 5)) * 4
    want = direct_softmax(x, axis)
    np.testing.assert_allclose(loss.softmax(np, x, axis=axis), want, rtol=1e-13)
    np.testing.assert_allclose(loss.log_softmax(np, x, axis=axis), np.log(want), rtol=1e-12)


def test_huge_logits_are_finite():
    x = np.array([[1e30, -1e30, 0.0], [-1e30, -1e30, -1e30]])
    for dtype in (np.float32, np.float64):
        xd = x.astype(dtype)
        s = loss.softmax(np, xd, axis=1)
        ls = loss.log_softmax(np, xd, axis=1)
        assert np.isfinite(s).all() and np.isfinite(ls).all()
        np.testing.assert_allclose(s, [[1, 0, 0], [1 / 3, 1 / 3, 1 / 3]], rtol=1e-6)
        np.testing.assert_allclose(ls[0], [0.0, -2e30, -1e30], rtol=1e-6)
        np.testing.assert_allclose(ls[1], np.log(1 / 3), rtol=1e-6)
        ce = loss.cross_entropy(np, xd, np.array([0, 2]), reduction="sum")
        assert np.isfinite(ce) and ce.dtype == dtype
        np.testing.assert_allclose(ce, 0.0 + np.log(3.0), rtol=1e-6)
        ce = loss.cross_entropy(np, xd, np.array([1, 0]), reduction="mean")
        np.testing.assert_allclose(ce, (2e30 + np.log(3.0)) / 2, rtol=1e-6)
        g = loss.cross_entropy_backward(np, xd, np.array([1, 0]), np.array(1.0, dtype), reduction="mean")
        assert np.isfinite(g).all()
        np.testing.assert_allclose(g, [[0.5, -0.5, 0], [1 / 6 - 0.5, 1 / 6, 1 / 6]], rtol=1e-6, atol=1e-7)


def test_shift_invariance_of_softmax():
    x = np.random.default_rng(1).standard_normal((4, 6))
    np.testing.assert_allclose(loss.softmax(np, x + 1e3, axis=1), loss.softmax(np, x, axis=1),
                               rtol=1e-12)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy_matches_direct_formula(reduction):
    rng = np.random.default_rng(2)
    logits, target = rng.standard_normal((7, 5)) * 3, rng.integers(0, 5, 7)
    per = direct_ce(logits, target)
    want = per.mean() if reduction == "mean" else per.sum()
    got = loss.cross_entropy(np, logits, target, reduction=reduction)
    assert got.shape == ()
    np.testing.assert_allclose(got, want, rtol=1e-13)
    f32 = loss.cross_entropy(np, logits.astype(np.float32), target, reduction=reduction)
    assert f32.dtype == np.float32
    np.testing.assert_allclose(f32, want, rtol=1e-5)


@pytest.mark.parametrize("axis", [1, 0])
def test_softmax_backward_finite_differences(axis):
    rng = np.random.default_rng(3)
    x, gy = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    y = loss.softmax(np, x, axis=axis)
    want = numgrad(lambda v: loss.softmax(np, v, axis=axis), x, gy)
    np.testing.assert_allclose(loss.softmax_backward(np, y, gy, axis=axis), want, atol=1e-8)


@pytest.mark.parametrize("axis", [1, -1, 0])
def test_log_softmax_backward_finite_differences(axis):
    rng = np.random.default_rng(4)
    x, gy = rng.standard_normal((3, 2, 4)), rng.standard_normal((3, 2, 4))
    y = loss.log_softmax(np, x, axis=axis)
    want = numgrad(lambda v: loss.log_softmax(np, v, axis=axis), x, gy)
    np.testing.assert_allclose(loss.log_softmax_backward(np, y, gy, axis=axis), want, atol=1e-8)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy_backward_finite_differences(reduction):
    rng = np.random.default_rng(5)
    logits, target = rng.standard_normal((4, 6)), rng.integers(0, 6, 4)
    gy = np.array(1.7)
    want = numgrad(lambda v: loss.cross_entropy(np, v, target, reduction=reduction), logits, gy)
    got = loss.cross_entropy_backward(np, logits, target, gy, reduction=reduction)
    np.testing.assert_allclose(got, want, atol=1e-8)


def test_batch_size_zero():
    x = np.zeros((0, 5))
    t = np.zeros((0,), dtype=np.int64)
    assert loss.softmax(np, x, axis=1).shape == (0, 5)
    assert loss.log_softmax(np, x, axis=1).shape == (0, 5)
    assert loss.softmax_backward(np, x, x, axis=1).shape == (0, 5)
    assert loss.log_softmax_backward(np, x, x, axis=1).shape == (0, 5)
    for red in ("mean", "sum"):
        ce = loss.cross_entropy(np, x, t, reduction=red)
        assert ce.shape == () and ce == 0.0     # empty mean defined as 0 (documented)
        assert loss.cross_entropy_backward(np, x, t, np.array(1.0), reduction=red).shape == (0, 5)
    # an empty softmax axis gives an empty result, not an error
    assert loss.softmax(np, np.zeros((3, 0)), axis=1).shape == (3, 0)


def test_bad_input_raises():
    logits = np.zeros((2, 3))
    with pytest.raises(ExecutionError, match="3"):
        loss.cross_entropy(np, logits, np.array([0, 3]), reduction="mean")
    with pytest.raises(ExecutionError, match="-1"):
        loss.cross_entropy(np, logits, np.array([-1, 0]), reduction="mean")
    with pytest.raises(ParameterError, match="reduction"):
        loss.cross_entropy(np, logits, np.array([0, 1]), reduction="none")
    with pytest.raises(ShapeError, match="integer"):
        loss.cross_entropy(np, logits, np.array([0.0, 1.0]), reduction="sum")
    with pytest.raises(ShapeError):
        loss.cross_entropy(np, logits, np.array([0]), reduction="sum")
    with pytest.raises(ParameterError, match="axis"):
        loss.softmax(np, logits, axis=2)
