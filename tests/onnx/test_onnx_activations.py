"""Activations of modern convnets (Clip, Sigmoid, HardSigmoid, HardSwish, Gelu)
and the GELU subgraph around Erf, imported from small ONNX models and compared
with ``onnx.reference.ReferenceEvaluator`` (the spec's reference) at each
operator version the importer claims."""

import math

import numpy as np
import pytest

pytest.importorskip("onnx.reference")

from onnx import helper  # noqa: E402

from onnxcheck import compare, model, randn  # noqa: E402

import opgraph.onnx as oxi  # noqa: E402
from opgraph import ops  # noqa: E402

#: Values on both sides of every bound and kink used below (0, +-3, 6), and far out.
X = np.concatenate([np.linspace(-8, 8, 33), [-1e4, 1e4, 0.0, 3.0, -3.0, 6.0]]).astype(np.float32).reshape(1, 3, 13)


def op_types(m, **kw):
    graph, _, outs = oxi.load(m, **kw)
    return [type(v.op).__name__ for v in graph.nodes_in_order(outs) if type(v.op).__name__ != "Source"]


def const(name, value):
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(
        name, 1, [], [float(value)]))


@pytest.mark.parametrize("bounds,expected", [((0.0, 6.0), "Hardtanh"), ((-1.5, 2.0), "Hardtanh"),
                                             ((0.0, None), "Relu"), ((None, 2.0), "Hardtanh"),
                                             ((-2.0, None), "Hardtanh"), ((None, None), None)])
@pytest.mark.parametrize("opset", [11, 12, 13])
def test_clip_with_bound_inputs(bounds, expected, opset):
    lo, hi = bounds
    nodes = [const(n, v) for n, v in (("lo", lo), ("hi", hi)) if v is not None]
    ins = ["x", "lo" if lo is not None else "", "hi" if hi is not None else ""]
    while not ins[-1]:
        ins.pop()
    m = model([*nodes, helper.make_node("Clip", ins, ["y"], name="clip")], {"x": X}, ["y"], opset=opset)
    compare(m, {"x": X}, tol=0.0)
    assert op_types(m) == ([expected] if expected else [])


@pytest.mark.parametrize("attrs", [dict(min=0.0, max=6.0), dict(min=-1.0), dict(max=0.5), {}])
def test_clip_version_6_attributes_default_to_the_float32_range(attrs):
    m = model([helper.make_node("Clip", ["x"], ["y"], name="clip", **attrs)], {"x": X}, ["y"], opset=6)
    compare(m, {"x": X}, tol=0.0)


def test_clip_bounds_initializers_and_errors():
    two = {"lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32)}
    m = model([helper.make_node("Clip", ["x", "lo", "hi"], ["y"])], {"x": X}, ["y"], two)
    compare(m, {"x": X}, tol=0.0)
    bad = model([helper.make_node("Clip", ["x", "lo", "hi"], ["y"], name="c")], {"x": X}, ["y"],
                {"lo": np.array(2.0, np.float32), "hi": np.array(1.0, np.float32)}, check=False,
                output_shapes={"y": X.shape})
    with pytest.raises(oxi.OnnxImportError, match="ONNX node 'c' \\(Clip\\).*min=2.0 > max=1.0"):
        oxi.load(bad)
    computed = model([helper.make_node("Clip", ["x", "lo"], ["y"], name="c")], {"x": X, "lo": np.array(0.0, np.float32)},
                     ["y"])
    with pytest.raises(oxi.OnnxImportError, match="ONNX node 'c' \\(Clip\\): input 1 \\(min\\) must be a constant"):
        oxi.load(computed)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the reference's exp overflows at -1e4
@pytest.mark.parametrize("opset", [6, 13])
def test_sigmoid(opset):
    m = model([helper.make_node("Sigmoid", ["x"], ["y"])], {"x": X}, ["y"], opset=opset)
    compare(m, {"x": X}, tol=1e-6)
    assert op_types(m) == ["Sigmoid"]


@pytest.mark.parametrize("attrs", [{}, dict(alpha=1 / 6), dict(alpha=1 / 6, beta=0.5), dict(alpha=0.3, beta=0.1)])
@pytest.mark.parametrize("opset", [6, 22])
def test_hard_sigmoid_reads_alpha_and_beta(attrs, opset):
    m = model([helper.make_node("HardSigmoid", ["x"], ["y"], **attrs)], {"x": X}, ["y"], opset=opset)
    compare(m, {"x": X}, tol=1e-6)
    graph, _, (y,) = oxi.load(m)
    assert (y.op.alpha, y.op.beta) == pytest.approx((attrs.get("alpha", 0.2), attrs.get("beta", 0.5)))


@pytest.mark.parametrize("opset", [14, 22])
def test_hard_swish(opset):
    m = model([helper.make_node("HardSwish", ["x"], ["y"])], {"x": X}, ["y"], opset=opset)
    compare(m, {"x": X}, tol=1e-6)
    assert op_types(m) == ["Hardswish"]


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_operator_of_opset_20(approximate):
    m = model([helper.make_node("Gelu", ["x"], ["y"], approximate=approximate)], {"x": X}, ["y"], opset=20)
    compare(m, {"x": X}, tol=1e-6)
    graph, _, (y,) = oxi.load(m)
    assert isinstance(y.op, ops.Gelu) and y.op.approximate == approximate


def gelu_nodes(form: str, x="x", out="y"):
    """The erf GELU subgraph in one of its written forms, node names under /blk/."""
    n = lambda op, ins, o: helper.make_node(op, ins, [o], name=f"/blk/{o}")  # noqa: E731
    nodes = [const("c_sqrt2", math.sqrt(2)), const("c_isqrt2", 1 / math.sqrt(2)), const("c_one", 1.0),
             const("c_half", 0.5)]
    nodes.append(n("Div", [x, "c_sqrt2"], "d") if form != "mul_isqrt2" else n("Mul", ["c_isqrt2", x], "d"))
    nodes += [n("Erf", ["d"], "e"), n("Add", ["c_one", "e"] if form == "one_first" else ["e", "c_one"], "a")]
    if form == "half_first":      # (a * 0.5) * x
        nodes += [n("Mul", ["a", "c_half"], "h"), n("Mul", [x, "h"], out)]
    elif form == "x_half":        # a * (x * 0.5)
        nodes += [n("Mul", [x, "c_half"], "xh"), n("Mul", ["a", "xh"], out)]
    else:                         # (x * a) * 0.5, as torch exports it
        nodes += [n("Mul", [x, "a"], "m"), n("Mul", ["m", "c_half"], out)]
    return nodes


@pytest.mark.parametrize("form", ["torch", "mul_isqrt2", "one_first", "half_first", "x_half"])
def test_erf_gelu_subgraph_becomes_one_gelu(form):
    m = model(gelu_nodes(form), {"x": X}, ["y"])
    compare(m, {"x": X}, tol=1e-6)
    graph, _, (y,) = oxi.load(m)
    assert op_types(m) == ["Gelu"] and y.name == "/blk/Gelu" and y.op.approximate == "none"


def test_gelu_inside_a_network_keeps_its_neighbours():
    x = randn(2, 8)
    nodes = [helper.make_node("Relu", ["x"], ["r"]), *gelu_nodes("torch", x="r", out="g"),
             helper.make_node("Add", ["g", "r"], ["y"])]
    m = model(nodes, {"x": x}, ["y"])
    compare(m, {"x": x}, tol=1e-6)
    assert op_types(m) == ["Relu", "Gelu", "Add"]


@pytest.mark.parametrize("change", ["wrong_constant", "intermediate_is_output", "intermediate_reused", "erf_alone"])
def test_erf_outside_the_pattern_is_an_error_naming_the_node(change):
    nodes = gelu_nodes("torch")
    outputs = ["y"]
    if change == "wrong_constant":
        nodes[0] = const("c_sqrt2", 1.5)
    elif change == "intermediate_is_output":
        outputs.append("a")
    elif change == "intermediate_reused":
        nodes.append(helper.make_node("Add", ["e", "y"], ["z"]))
        outputs = ["z"]
    else:
        nodes = [helper.make_node("Erf", ["x"], ["y"], name="/blk/e")]
    m = model(nodes, {"x": X}, outputs, check=False)
    with pytest.raises(oxi.OnnxImportError, match="ONNX node '/blk/e' \\(Erf\\): Erf alone has no opgraph op"):
        oxi.load(m)
