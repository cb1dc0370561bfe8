"""What the importer refuses: each unsupported operator, version, attribute,
attribute value or input form is an ``OnnxImportError`` naming the ONNX node
(name and op_type) and what is missing, never a different network."""

import builtins
import re

import numpy as np
import pytest

pytest.importorskip("onnx.reference")

from onnx import TensorProto, helper  # noqa: E402

from onnxcheck import model, randn  # noqa: E402

import opgraph.onnx as oxi  # noqa: E402
from opgraph.errors import ParameterError  # noqa: E402


def raw_model(nodes, inputs, outputs, inits=(), opset=17):
    """A model without a reference run (for nodes the reference cannot run either)."""
    g = helper.make_graph(nodes, "t", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def info(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def expect(m, *fragments, batch=None):
    with pytest.raises(oxi.OnnxImportError) as e:
        oxi.load(m, batch=batch)
    for f in fragments:
        assert re.search(f, str(e.value)), f"{f!r} not in {str(e.value)!r}"
    return e.value


X = randn(1, 2, 6, 6)


def test_unsupported_operator_names_node_and_op_type():
    m = raw_model([helper.make_node("Tanh", ["x"], ["y"], name="act1")], [info("x", [2])], [info("y", [2])])
    expect(m, "ONNX node 'act1' \\(Tanh\\)", "operator Tanh is not supported")


def test_unnamed_node_is_named_by_its_output():
    m = raw_model([helper.make_node("Tanh", ["x"], ["hidden"])], [info("x", [2])], [info("hidden", [2])])
    expect(m, "ONNX node 'hidden' \\(Tanh\\)")


@pytest.mark.parametrize("op_type,attrs,fragment", [
    ("MaxPool", dict(kernel_shape=[2, 2], dilations=[2, 2]), "dilations=\\[2, 2\\]: dilated pooling"),
    ("MaxPool", dict(kernel_shape=[2, 2], storage_order=1), "storage_order=1"),
    ("MaxPool", dict(kernel_shape=[3, 3], pads=[2, 2, 2, 2]), "padding.*at most half the kernel"),
    ("MaxPool", dict(kernel_shape=[3, 3], ceil_mode=1, auto_pad="SAME_UPPER"), "ceil_mode=1 with auto_pad"),
    ("AveragePool", dict(kernel_shape=[2, 2], dilations=[1, 2]), "dilated pooling"),
    ("AveragePool", dict(kernel_shape=[2, 2], auto_pad="SAME_SIDEWAYS"), "auto_pad='SAME_SIDEWAYS'"),
    ("AveragePool", dict(kernel_shape=[2, 2], auto_pad="VALID", pads=[1, 1, 1, 1]), "only one of them"),
    ("AveragePool", dict(kernel_shape=[2, 2, 2]), "only 2-D pooling"),
    ("Relu", dict(bogus=1), "attribute\\(s\\) bogus not supported"),
    ("Softmax", dict(axis=4), "axis=4 is out of range"),
])
def test_unsupported_attribute_values(op_type, attrs, fragment):
    node = helper.make_node(op_type, ["x"], ["y"], name="bad", **attrs)
    m = raw_model([node], [info("x", list(X.shape))], [info("y", None)])
    expect(m, f"ONNX node 'bad' \\({op_type}\\)", fragment)


def test_conv_errors():
    w3 = helper.make_tensor("w", TensorProto.FLOAT, [2, 1, 3, 3, 3], np.zeros(54, np.float32))
    m = raw_model([helper.make_node("Conv", ["x", "w"], ["y"], name="c3d")],
                  [info("x", [1, 1, 4, 4, 4])], [info("y", None)], [w3])
    expect(m, "ONNX node 'c3d' \\(Conv\\)", "only 4-D NCHW")
    w = helper.make_tensor("w", TensorProto.FLOAT, [2, 2, 3, 3], np.zeros(36, np.float32))
    m = raw_model([helper.make_node("Conv", ["x", "w"], ["y"], name="c", kernel_shape=[5, 5])],
                  [info("x", [1, 2, 6, 6])], [info("y", None)], [w])
    expect(m, "kernel_shape=\\[5, 5\\] differs")
    m = raw_model([helper.make_node("Conv", ["x", "w"], ["y"], name="g", group=4)],
                  [info("x", [1, 2, 6, 6])], [info("y", None)], [w])
    expect(m, "ONNX node 'g' \\(Conv\\)", "groups=4")


def test_unsupported_version_names_the_version():
    # Gemm at opset 6 is version 6, with the legacy 'broadcast' attribute.
    m = raw_model([helper.make_node("Gemm", ["a", "b", "c"], ["y"], name="fc")],
                  [info("a", [2, 3]), info("b", [3, 4]), info("c", [4])], [info("y", None)], opset=6)
    expect(m, "ONNX node 'fc' \\(Gemm\\)", "version 6 of Gemm \\(selected by opset 6\\) is not supported")


def test_opset_newer_than_the_onnx_package():
    import onnx.defs

    m = raw_model([helper.make_node("Relu", ["x"], ["y"])], [info("x", [2])], [info("y", None)],
                  opset=onnx.defs.onnx_opset_version() + 1)
    expect(m, "opset .* is newer than the installed onnx package")


def test_unsupported_domain():
    node = helper.make_node("FusedConv", ["x"], ["y"], name="f", domain="com.microsoft")
    m = raw_model([node], [info("x", [2])], [info("y", None)])
    expect(m, "ONNX node 'f' \\(FusedConv\\)", "domain 'com.microsoft'")


def test_training_forms_are_refused():
    s = [helper.make_tensor(n, TensorProto.FLOAT, [2], [1.0, 1.0]) for n in "sbmv"]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn", training_mode=1)
    expect(raw_model([node], [info("x", [1, 2, 3, 3])], [info("y", None)], s, opset=15),
           "ONNX node 'bn' \\(BatchNormalization\\)", "training_mode=1")
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], name="bn9")
    expect(raw_model([node], [info("x", [1, 2, 3, 3])], [info("y", None)], s, opset=9),
           "ONNX node 'bn9' \\(BatchNormalization\\)", "3 outputs select training mode")
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn7", spatial=0)
    expect(raw_model([node], [info("x", [1, 2, 3, 3])], [info("y", None)], s, opset=7), "spatial=0")
    t = helper.make_tensor("t", TensorProto.BOOL, [], [True])
    node = helper.make_node("Dropout", ["x", "", "t"], ["y"], name="drop")
    expect(raw_model([node], [info("x", [2])], [info("y", None)], [t], opset=13),
           "ONNX node 'drop' \\(Dropout\\)", "training_mode=true")
    node = helper.make_node("Dropout", ["x", "", "t"], ["y"], name="drop2")
    # a fed training_mode is refused already as a graph input (no bool tensors)
    expect(raw_model([node], [info("x", [2]), info("t", [], TensorProto.BOOL)], [info("y", None)], opset=13),
           "graph input 't' has dtype bool")


def test_second_outputs_in_use_are_refused():
    nodes = [helper.make_node("MaxPool", ["x"], ["y", "idx"], name="mp", kernel_shape=[2, 2]),
             helper.make_node("Identity", ["idx"], ["z"])]
    m = raw_model(nodes, [info("x", [1, 1, 4, 4])], [info("y", None), info("z", None)])
    expect(m, "ONNX node 'mp' \\(MaxPool\\)", "output 1 \\('idx'\\) is used")
    # an unused mask output is fine
    node = helper.make_node("Dropout", ["x"], ["y", "mask"], name="d")
    oxi.load(raw_model([node], [info("x", [2])], [info("y", None)]))


def test_computed_shapes_and_gathers_are_refused():
    nodes = [helper.make_node("Reshape", ["x", "s"], ["y"], name="rs")]
    m = raw_model(nodes, [info("x", [2, 3]), info("s", [2], TensorProto.INT64)], [info("y", None)])
    expect(m, "ONNX node 'rs' \\(Reshape\\)", "input 1 \\(shape\\) must be a constant")
    idx = helper.make_tensor("i", TensorProto.INT64, [1], [0])
    m = raw_model([helper.make_node("Gather", ["x", "i"], ["y"], name="ga")], [info("x", [2, 3])],
                  [info("y", None)], [idx])
    expect(m, "ONNX node 'ga' \\(Gather\\)", "only on constant inputs")


def test_matmul_forms_outside_the_supported_ones():
    m = raw_model([helper.make_node("MatMul", ["a", "b"], ["y"], name="bmm")],
                  [info("a", [2, 3, 4]), info("b", [2, 4, 5])], [info("y", None)])
    expect(m, "ONNX node 'bmm' \\(MatMul\\)", "only 2-D @ 2-D and N-D @ 2-D")


def test_constant_strings_and_sparse_are_refused():
    node = helper.make_node("Constant", [], ["c"], name="k", value_strings=["a"])
    expect(raw_model([node], [], [info("c", None)]), "ONNX node 'k' \\(Constant\\)", "value_strings")


def test_symbolic_non_batch_dimension():
    m = raw_model([helper.make_node("Relu", ["x"], ["y"])], [info("x", ["N", "C", 4, 4])], [info("y", None)])
    expect(m, "graph input 'x' has a symbolic dimension at axis 1")


def test_batch_conflicting_with_a_fixed_batch():
    m = model([helper.make_node("Relu", ["x"], ["y"])], {"x": randn(8, 3)}, ["y"])
    with pytest.raises(ParameterError, match="fixed batch of 8"):
        oxi.load(m, batch=4)
    assert oxi.load(m, batch=8)[1][0].shape == (8, 3)
    with pytest.raises(ParameterError, match="batch=-1"):
        oxi.load(m, batch=-1)


def test_shape_mismatch_inside_a_node_is_reported_with_the_onnx_node():
    node = helper.make_node("Add", ["x", "c"], ["y"], name="badd")
    c = helper.make_tensor("c", TensorProto.FLOAT, [5], np.zeros(5, np.float32))
    m = raw_model([node], [info("x", [2, 3])], [info("y", None)], [c])
    expect(m, "ONNX node 'badd' \\(Add\\)", "do not broadcast")


def test_missing_onnx_package_gives_an_install_hint(monkeypatch):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "onnx" or name.startswith("onnx."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(ImportError, match="pip install 'opgraph\\[onnx\\]'"):
        oxi.load("model.onnx")


@pytest.mark.parametrize("op_type, attrs, fragment", [
    ("LRN", dict(size=3, alpha=float("nan")), "alpha=nan: must be a number, not NaN"),
    ("LRN", dict(size=3, beta=float("inf")), "beta=inf: must be finite"),
    ("LeakyRelu", dict(alpha=float("nan")), None),  # not supported at all: named either way
])
def test_nan_and_infinite_attributes_are_refused_naming_the_onnx_node(op_type, attrs, fragment):
    node = helper.make_node(op_type, ["x"], ["y"], name="bad", **attrs)
    m = raw_model([node], [info("x", list(X.shape))], [info("y", None)])
    with pytest.raises((oxi.OnnxImportError, ParameterError)) as e:
        oxi.load(m)
    assert "bad" in str(e.value) and (fragment is None or fragment in str(e.value))


@pytest.mark.parametrize("attr", ["alpha", "beta", "epsilon"])
def test_nan_gemm_scales_and_batch_norm_epsilon_are_refused(attr):
    if attr == "epsilon":
        c = 2
        inits = [helper.make_tensor(n, TensorProto.FLOAT, [c], np.ones(c, np.float32))
                 for n in ("s", "b", "mean", "var")]
        node = helper.make_node("BatchNormalization", ["x", "s", "b", "mean", "var"], ["y"], name="bad",
                                epsilon=float("nan"))
        m = raw_model([node], [info("x", list(X.shape))], [info("y", None)], inits)
    else:
        w = helper.make_tensor("w", TensorProto.FLOAT, [3, 4], np.ones(12, np.float32))
        cc = helper.make_tensor("c", TensorProto.FLOAT, [4], np.ones(4, np.float32))
        node = helper.make_node("Gemm", ["a", "w", "c"], ["y"], name="bad", **{attr: float("nan")})
        m = raw_model([node], [info("a", [2, 3])], [info("y", None)], [w, cc])
    with pytest.raises((oxi.OnnxImportError, ParameterError)) as e:
        oxi.load(m)
    named = "eps" if attr == "epsilon" else attr  # BatchNorm's own name for it, after the ONNX node's
    assert "ONNX node 'bad'" in str(e.value) and f"{named}=nan" in str(e.value)
