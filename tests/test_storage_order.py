"""``types.storage_order``: the layout a kernel keeps when it copies a strided
operand, and ``cuda.storage.physical`` copying a strided NHWC view into NHWC
(NumPy stands in for CuPy: both functions take the array module)."""

from __future__ import annotations

import numpy as np
import pytest

from opgraph.backends.cuda.storage import logical, physical
from opgraph.types import is_channels_last, storage_order, to_layout


def nhwc(a):
    return to_layout(np, a, "NHWC")


@pytest.fixture
def a():
    return np.random.default_rng(0).standard_normal((2, 6, 3, 5))


def test_packed_layouts(a):
    assert storage_order(a) == "NCHW"
    assert storage_order(nhwc(a)) == "NHWC"
    assert storage_order(a[0]) is None


def test_a_channel_slice_keeps_its_buffers_order(a):
    cl_slice, nchw_slice = nhwc(a)[:, 2:4], a[:, 2:4]
    assert not is_channels_last(cl_slice) and not cl_slice.flags.c_contiguous
    assert storage_order(cl_slice) == "NHWC"
    assert storage_order(nchw_slice) == "NCHW"
    # a spatial crop of an NHWC buffer is still channels-fastest
    assert storage_order(nhwc(a)[:, :, 1:, 1:4]) == "NHWC"
    # one channel: nothing is channels-fastest about it
    assert storage_order(nhwc(a)[:, 3:4]) == "NCHW"
    # every other channel of an NHWC buffer is still channels-fastest
    assert storage_order(nhwc(a)[:, ::2]) == "NHWC"
    # one pixel: the same memory either way, NCHW as the unsliced array says
    pixel = np.zeros((4, 6, 1, 1))
    assert storage_order(pixel) == storage_order(pixel[:, 1:4]) == "NCHW"


@pytest.mark.parametrize("view", ["channels", "crop"])
def test_physical_copies_a_strided_nhwc_view_into_nhwc(a, view):
    v = nhwc(a)[:, 1:5] if view == "channels" else nhwc(a)[:, :, 1:, :4]
    buf, cl = physical(np, v)
    assert cl and buf.flags.c_contiguous
    back = logical(buf, cl)
    assert is_channels_last(back)
    np.testing.assert_array_equal(back, v)
    buf, cl = physical(np, a[:, 1:5])
    assert not cl and buf.flags.c_contiguous
    np.testing.assert_array_equal(buf, a[:, 1:5])


def test_host_to_device_stores_4d_channels_last_and_rounds_bfloat16():
    """The GPU tests' and device scripts' operands (``storage.host_to_device``), with NumPy as
    the device module: a 4-D array channels-last in memory, viewed NCHW, bf16 rounded to
    nearest even against ml_dtypes; other ranks in C order, float32 otherwise."""
    import ml_dtypes
    from opgraph.backends.cuda.storage import host_to_device

    a = np.random.default_rng(0).standard_normal((2, 3, 4, 5))
    got = host_to_device(np, a, "bfloat16")
    assert got.shape == a.shape and got.dtype == ml_dtypes.bfloat16
    assert got.strides == tuple(s * 2 for s in (60, 1, 15, 3))  # N, C, H, W of an NHWC buffer
    np.testing.assert_array_equal(got.astype(np.float64), a.astype(ml_dtypes.bfloat16).astype(np.float64))
    v = host_to_device(np, a[0, :, 0, 0], "float32")
    assert v.dtype == np.float32 and v.flags.c_contiguous
    np.testing.assert_array_equal(v, a[0, :, 0, 0].astype(np.float32))
