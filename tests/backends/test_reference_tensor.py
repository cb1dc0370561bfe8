"""Flatten, reshape, concat, slice and pad on the reference kernels, with the
backward kernels checked by central differences and as exact adjoints."""

import numpy as np
import pytest

from opgraph.backends.reference import tensor
from opgraph.errors import ParameterError, ShapeError

from central_differences import numgrad


@pytest.mark.parametrize("shape,start,want", [
    ((2, 3, 4, 5), 1, (2, 60)),
    ((2, 3, 4, 5), 2, (2, 3, 20)),
    ((2, 3, 4, 5), 0, (120,)),
    ((0, 3, 4, 5), 1, (0, 60)),      # batch 0: the merged extent is computed, not inferred
    ((2, 0, 4, 5), 1, (2, 0)),
    ((2, 3, 4, 5), -1, (2, 3, 4, 5)),
])
def test_flatten(shape, start, want):
    x = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
    y = tensor.flatten(np, x, start_dim=start)
    assert y.shape == want
    np.testing.assert_array_equal(y.ravel(), x.ravel())   # row-major order kept
    assert not np.shares_memory(x, y)


def test_flatten_bad_start_dim():
    with pytest.raises(ParameterError, match="start_dim"):
        tensor.flatten(np, np.zeros((2, 3)), start_dim=2)


def test_reshape():
    x = np.arange(24.0).reshape(2, 3, 4)
    np.testing.assert_array_equal(tensor.reshape(np, x, shape=(6, 4)), np.arange(24.0).reshape(6, 4))
    assert tensor.reshape(np, x, shape=(4, -1)).shape == (4, 6)
    assert tensor.reshape(np, np.zeros((0, 3)), shape=(0, 3, 1)).shape == (0, 3, 1)
    with pytest.raises(ShapeError):
        tensor.reshape(np, x, shape=(5, 5))


def test_concat_channels_with_empty_inputs():
    rng = np.random.default_rng(0)
    a, b, e = rng.standard_normal((2, 3, 4, 4)), rng.standard_normal((2, 1, 4, 4)), np.zeros((2, 0, 4, 4))
    y = tensor.concat(np, a, e, b, axis=1)
    assert y.shape == (2, 4, 4, 4)
    np.testing.assert_array_equal(y[:, :3], a)
    np.testing.assert_array_equal(y[:, 3:], b)
    assert tensor.concat(np, np.zeros((0, 3, 2, 2)), np.zeros((0, 2, 2, 2)), axis=1).shape == (0, 5, 2, 2)


def test_concat_errors():
    a = np.zeros((2, 3, 4, 4))
    with pytest.raises(ShapeError, match="input 1"):
        tensor.concat(np, a, np.zeros((2, 3, 4, 5)), axis=1)
    with pytest.raises(ShapeError):
        tensor.concat(np, a, np.zeros((2, 3, 4)), axis=1)
    with pytest.raises(ParameterError, match="axis"):
        tensor.concat(np, a, a, axis=4)
    with pytest.raises(ShapeError):
        tensor.concat(np, axis=1)


def test_slice_and_backward():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 5, 3))
    kw = dict(axis=1, start=1, stop=4)
    y = tensor.slice_(np, x, **kw)
    np.testing.assert_array_equal(y, x[:, 1:4])
    assert not np.shares_memory(x, y)
    assert tensor.take_slice is tensor.slice_
    gy = rng.standard_normal(y.shape)
    gx = tensor.slice_backward(np, gy, input_shape=x.shape, **kw)
    np.testing.assert_allclose(gx, numgrad(lambda v: tensor.slice_(np, v, **kw), x, gy), atol=1e-8)
    assert not gx[:, 0].any() and not gx[:, 4].any()   # zero-filled outside the slice
    with pytest.raises(ShapeError):
        tensor.slice_backward(np, np.zeros((2, 2, 3)), input_shape=x.shape, **kw)
    with pytest.raises(ParameterError, match="axis"):
        tensor.slice_(np, x, axis=3, start=0, stop=1)


def test_slice_batch_zero():
    y = tensor.slice_(np, np.zeros((0, 4, 2, 2)), axis=1, start=0, stop=2)
    assert y.shape == (0, 2, 2, 2)
    g = tensor.slice_backward(np, y, axis=1, start=0, stop=2, input_shape=(0, 4, 2, 2))
    assert g.shape == (0, 4, 2, 2)


def test_pad_values_and_value():
    x = np.arange(4.0).reshape(1, 1, 2, 2)
    y = tensor.pad(np, x, padding=((1, 0), (0, 2)), value=-np.inf)
    want = np.array([[-np.inf] * 4, [0, 1, -np.inf, -np.inf], [2, 3, -np.inf, -np.inf]])
    np.testing.assert_array_equal(y[0, 0], want)


def test_pad_backward_is_the_adjoint_and_matches_differences():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 2, 3, 4))
    padding = ((2, 1), (0, 3))
    y = tensor.pad(np, x, padding=padding, value=0.0)
    assert y.shape == (2, 2, 6, 7)
    gy = rng.standard_normal(y.shape)
    gx = tensor.pad_backward(np, gy, padding=padding)
    assert np.sum(y * gy) == pytest.approx(np.sum(x * gx), rel=1e-12)
    want = numgrad(lambda v: tensor.pad(np, v, padding=padding, value=5.0), x, gy)
    np.testing.assert_allclose(gx, want, atol=1e-8)
    with pytest.raises(ShapeError):
        tensor.pad_backward(np, np.zeros((1, 1, 2, 2)), padding=((2, 1), (0, 0)))


def test_pad_batch_zero():
    y = tensor.pad(np, np.zeros((0, 3, 2, 2)), padding=((1, 1), (1, 1)), value=0.0)
    assert y.shape == (0, 3, 4, 4)
    assert tensor.pad_backward(np, y, padding=((1, 1), (1, 1))).shape == (0, 3, 2, 2)


def test_channels_last_inputs_give_channels_last_outputs():
    """concat, slice, slice_backward and pad_backward keep NHWC storage (the
    layout pass's plan on cuda), with the same values as NCHW."""
    from opgraph.types import is_channels_last, to_layout

    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((2, 2, 4, 5))
    ca, cb = to_layout(np, a, "NHWC"), to_layout(np, b, "NHWC")
    cat = tensor.concat(np, ca, cb, axis=1)
    assert is_channels_last(cat)
    np.testing.assert_array_equal(cat, tensor.concat(np, a, b, axis=1))
    part = tensor.slice_(np, cat, axis=1, start=1, stop=4)
    assert is_channels_last(part)
    np.testing.assert_array_equal(part, np.concatenate([a, b], axis=1)[:, 1:4])
    back = tensor.slice_backward(np, part, axis=1, start=1, stop=4, input_shape=cat.shape)
    assert is_channels_last(back)
    np.testing.assert_array_equal(back, tensor.slice_backward(np, np.ascontiguousarray(part), axis=1,
                                                              start=1, stop=4, input_shape=cat.shape))
    crop = tensor.pad_backward(np, ca, padding=((1, 0), (0, 2)))
    assert is_channels_last(crop)
    np.testing.assert_array_equal(crop, a[:, :, 1:, :3])
    mixed = tensor.concat(np, ca, b, axis=1)  # mixed layouts: plain concatenation
    np.testing.assert_array_equal(mixed, np.concatenate([a, b], axis=1))
