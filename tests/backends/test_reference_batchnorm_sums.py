"""Reference kernels of the training batch norm's backward from its per-channel
sums (``ops/batchnorm_sums.py``): the sums against the float64 formulas and
PyTorch's weight and bias gradients, kept in float32 for half storage; the row
rounded to the storage dtype; the data gradient from the stacked sums against
the unfused kernel and PyTorch, both layouts."""

import ml_dtypes
import numpy as np
import pytest

from opgraph.backends.reference import batchnorm_training as bn
from opgraph.errors import ShapeError

AXES = (0, 2, 3)


def _data(seed=3, shape=(4, 3, 5, 2), layout="NCHW"):
    rng = np.random.default_rng(seed)
    x, gy = 5.0 + 2.0 * rng.standard_normal(shape), rng.standard_normal(shape)
    if layout == "NHWC":  # channels-last arrays, as the layout pass stores them
        x, gy = (np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2) for a in (x, gy))
    return x, gy


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_sums_are_the_bias_and_weight_gradients_of_pytorch(layout):
    torch = pytest.importorskip("torch")
    x, gy = _data(layout=layout)
    eps = 1e-3
    sums = bn.batch_norm_training_backward_sums(np, x, bn.batch_norm_stats(np, x), gy, eps=eps)
    xhat = (x - x.mean(axis=AXES, keepdims=True)) / np.sqrt(x.var(axis=AXES, keepdims=True) + eps)
    assert sums.shape == (2, 3) and sums.dtype == np.float64
    np.testing.assert_allclose(sums[0], gy.sum(axis=AXES), rtol=1e-13)
    np.testing.assert_allclose(sums[1], (gy * xhat).sum(axis=AXES), rtol=1e-12, atol=1e-13)
    tw, tb = torch.ones(3, dtype=torch.float64, requires_grad=True), torch.zeros(3, dtype=torch.float64,
                                                                               requires_grad=True)
    torch.nn.functional.batch_norm(torch.tensor(x), None, None, tw, tb, training=True, eps=eps).backward(
        torch.tensor(gy))
    np.testing.assert_allclose(sums, np.stack([tb.grad.numpy(), tw.grad.numpy()]), rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("storage", [ml_dtypes.bfloat16, np.float16])
def test_half_storage_keeps_the_sums_in_float32_and_rounds_the_rows(storage):
    """The sums are the float32 sums of the stored values, not rounded to the
    storage dtype; each row is rounded once when taken out."""
    x, gy = (a.astype(storage) for a in _data())
    stats = bn.batch_norm_stats(np, x)
    sums = bn.batch_norm_training_backward_sums(np, x, stats, gy, eps=1e-5)
    assert sums.dtype == np.float32
    wide = bn.batch_norm_training_backward_sums(np, x.astype(np.float32), stats, gy.astype(np.float32), eps=1e-5)
    np.testing.assert_array_equal(sums, wide)
    for row in (0, 1):
        got = bn.batch_norm_backward_sums_row(np, sums, gy, row=row)
        assert got.dtype == storage and got.shape == (3,)
        np.testing.assert_array_equal(got, sums[row].astype(storage))
    np.testing.assert_array_equal(bn.batch_norm_backward_sums_row(np, sums, gy, row=1),
                                  bn.batch_norm_training_backward_scale(np, x, stats, gy, eps=1e-5))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("weight", [None, np.array([1.5, -0.5, 2.0])])
def test_data_gradient_from_sums_is_the_unfused_one_and_pytorchs(weight, layout):
    """The stacked sums (weight factored out) give the data gradient: float64,
    both layouts, against the unfused kernel and PyTorch's autograd of
    ``batch_norm(training=True)``."""
    torch = pytest.importorskip("torch")
    x, gy = _data(layout=layout)
    eps = 1e-3
    stats = bn.batch_norm_stats(np, x)
    sums = bn.batch_norm_training_backward_sums(np, x, stats, gy, eps=eps)
    got = bn.batch_norm_training_backward_data_from_sums(np, gy, x, stats, sums, weight, eps=eps)
    np.testing.assert_allclose(got, bn.batch_norm_training_backward_data(np, gy, x, stats, weight, eps=eps),
                               rtol=1e-12, atol=1e-14)
    tx = torch.tensor(x, requires_grad=True)
    tw = None if weight is None else torch.tensor(weight)
    torch.nn.functional.batch_norm(tx, None, None, tw, training=True, eps=eps).backward(torch.tensor(gy))
    np.testing.assert_allclose(got, tx.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_the_kernels_check_the_sums_shape():
    x, gy = _data()
    stats = bn.batch_norm_stats(np, x)
    with pytest.raises(ShapeError, match=r"from_sums: sums must have shape \(2, 3\), got \(2, 4\)"):
        bn.batch_norm_training_backward_data_from_sums(np, gy, x, stats, np.zeros((2, 4)), eps=1e-5)
    with pytest.raises(ShapeError, match=r"sums_row: sums must have shape \(2, 3\), got \(3,\)"):
        bn.batch_norm_backward_sums_row(np, np.zeros(3), gy, row=0)
    with pytest.raises(ShapeError, match=r"backward_sums: stats must have shape \(2, 3\)"):
        bn.batch_norm_training_backward_sums(np, x, stats[:, :2], gy, eps=1e-5)
