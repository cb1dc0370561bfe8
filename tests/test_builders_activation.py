"""The activation builders: the op and parameters each one adds, and errors that name
the node, the parameter and the value."""

import pytest

import opgraph as og
from opgraph import ops
from opgraph.errors import ParameterError, ShapeError


def _x(dtype="float32"):
    g = og.Graph()
    return g, g.input("x", (2, 3, 4, 4), dtype)


@pytest.mark.parametrize("build, op", [
    (og.relu6, ops.Hardtanh(min_val=0.0, max_val=6.0)),
    (lambda x: og.hardtanh(x, -2, 0.5), ops.Hardtanh(min_val=-2.0, max_val=0.5)),
    (og.hardtanh, ops.Hardtanh(min_val=-1.0, max_val=1.0)),
    (og.sigmoid, ops.Sigmoid()),
    (og.silu, ops.Silu()),
    (og.hardsigmoid, ops.Hardsigmoid(alpha=1 / 6, beta=0.5)),
    (lambda x: og.hardsigmoid(x, alpha=0.2), ops.Hardsigmoid(alpha=0.2, beta=0.5)),
    (og.hardswish, ops.Hardswish()),
    (og.gelu, ops.Gelu(approximate="none")),
    (lambda x: og.gelu(x, "tanh"), ops.Gelu(approximate="tanh")),
])
def test_builder_adds_its_op(build, op):
    g, x = _x()
    y = build(x)
    assert y.op == op and y.type == x.type and op.family == "activation"


def test_relu6_is_hardtanh_0_6_in_bfloat16_too():
    g, x = _x("bfloat16")
    y = og.relu6(x, name="r6")
    assert y.name == "r6" and y.dtype == "bfloat16"


@pytest.mark.parametrize("build, error, texts", [
    (lambda x: og.hardtanh(x, 1.0, -1.0, name="clip"), ParameterError, ["node clip", "max_val=-1.0", "min_val=1.0"]),
    (lambda x: og.hardtanh(x, "a", 1.0, name="clip"), ParameterError, ["node clip", "min_val='a'"]),
    (lambda x: og.gelu(x, "erf", name="g1"), ParameterError, ["node g1", "approximate='erf'"]),
    (lambda x: og.hardsigmoid(x, alpha=None, name="hs"), ParameterError, ["node hs", "alpha=None"]),
])
def test_bad_parameters_name_node_parameter_value(build, error, texts):
    g, x = _x()
    with pytest.raises(error) as e:
        build(x)
    for t in texts:
        assert t in str(e.value)


def test_integer_input_is_refused_naming_the_node():
    g = og.Graph()
    x = g.input("idx", (4,), "int64")
    with pytest.raises(ShapeError, match="node s1 .*floating point, got int64"):
        og.sigmoid(x, name="s1")


def test_backward_order_beyond_two_is_refused():
    g, x = _x()
    with pytest.raises(ParameterError, match="order=3"):
        g.apply(ops.SigmoidBackward, {"order": 3}, [x, x], name="d3")


def test_flops_count_per_element():
    g, x = _x()
    assert og.silu(x).op.flops((x.type,), x.type) == 5 * x.type.size
    assert og.relu6(x).op.flops((x.type,), x.type) == 2 * x.type.size
