"""SEMANTICS.md rules of ReLU, threshold, add, bias add and zeros on
the reference kernels; backward kernels against central differences."""

import numpy as np
import pytest

from opgraph.backends.reference import elementwise as ew
from opgraph.errors import ShapeError
from opgraph.types import TensorType

from central_differences import numgrad


def away_from(x, t, gap=1e-3):
    """Push values within ``gap`` of the kink ``t`` away, so differences are smooth."""
    return np.where(np.abs(x - t) < gap, t + 0.5, x)


def test_relu_values_and_nan():
    x = np.array([-2.0, -0.0, 0.0, 3.0, np.nan, np.inf, -np.inf])
    y = ew.relu(np, x)
    np.testing.assert_array_equal(y, [0, 0, 0, 3, np.nan, np.inf, 0])
    assert y.dtype == x.dtype
    assert ew.relu(np, x.astype(np.float32)).dtype == np.float32


def test_relu_backward_rules():
    x = np.array([-1.0, 0.0, 2.0, np.nan, 5.0])
    gy = np.array([1.0, 1.0, 1.0, 1.0, np.inf])
    np.testing.assert_array_equal(ew.relu_backward(np, x, gy), [0, 0, 1, 0, np.inf])
    # a blocked position gives exactly 0 even for an infinite gradient
    assert ew.relu_backward(np, np.array([-1.0]), np.array([np.inf]))[0] == 0.0


def test_relu_backward_finite_differences():
    rng = np.random.default_rng(0)
    x = away_from(rng.standard_normal((2, 3, 4)), 0.0)
    gy = rng.standard_normal(x.shape)
    np.testing.assert_allclose(ew.relu_backward(np, x, gy), numgrad(lambda v: ew.relu(np, v), x, gy),
                               atol=1e-8)


def test_threshold_values():
    x = np.array([-1.0, 0.5, 1.0, 1.5, np.nan])
    np.testing.assert_array_equal(ew.threshold(np, x, threshold=1.0, value=-7.0),
                                  [-7, -7, -7, 1.5, np.nan])   # x > t keeps x, NaN propagates
    # threshold(0, 0) is ReLU
    z = np.random.default_rng(1).standard_normal(50)
    np.testing.assert_array_equal(ew.threshold(np, z, threshold=0.0, value=0.0), ew.relu(np, z))


def test_threshold_backward_finite_differences():
    rng = np.random.default_rng(2)
    x = away_from(rng.standard_normal((3, 5)), 0.3)
    gy = rng.standard_normal(x.shape)
    want = numgrad(lambda v: ew.threshold(np, v, threshold=0.3, value=2.0), x, gy)
    np.testing.assert_allclose(ew.threshold_backward(np, x, gy, threshold=0.3), want, atol=1e-8)
    assert ew.threshold_backward(np, np.array([0.3]), np.array([1.0]), threshold=0.3)[0] == 0.0


def test_add_and_shape_error():
    a, b = np.arange(6.0).reshape(2, 3), np.ones((2, 3))
    np.testing.assert_array_equal(ew.add(np, a, b), a + 1)
    with pytest.raises(ShapeError):
        ew.add(np, a, np.ones((3, 2)))


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (4, 3), (0, 3, 2, 2)])
def test_bias_add_and_backward(shape):
    rng = np.random.default_rng(3)
    x, b = rng.standard_normal(shape), rng.standard_normal(shape[1])
    y = ew.bias_add(np, x, b)
    want = x.copy()
    for c in range(shape[1]):
        want[:, c] += b[c]
    np.testing.assert_array_equal(y, want)
    gy = rng.standard_normal(shape)
    gb = ew.bias_add_backward(np, gy)
    assert gb.shape == (shape[1],)
    np.testing.assert_allclose(gb, numgrad(lambda v: ew.bias_add(np, x, v), b, gy), atol=1e-8)
    if shape[0] == 0:
        np.testing.assert_array_equal(gb, 0.0)


def test_bias_add_rejects_wrong_bias():
    with pytest.raises(ShapeError):
        ew.bias_add(np, np.zeros((2, 3, 4, 4)), np.zeros(4))


def test_bias_add_backward_fp16_accumulates_in_fp32():
    gy = np.full((64, 2, 16, 16), 0.1, dtype=np.float16)   # 16384 terms per channel
    gb = ew.bias_add_backward(np, gy)
    assert gb.dtype == np.float16
    want = 16384 * np.float64(np.float16(0.1))
    np.testing.assert_allclose(gb.astype(np.float64), want, rtol=1e-3)


def test_zeros():
    z = ew.zeros(np, type=TensorType((2, 0, 3), "float32"))
    assert z.shape == (2, 0, 3) and z.dtype == np.float32
    z = ew.zeros(np, type=TensorType((4,), "float64"))
    np.testing.assert_array_equal(z, [0, 0, 0, 0])
    # bfloat16 is ml_dtypes' (a dependency): zeros in that dtype, not an error
    z = ew.zeros(np, type=TensorType((2,), "bfloat16"))
    assert z.dtype.name == "bfloat16" and z.astype(np.float32).tolist() == [0.0, 0.0]


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_a_zeros_node_runs_in_the_compile_dtype(dtype):
    """Under ``compile(dtype=...)`` a ``Zeros`` node's zeros are in that dtype, as
    its readers were typed (``run_types``): declared float32 zeros made a float64
    check compute in float32 after them."""
    import opgraph as og
    from opgraph import ops
    g = og.Graph()
    x = g.input("x", (2, 3))
    z = g.apply(ops.Zeros, {"type": TensorType((2, 3), "float32")}, [])
    exe = og.compile([z, og.add(x, z)], dtype=dtype)
    outs = exe(x=np.ones((2, 3), np.float32))
    assert [o.dtype.name for o in outs] == [dtype, dtype]


def test_batch_size_zero():
    x = np.zeros((0, 3, 4, 4))
    for y in (ew.relu(np, x), ew.relu_backward(np, x, x), ew.threshold(np, x, threshold=0, value=1),
              ew.threshold_backward(np, x, x, threshold=0), ew.add(np, x, x)):
        assert y.shape == x.shape


def _stored(a, layout):
    """A copy of the 4-D ``a`` stored NCHW, channels-last or as a strided slice."""
    if layout == "NHWC":
        return np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    if layout == "strided":
        big = np.full(a.shape[:2] + (2 * a.shape[2],) + a.shape[3:], 7, dtype=a.dtype)
        big[:, :, ::2] = a
        return big[:, :, ::2]
    return a.copy()


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC", "strided"])
def test_out_writes_the_same_bits_into_the_input_it_overwrites(dtype, layout):
    # the in-place form (Rule.inplace, out= the dying input) of every kernel that has one
    special = [-2.0, -0.0, 0.0, 0.5, 3.0, np.nan, np.inf, -np.inf]
    rng = np.random.default_rng(11)
    x = rng.choice(special + list(rng.standard_normal(8)), size=(2, 3, 4, 5)).astype(dtype)
    gy = rng.choice(special + list(rng.standard_normal(8)), size=x.shape).astype(dtype)
    b = rng.standard_normal(3).astype(dtype)
    bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[np.dtype(dtype).itemsize]
    cases = [  # (kernel call, arrays, position of the input overwritten)
        (lambda a, **o: ew.relu(np, a, **o), [x], 0),
        (lambda m, g, **o: ew.relu_backward(np, m, g, **o), [x, gy], 1),
        (lambda a, **o: ew.threshold(np, a, threshold=0.5, value=-1.0, **o), [x], 0),
        (lambda m, g, **o: ew.threshold_backward(np, m, g, threshold=0.5, **o), [x, gy], 1),
        (lambda p, q, **o: ew.add(np, p, q, **o), [x, gy], 0),
        (lambda p, q, **o: ew.add(np, p, q, **o), [x, gy], 1),
        (lambda p, c, **o: ew.bias_add(np, p, c, **o), [x, b], 0),
    ]
    for call, arrays, pos in cases:
        want = call(*arrays)
        stored = [_stored(a, layout) if a.ndim == 4 else a.copy() for a in arrays]
        strides = stored[pos].strides
        got = call(*stored, out=stored[pos])
        assert got is stored[pos] and got.strides == strides and got.dtype == want.dtype
        np.testing.assert_array_equal(got.view(bits), want.view(bits))  # -0.0 and NaN bits too
        other = _stored(np.zeros_like(want), layout)  # an out= that is no input
        got = call(*arrays, out=other)
        assert got is other
        np.testing.assert_array_equal(got.view(bits), want.view(bits))
    # add(x, x) into x: the two operands are the array written
    twice = _stored(x, layout)
    np.testing.assert_array_equal(ew.add(np, twice, twice, out=twice).view(bits), (x + x).view(bits))
