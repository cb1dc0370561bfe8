"""Layer norm on the reference kernels: values, and the backward kernels against
central differences of the forward (statistics recomputed per row)."""

import numpy as np
import pytest

from opgraph.backends.reference import layer_norm as ln

from central_differences import numgrad


def test_layer_norm_normalises_each_row_with_the_biased_variance():
    x = 3.0 + np.random.default_rng(0).standard_normal((2, 3, 5))
    w, b = np.arange(1.0, 6.0), np.full(5, 0.5)
    y = ln.layer_norm(np, x, w, b, normalized_shape=(5,), eps=1e-3)
    want = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-3) * w + b
    np.testing.assert_allclose(y, want, rtol=1e-13)
    y2 = ln.layer_norm(np, x, normalized_shape=(3, 5), eps=1e-3)
    m, v = x.mean((1, 2), keepdims=True), x.var((1, 2), keepdims=True)
    np.testing.assert_allclose(y2, (x - m) / np.sqrt(v + 1e-3), rtol=1e-13)


@pytest.mark.parametrize("weight", [False, True])
def test_layer_norm_backward_kernels_against_central_differences(weight):
    """The same arithmetic over the last axes, with a weight that varies along the row."""
    rng = np.random.default_rng(3)
    x, gy, ns = 1.0 + 2.0 * rng.standard_normal((3, 2, 4)), rng.standard_normal((3, 2, 4)), (4,)
    w = rng.standard_normal(4) if weight else None

    def forward(v, w=w):
        return ln.layer_norm(np, v, w, normalized_shape=ns, eps=1e-2)

    np.testing.assert_allclose(ln.layer_norm_backward_data(np, gy, x, w, normalized_shape=ns, eps=1e-2),
                               numgrad(forward, x, gy), atol=1e-8)
    np.testing.assert_allclose(ln.layer_norm_backward_scale(np, x, gy, normalized_shape=ns, eps=1e-2),
                               numgrad(lambda u: forward(x, u), np.ones(4) if w is None else w, gy), atol=1e-8)
    v = rng.standard_normal(x.shape)
    data_grad = lambda u: ln.layer_norm_backward_data(np, gy, u, w, normalized_shape=ns, eps=1e-2)  # noqa: E731
    np.testing.assert_allclose(ln.layer_norm_double_backward(np, v, gy, x, w, normalized_shape=ns, eps=1e-2),
                               numgrad(data_grad, x, v), atol=1e-7)
