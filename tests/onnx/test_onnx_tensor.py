"""Tensor operators (Add, Mul, Sum with broadcasting, Concat, Reshape,
Flatten, Transpose, Unsqueeze, Squeeze, Identity, Constant, ConstantOfShape,
Shape, Gather) imported from small ONNX models and compared with
``onnx.reference.ReferenceEvaluator``; constant folding and batch override."""

import numpy as np
import pytest

pytest.importorskip("onnx.reference")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from onnxcheck import compare, model, randn, reference, run, single  # noqa: E402

import opgraph as og  # noqa: E402
import opgraph.onnx as oxi  # noqa: E402
from opgraph import ops  # noqa: E402

BROADCASTS = [((2, 3, 4, 5), (2, 3, 4, 5)), ((2, 3, 4, 5), (3, 1, 1)), ((2, 3, 4, 5), (1,)),
              ((2, 3, 4, 5), ()), ((1, 3, 1, 5), (2, 1, 4, 1)), ((4, 1), (3,)), ((5,), (2, 1, 5))]


@pytest.mark.parametrize("op_type", ["Add", "Mul"])
@pytest.mark.parametrize("a,b", BROADCASTS)
@pytest.mark.parametrize("b_init", [False, True])
def test_binary_broadcasting(op_type, a, b, b_init):
    x, y = randn(*a), randn(*b, seed=1)
    node = helper.make_node(op_type, ["x", "y"], ["z"], name="op")
    feeds = {"x": x} if b_init else {"x": x, "y": y}
    compare(model([node], feeds, ["z"], {"y": y} if b_init else None), feeds, tol=1e-7)


def test_add_same_shape_keeps_add_op_and_broadcast_uses_broadcast_add():
    x = randn(2, 3)
    node = helper.make_node("Add", ["x", "x"], ["z"])
    _, _, outs = oxi.load(model([node], {"x": x}, ["z"]))
    assert isinstance(outs[0].op, ops.Add)
    node = helper.make_node("Add", ["x", "c"], ["z"])
    _, _, outs = oxi.load(model([node], {"x": x}, ["z"], {"c": randn(3)}))
    assert isinstance(outs[0].op, ops.BroadcastAdd)


@pytest.mark.parametrize("shapes", [[(2, 3)], [(2, 3), (2, 3)], [(2, 3, 4), (3, 1), (4,)],
                                    [(1, 4), (3, 1), (3, 4), ()]])
def test_sum(shapes):
    feeds = {f"x{i}": randn(*s, seed=i) for i, s in enumerate(shapes)}
    node = helper.make_node("Sum", list(feeds), ["z"], name="s")
    compare(model([node], feeds, ["z"]), feeds, tol=1e-6)


@pytest.mark.parametrize("axis", [0, 1, -1, 3])
def test_concat(axis):
    shapes = [[2, 3, 4, 5], [2, 3, 4, 5], [2, 3, 4, 5]]
    for i, s in enumerate(shapes):
        s[axis] = i + 1
    feeds = {f"x{i}": randn(*s, seed=i) for i, s in enumerate(shapes)}
    node = helper.make_node("Concat", list(feeds), ["z"], axis=axis)
    compare(model([node], feeds, ["z"]), feeds, tol=0.0)


def test_concat_with_a_constant_input():
    x, c = randn(2, 3), randn(2, 2, seed=1)
    nodes = [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(c)),
             helper.make_node("Concat", ["x", "c"], ["z"], axis=1)]
    compare(model(nodes, {"x": x}, ["z"]), {"x": x}, tol=0.0)


@pytest.mark.parametrize("shape,allowzero", [([6, -1], 0), ([0, -1, 2], 0), ([-1], 0), ([2, 0, 4, 5], 0),
                                             ([2, 3, 20], 1), ([1, 2, 1, 60], 0)])
def test_reshape(shape, allowzero):
    x = randn(2, 3, 4, 5)
    m = single("Reshape", x, {"s": np.array(shape, np.int64)}, ["s"], allowzero=allowzero)
    compare(m, {"x": x}, tol=0.0)


def test_reshape_allowzero_keeps_a_zero_extent():
    x = np.zeros((0, 3), np.float32)
    m = single("Reshape", x, {"s": np.array([3, 0], np.int64)}, ["s"], allowzero=1)
    assert run(m, {"x": x})[0].shape == reference(m, {"x": x})[0].shape == (3, 0)


@pytest.mark.parametrize("axis", [0, 1, 2, 4, -1, -3])
def test_flatten(axis):
    x = randn(2, 3, 4, 5)
    compare(single("Flatten", x, axis=axis), {"x": x}, tol=0.0)


@pytest.mark.parametrize("perm", [None, [0, 2, 3, 1], [1, 0, 3, 2], [0, 1, 2, 3]])
def test_transpose(perm):
    x = randn(2, 3, 4, 5)
    compare(single("Transpose", x, **({} if perm is None else {"perm": perm})), {"x": x}, tol=0.0)


@pytest.mark.parametrize("axes", [[0], [1, 3], [-1], [-1, 0]])
def test_unsqueeze_attribute_and_input_forms(axes):
    x = randn(2, 3)
    compare(single("Unsqueeze", x, opset=11, axes=axes), {"x": x}, tol=0.0)
    compare(single("Unsqueeze", x, {"a": np.array(axes, np.int64)}, ["a"], opset=13), {"x": x}, tol=0.0)


def test_squeeze():
    x = randn(1, 3, 1, 2)
    compare(single("Squeeze", x, opset=11, axes=[0]), {"x": x}, tol=0.0)
    compare(single("Squeeze", x, {"a": np.array([-2], np.int64)}, ["a"], opset=13), {"x": x}, tol=0.0)
    compare(single("Squeeze", x, opset=13), {"x": x}, tol=0.0)


def test_identity_of_an_input_and_of_an_initializer():
    x, w = randn(2, 3), randn(2, 3, seed=1)
    nodes = [helper.make_node("Identity", ["x"], ["a"]), helper.make_node("Identity", ["w"], ["b"]),
             helper.make_node("Mul", ["a", "b"], ["z"])]
    m = model(nodes, {"x": x}, ["z"], {"w": w})
    compare(m, {"x": x}, tol=0.0)
    g, _, _ = oxi.load(m)
    # an Identity keeps it trainable, under the Identity's name (one source per name)
    assert [s.name for s in g.sources("param")] == ["b"]


@pytest.mark.parametrize("attr,value", [("value", numpy_helper.from_array(randn(3, seed=5))),
                                        ("value_float", 2.5), ("value_floats", [1.0, -2.0, 0.5])])
def test_constant_forms(attr, value):
    x = randn(2, 3)
    nodes = [helper.make_node("Constant", [], ["c"], **{attr: value}),
             helper.make_node("Mul", ["x", "c"], ["z"])]
    m = model(nodes, {"x": x}, ["z"])
    compare(m, {"x": x}, tol=0.0)
    g, _, outs = oxi.load(m)
    assert not g.sources("param")
    assert any(isinstance(v.op, ops.Constant) for v in g.nodes_in_order(outs))


def test_constant_of_shape_and_integer_constants():
    x = randn(2, 3)
    nodes = [helper.make_node("Constant", [], ["shape"], value_ints=[2, 3]),
             helper.make_node("ConstantOfShape", ["shape"], ["c"],
                              value=numpy_helper.from_array(np.array([1.5], np.float32))),
             helper.make_node("Add", ["x", "c"], ["z"]),
             helper.make_node("ConstantOfShape", ["shape"], ["zeros"]),
             helper.make_node("Add", ["z", "zeros"], ["y"])]
    compare(model(nodes, {"x": x}, ["y"]), {"x": x}, tol=0.0)


def shape_chain_flatten(opset=13):
    """PyTorch's ``x.view(x.size(0), -1)`` export: Shape -> Gather -> Unsqueeze
    -> Concat -> Reshape (dynamic batch)."""
    axes = ({"axes": [0]}, []) if opset < 13 else ({}, ["axes"])
    return [helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
            helper.make_node("Unsqueeze", ["n", *axes[1]], ["n1"], **axes[0]),
            helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
            helper.make_node("Reshape", ["x", "target"], ["y"])]


@pytest.mark.parametrize("opset", [11, 13])
def test_shape_arithmetic_folds_to_a_constant_reshape(opset):
    x = randn(3, 2, 2, 2)
    inits = {"zero": np.array(0, np.int64), "minus1": np.array([-1], np.int64), "axes": np.array([0], np.int64)}
    if opset < 13:
        del inits["axes"]
    m = model(shape_chain_flatten(opset), {"x": x}, ["y"], inits, opset=opset, input_dims={"x": ["N", 2, 2, 2]})
    compare(m, {"x": x}, tol=0.0, batch=3)
    g, _, outs = oxi.load(m, batch=5)
    assert outs[0].shape == (5, 8)
    assert [type(v.op).__name__ for v in g.nodes_in_order(outs)] == ["Source", "Reshape"]


def test_shape_start_end():
    x = randn(2, 3, 4, 5)
    nodes = [helper.make_node("Shape", ["x"], ["s"], start=1, end=-1),      # [3, 4]
             helper.make_node("Concat", ["s", "ten"], ["s2"], axis=0),      # [3, 4, 10]
             helper.make_node("Reshape", ["x", "s2"], ["r"])]
    m = model(nodes, {"x": x}, ["r"], {"ten": np.array([10], np.int64)}, opset=19)
    compare(m, {"x": x}, tol=0.0)


# ---- batch ------------------------------------------------------------------
def test_symbolic_batch_defaults_to_one_and_takes_batch():
    x = randn(4, 3)
    m = model([helper.make_node("Relu", ["x"], ["y"])], {"x": x}, ["y"], input_dims={"x": ["batch", 3]})
    g, ins, outs = oxi.load(m)
    assert ins[0].shape == (1, 3) and outs[0].shape == (1, 3)
    compare(m, {"x": x}, tol=0.0, batch=4)


def test_batch_override_of_a_batch1_export_with_a_baked_reshape():
    """A batch-1 export holds ``Reshape(x, [1, -1])``; with ``batch=3`` each
    sample must still be flattened on its own (checked per sample against the
    reference of the batch-1 model)."""
    x1 = randn(1, 2, 3, 3)
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["f"]),
             helper.make_node("Gemm", ["f", "w"], ["y"], transB=1)]
    inits = {"shape": np.array([1, -1], np.int64), "w": randn(4, 18, seed=1)}
    m = model(nodes, {"x": x1}, ["y"], inits)
    xs = randn(3, 2, 3, 3, seed=7)
    want = np.concatenate([reference(m, {"x": xs[i:i + 1]})[0] for i in range(3)])
    got = run(m, {"x": xs}, batch=3)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_load_from_path_and_bytes(tmp_path):
    x = randn(2, 3)
    m = model([helper.make_node("Relu", ["x"], ["y"])], {"x": x}, ["y"])
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    for src in (path, str(path), m.SerializeToString()):
        g, ins, outs = oxi.load(src)
        np.testing.assert_array_equal(og.compile(outs)(x=x)[0], np.maximum(x, 0))


def test_graph_output_that_is_an_input_or_a_constant():
    x = randn(2, 3)
    nodes = [helper.make_node("Identity", ["x"], ["a"]),
             helper.make_node("Constant", [], ["c"], value_floats=[1.0, 2.0])]
    m = model(nodes, {"x": x}, ["a", "c"])
    compare(m, {"x": x}, tol=0.0)


def test_float64_model():
    x = randn(2, 3, dtype=np.float64)
    node = helper.make_node("Mul", ["x", "w"], ["y"])
    m = model([node], {"x": x}, ["y"], {"w": randn(3, seed=1, dtype=np.float64)})
    _, ins, outs = oxi.load(m)
    assert ins[0].dtype == outs[0].dtype == "float64"
    compare(m, {"x": x}, tol=0.0)


def test_int64_model_input_is_typed():
    node = helper.make_node("Identity", ["i"], ["o"])
    g = helper.make_graph([node], "t", [helper.make_tensor_value_info("i", TensorProto.INT64, [3])],
                          [helper.make_tensor_value_info("o", TensorProto.INT64, [3])])
    _, ins, _ = oxi.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert ins[0].dtype == "int64"


# ---- Div, Cast, ReduceMean ----------------------------------------------------
@pytest.mark.parametrize("a,b", BROADCASTS)
@pytest.mark.parametrize("opset", [7, 13, 14])
def test_div_broadcasting(a, b, opset):
    x, y = randn(*a), randn(*b, seed=1) + np.float32(3.0)  # away from 0
    node = helper.make_node("Div", ["x", "y"], ["z"])
    compare(model([node], {"x": x, "y": y}, ["z"], opset=opset), {"x": x, "y": y}, tol=1e-7)


def test_div_of_integer_constants_truncates_toward_zero():
    """Folded integer Div (ShuffleNet's ``channels // groups``): C division, as onnxruntime."""
    a = np.array([7, -7, 7, -7, 6, 0], np.int64)
    b = np.array([2, 2, -2, -2, 3, 5], np.int64)
    nodes = [helper.make_node("Constant", [], ["a"], value=numpy_helper.from_array(a)),
             helper.make_node("Constant", [], ["b"], value=numpy_helper.from_array(b)),
             helper.make_node("Div", ["a", "b"], ["q"]), helper.make_node("Cast", ["q"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "f"], ["y"])]
    x = np.zeros(6, np.float32)
    compare(model(nodes, {"x": x}, ["y"]), {"x": x}, tol=0.0)
    np.testing.assert_array_equal(run(model(nodes, {"x": x}, ["y"]), {"x": x})[0], [3, -3, -3, 3, 2, 0])


@pytest.mark.parametrize("opset", [8, 9, 13, 19, 21, 23, 25])  # opset 8 selects Cast 6
def test_cast_folds_constants_and_keeps_a_tensor_of_its_own_dtype(opset):
    x = randn(4, 2, 3)
    nodes = [helper.make_node("Shape", ["x"], ["s"]),                                  # int64 [4, 2, 3]
             helper.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT),            # folded
             helper.make_node("Cast", ["x"], ["xc"], to=TensorProto.FLOAT),            # same dtype: no node
             helper.make_node("Mul", ["xc", "sf"], ["y"])]
    m = model(nodes, {"x": x}, ["y"], opset=opset)
    compare(m, {"x": x}, tol=0.0)
    g, _, outs = oxi.load(m)
    assert [type(v.op).__name__ for v in g.nodes_in_order(outs)] == ["Source", "Constant", "Mul"]


def test_cast_of_a_computed_tensor_to_another_dtype_is_refused_and_a_parameter_is_converted():
    x = randn(2, 3)
    m = model([helper.make_node("Cast", ["x"], ["y"], name="c", to=TensorProto.DOUBLE)], {"x": x}, ["y"])
    with pytest.raises(oxi.OnnxImportError, match="ONNX node 'c' \\(Cast\\): casting a computed float32 "
                                                  "tensor to float64 is not supported"):
        oxi.load(m)
    w = randn(3, seed=2, dtype=np.float64)
    nodes = [helper.make_node("Cast", ["w"], ["w32"], to=TensorProto.FLOAT), helper.make_node("Mul", ["x", "w32"], ["y"])]
    m = model(nodes, {"x": x}, ["y"], {"w": w})
    compare(m, {"x": x}, tol=0.0)
    g, _, _ = oxi.load(m)
    (p,) = g.sources("param")
    assert p.type.dtype == "float32"  # still trainable, in the dtype the graph computes with


@pytest.mark.parametrize("axes,keepdims", [([2, 3], 1), ([2, 3], 0), ([-1], 1), ([1], 0), (None, 1), (None, 0)])
@pytest.mark.parametrize("opset", [10, 11, 13, 18])
def test_reduce_mean(axes, keepdims, opset):
    x = randn(2, 3, 4, 5)
    if opset < 18:
        node = helper.make_node("ReduceMean", ["x"], ["y"], keepdims=keepdims,
                                **({} if axes is None else {"axes": axes}))
        inits = None
    else:
        node = helper.make_node("ReduceMean", ["x"] + ([] if axes is None else ["axes"]), ["y"], keepdims=keepdims)
        inits = None if axes is None else {"axes": np.array(axes, np.int64)}
    compare(model([node], {"x": x}, ["y"], inits, opset=opset), {"x": x}, tol=1e-6)


def test_reduce_mean_18_noop_with_empty_axes_and_errors():
    x = randn(2, 3)
    m = model([helper.make_node("ReduceMean", ["x"], ["y"], noop_with_empty_axes=1)], {"x": x}, ["y"], opset=18)
    compare(m, {"x": x}, tol=0.0)
    m = model([helper.make_node("ReduceMean", ["x"], ["y"], name="r", axes=[1, -1])], {"x": x}, ["y"], opset=13,
              check=False, output_shapes={"y": (2, 1)})
    with pytest.raises(oxi.OnnxImportError, match="ONNX node 'r' \\(ReduceMean\\): axes \\[1, -1\\] repeat"):
        oxi.load(m)
