"""``opgraph.buffer_views.copy_into``: a dense copy between arrays of one layout
is one memcpy (CuPy's element-wise copy of a channels-last array ran at a tenth
of the copy bandwidth on the H200); every other copy is element-wise. CPU: a
stand-in for a CuPy array records the memcpy; NumPy arrays take ``dst[...] = src``."""

from __future__ import annotations

from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

from opgraph.buffer_views import copy_into, pitched_rows


def nhwc(shape, dtype=np.float32):
    n, c, h, w = shape
    return np.zeros((n, h, w, c), dtype).transpose(0, 3, 1, 2)


def one_run(a) -> bool:
    """Whether ``a`` fills its bytes from its first element on: copied into an
    array of its own layout as one plain memcpy (``pitched_rows``: one row)."""
    rows = pitched_rows(a, a)
    return rows is not None and rows[1] == 1 and rows[0] == a.nbytes


@pytest.mark.parametrize("make", [
    lambda: np.zeros((2, 3, 4, 5)),
    lambda: nhwc((2, 3, 4, 5)),
    lambda: np.zeros((5, 4)).T,
    lambda: np.zeros((2, 1, 4, 5))[:, :, :, :],
    lambda: nhwc((1, 3, 1, 1)),
])
def test_dense_layouts_are_one_run(make):
    assert one_run(make())


@pytest.mark.parametrize("make", [
    lambda: nhwc((2, 8, 4, 5))[:, 2:5],          # a channel slice of a concat buffer
    lambda: np.zeros((4, 6))[:, ::2],
    lambda: np.zeros((4, 6))[::-1],
    lambda: np.broadcast_to(np.zeros(3), (4, 3)),
])
def test_gapped_reversed_or_broadcast_layouts_are_not(make):
    assert not one_run(make())


class DeviceArray:
    """The parts of a CuPy array ``copy_into`` reads, over a NumPy array, with
    the memcpy recorded (and done, on the bytes)."""

    def __init__(self, a, log):
        self.a, self.log = a, log
        self.data = SimpleNamespace(ptr=a.__array_interface__["data"][0], copy_from_device_async=self._memcpy)

    shape = property(lambda self: self.a.shape)
    ndim = property(lambda self: self.a.ndim)
    strides = property(lambda self: self.a.strides)
    dtype = property(lambda self: self.a.dtype)
    itemsize = property(lambda self: self.a.itemsize)
    size = property(lambda self: self.a.size)
    nbytes = property(lambda self: self.a.nbytes)

    def view(self, dtype):
        return device(self.a.view(dtype), self.log)

    def _memcpy(self, src, size):
        # the dense arrays of these tests are views of a C-order base that starts at them
        self.log.append(("memcpy", size))
        src_array = next(o for o in DeviceArray.live if o.data is src).a
        whole = lambda a: (a.base if a.base is not None else a).reshape(-1).view(np.uint8)
        whole(self.a)[:size] = whole(src_array)[:size]

    def __setitem__(self, key, value):
        self.log.append(("elementwise", None))
        self.a[key] = value.a


DeviceArray.live = []


def device(a, log):
    d = DeviceArray(a, log)
    DeviceArray.live.append(d)
    return d


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_channels_last_arrays_of_one_layout_are_one_memcpy(dtype):
    log = []
    src = nhwc((2, 3, 4, 5), dtype)
    src[...] = np.arange(src.size, dtype=np.float32).reshape(src.shape).astype(dtype)
    dst = nhwc((2, 3, 4, 5), dtype)
    copy_into(device(dst, log), device(src, log))
    assert log == [("memcpy", src.nbytes)]
    np.testing.assert_array_equal(dst, src)


def test_other_layouts_copy_element_by_element():
    log = []
    src = np.arange(120.0, dtype=np.float32).reshape(2, 3, 4, 5)  # C order
    dst = nhwc((2, 3, 4, 5))                                         # channels-last
    copy_into(device(dst, log), device(src, log))
    wide = nhwc((2, 8, 4, 5))
    copy_into(device(wide[:, 2:5], log), device(np.zeros((2, 3, 4, 5), np.float32), log))  # C order into a slice
    assert [kind for kind, _ in log] == ["elementwise", "elementwise"]
    np.testing.assert_array_equal(dst, src)


def test_numpy_arrays_copy_as_before():
    src = np.arange(6.0).reshape(2, 3)
    dst = np.zeros((2, 3))
    copy_into(dst, src)
    np.testing.assert_array_equal(dst, src)


# ------------------------------------------------------------------ 2-D memcpy (a slice at a pitch)

def emulate_memcpy_2d(dst, src, rows):
    """cudaMemcpy2D on the bytes under two NumPy arrays: ``count`` runs of
    ``row_bytes``, one every pitch, from each array's first element on."""
    row_bytes, count, dst_pitch, src_pitch = rows
    at = lambda a, pitch: np.lib.stride_tricks.as_strided(  # noqa: E731
        np.frombuffer(a.base if a.base is not None else a, np.uint8)[a.__array_interface__["data"][0]
                                                                      - base_ptr(a):],
        (count, row_bytes), (pitch, 1), writeable=True)
    at(dst, dst_pitch)[...] = at(src, src_pitch)


def base_ptr(a):
    root = a.base if a.base is not None else a
    return root.__array_interface__["data"][0]


@pytest.mark.parametrize("make_dst, make_src, want", [
    # a dense channels-last tensor into its channel slice of a concat buffer: one run per pixel
    (lambda: nhwc((2, 8, 4, 5))[:, 2:6], lambda: nhwc((2, 4, 4, 5)), (4 * 4, 40, 8 * 4, 4 * 4)),
    # the other way round (a concat's gradient sliced out)
    (lambda: nhwc((2, 4, 4, 5)), lambda: nhwc((2, 8, 4, 5))[:, 4:8], (4 * 4, 40, 4 * 4, 8 * 4)),
    # C order, rows 1:3 of every plane
    (lambda: np.zeros((2, 3, 4, 5), np.float32)[:, :, 1:3], lambda: np.zeros((2, 3, 2, 5), np.float32),
     (2 * 5 * 4, 6, 4 * 5 * 4, 2 * 5 * 4)),
])
def test_pitched_rows_describes_one_2d_copy(make_dst, make_src, want):
    dst, src = make_dst(), make_src()
    src_values = np.arange(src.size, dtype=np.float32).reshape(src.shape)
    src[...] = src_values
    rows = pitched_rows(dst, src)
    assert rows == want
    emulate_memcpy_2d(dst, src, rows)
    np.testing.assert_array_equal(dst, src_values)


@pytest.mark.parametrize("make_dst, make_src", [
    (lambda: nhwc((2, 3, 4, 5)), lambda: np.zeros((2, 3, 4, 5), np.float32)),      # element orders differ
    (lambda: np.zeros((4, 6), np.float32)[:, ::2], lambda: np.zeros((4, 3), np.float32)),  # runs of 1 element
    (lambda: nhwc((2, 8, 4, 5))[:, 2:4], lambda: nhwc((2, 2, 4, 5))),                # runs of 8 bytes
    (lambda: np.zeros((4, 6), np.float32)[::-1], lambda: np.zeros((4, 6), np.float32)),    # reversed
])
def test_pitched_rows_refuses_what_one_2d_copy_cannot_do(make_dst, make_src):
    assert pitched_rows(make_dst(), make_src()) is None


def test_a_channel_slice_is_filled_by_one_2d_memcpy(monkeypatch):
    import opgraph.buffer_views as bv

    log, calls = [], []
    monkeypatch.setattr(bv, "_memcpy_2d", lambda d, s, rows: (calls.append(rows), emulate_memcpy_2d(d.a, s.a, rows)))
    wide = nhwc((2, 8, 4, 5))
    src = nhwc((2, 4, 4, 5))
    src[...] = np.arange(src.size, dtype=np.float32).reshape(src.shape)
    copy_into(device(wide[:, 2:6], log), device(src, log))
    assert calls == [(16, 40, 32, 16)] and log == []
    np.testing.assert_array_equal(wide[:, 2:6], src)
    assert not wide[:, :2].any() and not wide[:, 6:].any()


def test_dense_arrays_whose_strides_differ_on_an_extent_of_1_are_one_memcpy(monkeypatch):
    # review: they took the 2-D path with the whole array as one row, a pitch CUDA
    # refuses above 2^31 - 1 bytes (cudaErrorInvalidPitchValue)
    import opgraph.buffer_views as bv

    log = []
    monkeypatch.setattr(bv, "_memcpy_2d", lambda *a: pytest.fail("a 2-D memcpy of one row"))
    src = nhwc((1, 4, 3, 5))
    src[...] = np.arange(src.size, dtype=np.float32).reshape(src.shape)
    dst = np.ndarray(src.shape, np.float32, buffer=np.zeros((3, 5, 4), np.float32), strides=(0, *src.strides[1:]))
    copy_into(device(dst, log), device(src, log))
    assert log == [("memcpy", src.nbytes)]
    np.testing.assert_array_equal(dst, src)


def test_a_pitch_cuda_refuses_copies_element_by_element(monkeypatch):
    import opgraph.buffer_views as bv

    monkeypatch.setattr(bv, "MAX_PITCH", 16)  # the slice's buffer pitch is 32 bytes
    monkeypatch.setattr(bv, "_memcpy_2d", lambda *a: pytest.fail("a 2-D memcpy past the pitch limit"))
    log = []
    wide = nhwc((2, 8, 4, 5))
    copy_into(device(wide[:, 2:6], log), device(nhwc((2, 4, 4, 5)), log))
    assert log == [("elementwise", None)]


def test_empty_arrays_copy_nothing():
    log = []
    copy_into(device(np.zeros((0, 3), np.float32), log), device(np.zeros((0, 3), np.float32), log))
    assert log == []
