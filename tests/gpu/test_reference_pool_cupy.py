"""The reference pooling kernels (``backends/reference/pool.py``) run on CuPy,
where they are the GPU's last fallback, give the NumPy run's values: forward,
backward, the fused ReLU backward, average pooling both ways, NCHW and
channels-last, on the SEMANTICS.md cases (ties, NaN, -inf beside padding,
ceil_mode overhang, asymmetric padding). The kernels walk the tensor in
blocks on NumPy and as one block on CuPy: the values must not depend on it."""

from __future__ import annotations

import numpy as np
import pytest

from opgraph.backends.device import cuda_status
from opgraph.backends.reference import pool as ref_pool

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_status()[0], reason=f"no GPU: {cuda_status()[1]}")]

#: (x shape, kernel_size, stride, padding, ceil_mode)
CASES = [
    ((2, 3, 7, 9), (3, 3), (2, 2), ((0, 0), (0, 0)), False),
    ((2, 3, 8, 7), (3, 2), (2, 3), ((1, 0), (1, 1)), True),
    ((2, 4, 9, 10), (3, 3), (3, 3), ((0, 1), (1, 0)), True),
    ((4, 64, 28, 28), (3, 3), (2, 2), ((1, 1), (1, 1)), False),
]


def _data(rng, shape, kind):
    x = rng.standard_normal(shape).astype(np.float32)
    if kind == "ties":
        x = rng.integers(0, 3, shape).astype(np.float32)
    elif kind == "nan":
        x.flat[rng.choice(x.size, max(1, x.size // 20), replace=False)] = np.nan
    elif kind == "neg_inf":
        x[:, :, 0, :] = -np.inf
    return x


def _nhwc(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("kind", ["normal", "ties", "nan", "neg_inf"])
@pytest.mark.parametrize("case", CASES, ids=[str(c[0]) for c in CASES])
def test_the_reference_pooling_on_cupy_matches_numpy(cp, case, kind, layout):
    shape, k, s, pad, ceil = case
    rng = np.random.default_rng([len(shape), *shape, len(kind)])
    x = _data(rng, shape, kind)
    if layout == "NHWC":
        x = _nhwc(x)
    geo = dict(kernel_size=k, stride=s, padding=pad, ceil_mode=ceil)
    y = ref_pool.max_pool2d(np, x, **geo)
    gy = rng.standard_normal(y.shape).astype(np.float32)
    dx = cp.asarray(x) if layout == "NCHW" else cp.ascontiguousarray(cp.asarray(np.ascontiguousarray(
        x.transpose(0, 2, 3, 1)))).transpose(0, 3, 1, 2)
    dgy = cp.asarray(gy)
    checks = {
        "max": (ref_pool.max_pool2d(np, x, **geo), ref_pool.max_pool2d(cp, dx, **geo)),
        "max_backward": (ref_pool.max_pool2d_backward(np, x, gy, **geo),
                         ref_pool.max_pool2d_backward(cp, dx, dgy, **geo)),
        "max_backward_relu": (ref_pool.max_pool2d_backward_relu(np, x, gy, **geo),
                              ref_pool.max_pool2d_backward_relu(cp, dx, dgy, **geo)),
    }
    if kind == "normal":
        for include in (True, False):
            checks[f"avg{include}"] = (ref_pool.avg_pool2d(np, x, count_include_pad=include, **geo),
                                       ref_pool.avg_pool2d(cp, dx, count_include_pad=include, **geo))
            args = dict(count_include_pad=include, **geo)
            want = ref_pool.avg_pool2d_backward(np, gy, input_shape=shape, **args)
            got = ref_pool.avg_pool2d_backward(cp, dgy, input_shape=shape, **args)
            checks[f"avg_backward{include}"] = (want, got)
    for name, (want, got) in checks.items():
        np.testing.assert_allclose(cp.asnumpy(got), want, rtol=1e-6, atol=1e-6, equal_nan=True, err_msg=name)
