"""The CuPy ReLU kernels' in-place form (``out=``, ``Rule.inplace`` of the
``cuda`` rules) on the CPU: the kernels' own CUDA text runs through the g++
emulator of ``cuda_cpu_emulator`` (skipped without g++ or that module)."""

from __future__ import annotations

import numpy as np
import pytest

from opgraph import ops
from opgraph.backends.cuda import relu as cuda_relu, storage as cuda_storage
from opgraph.backends.cuda import rules as cuda_rules
from opgraph.backends.registry import lookup
from opgraph.backends.reference import elementwise as ref

from cupy_standin import cupy_replaced

emulator = pytest.importorskip("cuda_cpu_emulator")


@pytest.fixture
def emu(monkeypatch):
    if emulator.GXX is None:
        pytest.skip("no g++: the kernels' CUDA text cannot run on the CPU")
    with cupy_replaced(monkeypatch, emulator.EmulatedCupy(), cuda_storage.elementwise_kernel) as e:
        yield e


def channels_last(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


def test_cuda_rules_declare_relu_and_its_gradient_in_place():
    assert lookup(ops.Relu, "cuda").inplace == (0,)
    assert lookup(ops.ReluBackward, "cuda").inplace == (1,)
    assert lookup(ops.Threshold, "cuda").inplace == ()
    assert all(lookup(t, "cuda").fresh_output for t in (*cuda_rules.NODE_KERNELS, *cuda_rules.CUDA_KERNELS))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_relu_kernels_write_into_the_input_they_overwrite(emu, layout, dtype):
    rng = np.random.default_rng(4)
    special = [-1.0, -0.0, 0.0, 2.0, np.nan, np.inf, -np.inf]
    x = rng.choice(special + list(rng.standard_normal(6)), size=(2, 3, 4, 5)).astype(dtype)
    gy = rng.choice(special + list(rng.standard_normal(6)), size=x.shape).astype(dtype)
    store = channels_last if layout == "NHWC" else np.ascontiguousarray
    bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[np.dtype(dtype).itemsize]

    xs = store(x)
    got = cuda_relu.relu(np, xs, out=xs)
    assert got is xs
    np.testing.assert_array_equal(got.view(bits), cuda_relu.relu(np, store(x)).view(bits))
    np.testing.assert_array_equal(got, ref.relu(np, x))

    xs, gs = store(x), store(gy)
    got = cuda_relu.relu_backward(np, xs, gs, out=gs)
    assert got is gs
    np.testing.assert_array_equal(got.view(bits), cuda_relu.relu_backward(np, store(x), store(gy)).view(bits))
    np.testing.assert_array_equal(got, ref.relu_backward(np, x, gy))
    np.testing.assert_array_equal(xs, store(x))  # the mask is only read
