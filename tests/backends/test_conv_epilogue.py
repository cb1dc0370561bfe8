"""The epilogue every convolution algorithm without a fused kernel applies on
its fresh output (``backends/reference/conv_epilogue.py``; cuDNN's fallback
too), against the unfused reference ops on NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from opgraph.backends.reference.activation import hardtanh
from opgraph.backends.reference.conv_epilogue import apply_epilogue
from opgraph.backends.reference.elementwise import relu, relu_backward
from opgraph.errors import ParameterError
from opgraph.types import numpy_dtype


@pytest.fixture
def rng():
    return np.random.default_rng(11)


def _data(rng, dtype=np.float64):
    y = 4 * rng.standard_normal((2, 3, 4, 5))
    y[0, 0, 0, :4] = [np.nan, np.inf, -np.inf, 6.0]
    b, r = rng.standard_normal(3), 4 * rng.standard_normal(y.shape)
    return y.astype(dtype), b.astype(dtype), r.astype(dtype)


@pytest.mark.parametrize("steps", [("bias",), ("bias", "relu"), ("bias", "add"), ("bias", "add", "relu"),
                                   ("bias", "relu6"), ("bias", "add", "relu6")])
def test_forward_steps_are_the_unfused_ops(rng, steps):
    y, b, r = _data(rng)
    want = y + b[None, :, None, None]
    if "add" in steps:
        want = want + r
    if "relu" in steps:
        want = relu(np, want)
    if "relu6" in steps:
        want = hardtanh(np, want, min_val=0.0, max_val=6.0)
    operands = [b] + ([r] if "add" in steps else [])
    got = apply_epilogue(np, steps, y.copy(), operands)
    np.testing.assert_array_equal(got, want)  # NaN propagates, +-inf clipped as the reference does


def test_backward_data_relu_mask_is_relu_backward(rng):
    gx, y_relu = rng.standard_normal((2, 3, 4, 5)), np.maximum(rng.standard_normal((2, 3, 4, 5)), 0)
    gx[0, 0, 0, 0], y_relu[0, 0, 0, 0] = np.inf, 0.0  # a blocked infinite gradient gives 0, not NaN
    y_relu[0, 0, 0, 1] = np.nan
    got = apply_epilogue(np, ("drelu",), gx.copy(), [y_relu])
    np.testing.assert_array_equal(got, relu_backward(np, y_relu, gx))
    assert got[0, 0, 0, 0] == 0 and got[0, 0, 0, 1] == 0


def test_in_place_on_half_storage(rng):
    """The cuDNN fallback applies it on the output in the storage dtype."""
    bf = numpy_dtype("bfloat16")
    y, b, r = (a.astype(bf) for a in _data(rng, np.float32))
    want = np.minimum(np.maximum((y + b[None, :, None, None]) + r, bf.type(0)), bf.type(6))  # each op rounded
    got = apply_epilogue(np, ("bias", "add", "relu6"), y, [b, r])
    assert got is y and got.dtype == bf
    np.testing.assert_array_equal(got, want)


def test_unknown_step_is_refused(rng):
    y, b, _ = _data(rng)
    with pytest.raises(ParameterError, match="epilogue step"):
        apply_epilogue(np, ("bias", "gelu"), y, [b])
