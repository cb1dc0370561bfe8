"""Dropout's reference kernel and its counter-based keep mask
(backends/reference/dropout.py): the mask is SplitMix64 of (seed, logical
index) compared on integers, checked here against a plain-Python SplitMix64
written from the paper's recurrence (state += GOLDEN; z = mix(state)), not
against the vectorised code itself."""

import numpy as np
import pytest

from opgraph.backends.reference import dropout as dr

from central_differences import numgrad

_M = (1 << 64) - 1


def _splitmix_draws(seed, count):
    """The first ``count`` 24-bit draws of SplitMix64 seeded with mix(seed), one at a time."""
    def mix(z):
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M
        return z ^ (z >> 31)
    state, out = mix(seed & _M), []
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) & _M
        out.append(mix(state) >> 40)
    return np.array(out)


@pytest.mark.parametrize("seed", [0, 1, 42, 2 ** 63 + 5, 2 ** 70 + 3])
def test_mask_is_splitmix64_of_the_logical_index(seed):
    p = 0.37
    mask = dr.keep_mask(np, (3, 5, 7), seed=seed, p=p)
    want = _splitmix_draws(seed, 3 * 5 * 7) >= np.ceil(p * 2 ** 24)
    np.testing.assert_array_equal(mask.reshape(-1), want)


def test_threshold_edges():
    assert dr.keep_threshold(0.0) == 0 and dr.keep_threshold(1.0) == 2 ** 24
    assert dr.keep_threshold(0.5) == 2 ** 23 and dr.keep_threshold(2 ** -25) == 1
    assert dr.keep_mask(np, (100,), seed=3, p=0.0).all()
    assert not dr.keep_mask(np, (100,), seed=3, p=1.0).any()


def test_keep_rate_and_independence_of_seeds():
    m1 = dr.keep_mask(np, (200, 500), seed=1, p=0.3)
    m2 = dr.keep_mask(np, (200, 500), seed=2, p=0.3)
    assert abs(m1.mean() - 0.7) < 0.01 and abs(m2.mean() - 0.7) < 0.01
    assert abs((m1 & m2).mean() - 0.49) < 0.01  # two seeds: independent-looking masks


def test_dropout_inference_is_an_identity_copy():
    x = np.random.default_rng(4).standard_normal((3, 4))
    y = dr.dropout(np, x, p=0.5, training=False, seed=1)
    np.testing.assert_array_equal(y, x)
    assert not np.shares_memory(x, y)
    np.testing.assert_array_equal(dr.dropout(np, x, p=0.0, training=True, seed=1), x)


def test_dropout_training_mask_scale_and_seed():
    x = np.random.default_rng(5).standard_normal((4, 8, 5, 5)) + 10.0   # never 0
    p = 0.3
    y = dr.dropout(np, x, p=p, training=True, seed=42)
    keep = dr.keep_mask(np, x.shape, seed=42, p=p)
    np.testing.assert_allclose(y, np.where(keep, x / (1 - p), 0.0), rtol=1e-15)
    assert abs((y != 0).mean() - (1 - p)) < 0.05
    np.testing.assert_array_equal(dr.dropout(np, x, p=p, training=True, seed=42), y)   # seeded
    assert not np.array_equal(dr.dropout(np, x, p=p, training=True, seed=43), y)
    assert y.dtype == x.dtype
    assert dr.dropout(np, x.astype(np.float32), p=p, training=True, seed=42).dtype == np.float32


def test_mask_follows_the_logical_index_in_either_layout():
    x = np.random.default_rng(8).standard_normal((2, 6, 3, 4)) + 10.0
    nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    kw = dict(p=0.5, training=True, seed=9)
    np.testing.assert_array_equal(dr.dropout(np, nhwc, **kw), dr.dropout(np, x, **kw))


def test_dropout_p_one_gives_zeros():
    x = np.array([1.0, np.inf, -3.0])
    np.testing.assert_array_equal(dr.dropout(np, x, p=1.0, training=True, seed=0), 0.0)


def test_dropout_backward_is_dropout_of_gy():
    rng = np.random.default_rng(6)
    x, gy = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 4))
    kw = dict(p=0.4, training=True, seed=7)
    want = numgrad(lambda v: dr.dropout(np, v, **kw), x, gy)
    np.testing.assert_allclose(dr.dropout(np, gy, **kw), want, atol=1e-8)


def test_batch_size_zero():
    x = np.zeros((0, 3, 4, 4))
    assert dr.dropout(np, x, p=0.5, training=True, seed=0).shape == x.shape
