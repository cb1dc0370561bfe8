"""SEMANTICS.md rules of training-form batch norm on the reference kernels: biased
variance in the normalisation, unbiased in the running update, momentum, the
empty batch, statistics and sums in float32 for half storage, and the
Ioffe & Szegedy backward against central differences of the whole forward
(statistics recomputed)."""

import ml_dtypes
import numpy as np
import pytest

from opgraph.errors import ShapeError
from opgraph.backends.reference import batchnorm_training as bn

from central_differences import numgrad

AXES = (0, 2, 3)


def _x(shape=(4, 3, 5, 2), seed=0):
    return 5.0 + 2.0 * np.random.default_rng(seed).standard_normal(shape)


def test_statistics_are_the_mean_and_the_biased_variance():
    x = _x()
    stats = bn.batch_norm_stats(np, x)
    np.testing.assert_allclose(stats[0], x.mean(axis=AXES), rtol=1e-14)
    np.testing.assert_allclose(stats[1], x.var(axis=AXES, ddof=0), rtol=1e-13)


def test_normalisation_uses_the_biased_variance():
    x, eps = _x(), 1e-3
    w, b = np.array([1.0, 2.0, -0.5]), np.array([0.0, 1.0, 3.0])
    y = bn.batch_norm_training(np, x, bn.batch_norm_stats(np, x), w, b, eps=eps)
    mean, var = x.mean(axis=AXES, keepdims=True), x.var(axis=AXES, keepdims=True)
    want = (x - mean) / np.sqrt(var + eps) * w[:, None, None] + b[:, None, None]
    np.testing.assert_allclose(y, want, rtol=1e-13)


@pytest.mark.parametrize("momentum", [0.1, 0.0, 1.0, 0.3])
def test_running_update_uses_the_unbiased_variance_and_momentum(momentum):
    x = _x()
    n = x.size // x.shape[1]
    stats = bn.batch_norm_stats(np, x)
    rm, rv = np.array([0.5, -1.0, 2.0]), np.array([1.0, 4.0, 0.25])
    new_m = bn.batch_norm_running_update(np, stats, rm, statistic="mean", momentum=momentum, count=n)
    new_v = bn.batch_norm_running_update(np, stats, rv, statistic="var", momentum=momentum, count=n)
    np.testing.assert_allclose(new_m, (1 - momentum) * rm + momentum * x.mean(axis=AXES), rtol=1e-14)
    np.testing.assert_allclose(new_v, (1 - momentum) * rv + momentum * x.var(axis=AXES, ddof=1), rtol=1e-13)


def test_empty_batch_gives_empty_output_zero_gradients_and_unchanged_running_statistics():
    x = np.zeros((0, 3, 4, 4))
    stats = bn.batch_norm_stats(np, x)
    np.testing.assert_array_equal(stats, np.zeros((2, 3)))
    assert bn.batch_norm_training(np, x, stats, eps=1e-5).shape == x.shape
    assert bn.batch_norm_training_backward_data(np, x, x, stats, eps=1e-5).shape == x.shape
    np.testing.assert_array_equal(bn.batch_norm_training_backward_scale(np, x, stats, x, eps=1e-5), 0)
    rv = np.array([1.0, 2.0, 3.0])
    np.testing.assert_array_equal(
        bn.batch_norm_running_update(np, stats, rv, statistic="var", momentum=0.1, count=0), rv)


@pytest.mark.parametrize("weight", [None, np.array([1.5, -0.5, 2.0])])
def test_backward_kernels_against_central_differences_of_the_forward(weight):
    """The statistics are recomputed from the perturbed x: the data gradient is the
    total derivative (Ioffe & Szegedy 2015, sec. 3), through mean and variance."""
    rng = np.random.default_rng(1)
    x, gy, eps = _x((3, 3, 2, 2)), rng.standard_normal((3, 3, 2, 2)), 1e-2

    def forward(v, w=weight):
        return bn.batch_norm_training(np, v, bn.batch_norm_stats(np, v), w, eps=eps)

    stats = bn.batch_norm_stats(np, x)
    np.testing.assert_allclose(bn.batch_norm_training_backward_data(np, gy, x, stats, weight, eps=eps),
                               numgrad(forward, x, gy), atol=1e-8)
    w0 = np.array([1.0, 1.0, 1.0]) if weight is None else weight
    np.testing.assert_allclose(bn.batch_norm_training_backward_scale(np, x, stats, gy, eps=eps),
                               numgrad(lambda w: forward(x, w), w0, gy), atol=1e-8)

    v = rng.standard_normal(x.shape)  # the double-backward kernel: d <v, dx> / dx

    def data_grad(u):
        return bn.batch_norm_training_backward_data(np, gy, u, bn.batch_norm_stats(np, u), weight, eps=eps)

    np.testing.assert_allclose(bn.batch_norm_training_double_backward(np, v, gy, x, stats, weight, eps=eps),
                               numgrad(data_grad, x, v), atol=1e-7)


@pytest.mark.parametrize("storage", [np.float16, ml_dtypes.bfloat16])
def test_half_storage_keeps_float32_statistics_and_rounds_results_once(storage):
    """Sums of a float16 channel would overflow (300 * 512 > 65504): in float32 they do not."""
    x = (300.0 + np.random.default_rng(2).standard_normal((8, 2, 8, 8))).astype(storage)
    stats = bn.batch_norm_stats(np, x)
    assert stats.dtype == np.float32 and np.all(np.isfinite(stats))
    np.testing.assert_array_equal(stats, bn.batch_norm_stats(np, x.astype(np.float32)))
    w, b = np.array([1.0, 2.0], storage), np.array([0.5, -0.5], storage)
    y = bn.batch_norm_training(np, x, stats, w, b, eps=1e-5)
    want = bn.batch_norm_training(np, x.astype(np.float32), stats, w.astype(np.float32),
                                  b.astype(np.float32), eps=1e-5)
    assert y.dtype == storage
    np.testing.assert_array_equal(y, want.astype(storage))
    gy = np.ones_like(x)
    for kernel, args in [(bn.batch_norm_training_backward_data, (gy, x, stats, w)),
                         (bn.batch_norm_training_backward_scale, (x, stats, gy))]:
        got = kernel(np, *args, eps=1e-5)
        full = kernel(np, *(a.astype(np.float32) if a.dtype == storage else a for a in args), eps=1e-5)
        assert got.dtype == storage
        np.testing.assert_array_equal(got, full.astype(storage))
    rv = np.ones(2, storage)
    new = bn.batch_norm_running_update(np, stats, rv, statistic="var", momentum=0.1, count=512)
    assert new.dtype == storage
    np.testing.assert_array_equal(new, (0.9 + 0.1 * stats[1] * (512 / 511)).astype(storage))
