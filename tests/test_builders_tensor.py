"""Builders of mul/div/neg, mean, adaptive average pooling, split/narrow and
permute/transpose: the nodes they add, shapes, and errors naming the node, the
parameter and the value."""

import pytest

import opgraph as og
from opgraph import ops
from opgraph.errors import OpgraphError, ParameterError, ShapeError


def _x(shape=(2, 6, 4, 4), dtype="float32"):
    g = og.Graph()
    return g, g.input("x", shape, dtype)


def test_mul_and_div_broadcast_the_squeeze_and_excitation_scale():
    g, x = _x()
    s = g.input("s", (2, 6, 1, 1))
    assert og.mul(x, s).shape == og.mul(s, x).shape == og.div(x, s).shape == (2, 6, 4, 4)
    with pytest.raises(ShapeError, match="node m1 .*do not broadcast"):
        og.mul(x, g.input("t", (2, 5, 1, 1)), name="m1")
    with pytest.raises(OpgraphError, match="expected graph values"):
        og.mul(x, 2.0)


def test_div_rounding_mode_must_match_the_dtype():
    g, x = _x()
    with pytest.raises(ParameterError, match="node d1: parameter rounding_mode='floor'"):
        og.div(x, x, rounding_mode="floor", name="d1")
    i = g.input("i", (3,), "int64")
    with pytest.raises(ParameterError, match="rounding_mode=None: must be 'trunc' for int64"):
        og.div(i, i)
    assert og.div(i, i, rounding_mode="trunc").dtype == "int64"


@pytest.mark.parametrize("dim, keepdim, shape, axes", [
    ((2, 3), True, (2, 6, 1, 1), (2, 3)), (-1, False, (2, 6, 4), (3,)), (None, False, (), (0, 1, 2, 3)),
    ((), True, (1, 1, 1, 1), (0, 1, 2, 3)), ([3, 0], False, (6, 4), (0, 3))])
def test_mean_shapes_and_canonical_axes(dim, keepdim, shape, axes):
    g, x = _x()
    y = og.mean(x, dim, keepdim)
    assert y.shape == shape and y.op.axes == axes and y.op.family == "reduce"


def _raises_naming(error, texts, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` raises ``error`` whose message contains every one of ``texts``."""
    with pytest.raises(error) as e:
        fn(*args, **kwargs)
    missing = [t for t in texts if t not in str(e.value)]
    assert not missing, f"{missing} not in {e.value}"


@pytest.mark.parametrize("dim, texts", [(4, ["node m", "dim=4"]), ((1, -3), ["node m", "axes="]),
                                        ("1", ["node m", "dim='1'"])])
def test_mean_bad_dims(dim, texts):
    g, x = _x()
    _raises_naming(ParameterError, texts, og.mean, x, dim, name="m")


def test_mean_over_an_empty_axis_is_an_error_but_an_empty_batch_is_not():
    g, x = _x((0, 3, 2, 2))
    assert og.mean(x, (2, 3)).shape == (0, 3)
    with pytest.raises(ShapeError, match="node m0 .*axis 0 .*empty"):
        og.mean(x, 0, name="m0")


def test_adaptive_avg_pool2d():
    g, x = _x((2, 6, 6, 4))
    assert isinstance(og.adaptive_avg_pool2d(x, 1).op, ops.GlobalAvgPool2d)
    y = og.adaptive_avg_pool2d(x, (3, None))
    assert isinstance(y.op, ops.AvgPool2d) and y.op.kernel_size == (2, 1) and y.shape == (2, 6, 3, 4)
    with pytest.raises(ParameterError, match=r"node ap: parameter output_size=\(4, 4\): must divide"):
        og.adaptive_avg_pool2d(x, (4, 4), name="ap")
    with pytest.raises(ParameterError, match="output_size=0"):
        og.adaptive_avg_pool2d(x, 0)


@pytest.mark.parametrize("sections, dim, sizes", [(4, 1, [4, 2]), ([1, 5], 1, [1, 5]), (2, -1, [2, 2]),
                                                  (6, 1, [6])])
def test_split_chunks(sections, dim, sizes):
    g, x = _x()
    parts = og.split(x, sections, dim, name="sp")
    assert [p.shape[dim] for p in parts] == sizes
    assert [p.name for p in parts] == [f"sp_{i}" for i in range(len(sizes))]


@pytest.mark.parametrize("sections, texts", [([2, 2], ["node sp", "split_size_or_sections=[2, 2]", "6"]),
                                             (0, ["node sp", "split_size_or_sections=0"])])
def test_split_errors(sections, texts):
    g, x = _x()
    _raises_naming(ParameterError, texts, og.split, x, sections, name="sp")


def test_narrow_permute_transpose():
    g, x = _x()
    assert og.narrow(x, -3, 2, 3).shape == (2, 3, 4, 4)
    with pytest.raises(ParameterError, match=r"node n1: parameter length=3: .*start 4 \+ length <= 6"):
        og.narrow(x, 1, 4, 3, name="n1")
    assert og.permute(x, (0, 2, 3, 1)).shape == (2, 4, 4, 6)
    assert og.transpose(x, 1, -1).op == ops.Transpose(perm=(0, 3, 2, 1))
    with pytest.raises(ParameterError, match=r"node t1: parameter dims=\(0, 1, 1, 2\)"):
        og.permute(x, (0, 1, 1, 2), name="t1")
    with pytest.raises(ParameterError, match="node t2: parameter dim1=4"):
        og.transpose(x, 0, 4, name="t2")


@pytest.mark.parametrize("shape,want", [((3, -1), (3, 8)), ((-1,), (24,)), ((2, -1, 4), (2, 3, 4))])
def test_reshape_infers_one_minus_one_as_torch_does(shape, want):
    import torch
    g = og.Graph()
    x = g.input("x", (6, 4))
    assert og.reshape(x, shape).shape == want == tuple(torch.zeros(6, 4).reshape(shape).shape)


@pytest.mark.parametrize("shape,text", [((-1, -1), "at most one entry may be -1"),
                                        ((5, -1), "-1 cannot be inferred"), ((0, -1), "-1 cannot be inferred")])
def test_reshape_minus_one_errors_name_the_node(shape, text):
    g = og.Graph()
    x = g.input("x", (6, 4))
    with pytest.raises(ParameterError, match=rf"node r: parameter shape=.*{text}"):
        og.reshape(x, shape, name="r")
