"""Mean over axes and its gradient on the reference kernels (ONNX ``ReduceMean``):
values, keepdim, float32 accumulation for half storage, the empty batch."""

import ml_dtypes
import numpy as np
import pytest

from opgraph.backends.reference import reduce as red
from opgraph.errors import ShapeError

from central_differences import numgrad


@pytest.mark.parametrize("axes, keepdim", [((2, 3), True), ((1,), False), ((0, 1, 2, 3), False), ((), True)])
def test_mean_and_its_gradient(axes, keepdim):
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5))
    y = red.mean(np, x, axes=axes, keepdim=keepdim)
    np.testing.assert_allclose(y, x.mean(axis=axes, keepdims=keepdim), rtol=1e-14)
    gy = np.random.default_rng(1).standard_normal(y.shape)
    g = red.mean_backward(np, gy, axes=axes, keepdim=keepdim, input_shape=x.shape)
    np.testing.assert_allclose(g, numgrad(lambda v: red.mean(np, v, axes=axes, keepdim=keepdim), x, gy),
                               atol=1e-9)


@pytest.mark.parametrize("storage", [np.float16, ml_dtypes.bfloat16])
def test_half_storage_accumulates_in_float32(storage):
    """4096 values of 64 sum to 262144, past float16's 65504: accumulated in float32."""
    x = np.full((1, 1, 64, 64), 64.0, storage)
    y = red.mean(np, x, axes=(2, 3), keepdim=True)
    assert y.dtype == storage and y.item() == 64.0


def test_empty_batch_and_errors():
    x = np.zeros((0, 3, 2, 2))
    assert red.mean(np, x, axes=(2, 3), keepdim=False).shape == (0, 3)
    assert red.mean_backward(np, np.zeros((0, 3)), axes=(2, 3), keepdim=False, input_shape=x.shape).shape == x.shape
    with pytest.raises(ShapeError, match="reduced shape"):
        red.mean_backward(np, np.zeros((2, 3)), axes=(2, 3), keepdim=True, input_shape=(2, 3, 4, 4))
