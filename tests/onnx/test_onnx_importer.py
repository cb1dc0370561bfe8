"""The importer's handling of a model's tensors: parameters given as graph
inputs without values (weightless exports, ``inputs=``), tensors deduplicated
behind ``Identity`` nodes, running statistics as buffers, undefined tensors,
and ``dtype=`` storage conversion. Numbers are checked against
``onnx.reference.ReferenceEvaluator``."""

import numpy as np
import pytest

pytest.importorskip("onnx.reference")

from onnx import TensorProto, helper  # noqa: E402

from onnxcheck import randn, reference, rel_error  # noqa: E402

import opgraph as og  # noqa: E402
import opgraph.onnx as oxi  # noqa: E402
from opgraph import ops  # noqa: E402
from opgraph.errors import ParameterError  # noqa: E402


def info(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def weightless():
    """conv -> BN -> relu -> flatten -> gemm, exported the way ``export_params=False``
    writes it: the weights are graph inputs, and the exporter shares equal tensors
    through Identity nodes (the conv bias and the BN bias and mean read ``zeros``,
    the BN scale and variance ``ones``)."""
    nodes = [helper.make_node("Identity", ["zeros"], ["conv.bias"]),
             helper.make_node("Identity", ["zeros"], ["bn.running_mean"]),
             helper.make_node("Identity", ["ones"], ["bn.running_var"]),
             helper.make_node("Conv", ["x", "conv.weight", "conv.bias"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "ones", "zeros", "bn.running_mean", "bn.running_var"],
                              ["b"], name="bn"),
             helper.make_node("Relu", ["b"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["y"], name="fc", transB=1)]
    inputs = [info("x", ["N", 3, 4, 4]), info("conv.weight", [4, 3, 3, 3]), info("zeros", [4]), info("ones", [4]),
              info("fc.weight", [5, 64]), info("fc.bias", [5])]
    g = helper.make_graph(nodes, "weightless", inputs, [info("y", ["N", 5])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_parameter_inputs_become_one_source_per_name():
    graph, inputs, (y,) = oxi.load(weightless(), batch=2, inputs=["x"])
    assert [v.name for v in inputs] == ["x"] and inputs[0].shape == (2, 3, 4, 4) and y.shape == (2, 5)
    roles = {s.name: s.op.role for s in graph.sources()}
    assert roles == {"x": "input", "conv.weight": "param", "conv.bias": "param", "ones": "param", "zeros": "param",
                     "bn.running_mean": "buffer", "bn.running_var": "buffer", "fc.weight": "param", "fc.bias": "param"}
    assert not graph.param_values  # nothing to default to: every source is fed (the benchmark draws them)


def test_weightless_model_agrees_with_the_reference_fed_by_origin():
    m = weightless()
    feeds = {"x": randn(2, 3, 4, 4), "conv.weight": randn(4, 3, 3, 3, seed=1), "zeros": randn(4, seed=2),
             "ones": np.abs(randn(4, seed=3)) + 0.5, "fc.weight": randn(5, 64, seed=4), "fc.bias": randn(5, seed=5)}
    origin = {"conv.bias": "zeros", "bn.running_mean": "zeros", "bn.running_var": "ones"}
    graph, _, outs = oxi.load(m, batch=2, inputs=["x"])
    ours = {s.name: feeds[origin.get(s.name, s.name)] for s in graph.sources()}
    (got,) = og.compile(outs)(**ours)
    assert rel_error(got, reference(m, feeds)[0]) < 1e-5


def test_running_statistics_initializers_are_buffers_with_the_files_values():
    x = randn(2, 3, 2, 2)
    inits = {n: randn(3, seed=i) for i, n in enumerate(("s", "b", "m"))} | {"v": np.full(3, 2.0, np.float32)}
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"])
    g = helper.make_graph([node], "bn", [info("x", [2, 3, 2, 2])], [info("y", [2, 3, 2, 2])],
                          [helper.make_tensor(n, TensorProto.FLOAT, [3], a) for n, a in inits.items()])
    graph, _, outs = oxi.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert {s.name for s in graph.sources("buffer")} == {"m", "v"}
    np.testing.assert_array_equal(graph.param_values["v"], inits["v"])
    (got,) = og.compile(outs)(x=x)  # parameters and buffers default to the file's values
    assert rel_error(got, reference(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
                                    {"x": x})[0]) < 1e-6


def test_default_keeps_every_graph_input_as_data():
    graph, inputs, _ = oxi.load(weightless())
    assert len(inputs) == 6 and not graph.sources("param")
    with pytest.raises(ParameterError, match="fixed batch of 4.*name the data inputs with inputs="):
        oxi.load(weightless(), batch=2)


def test_input_names_are_checked_and_parameter_inputs_must_be_static_floats():
    with pytest.raises(ParameterError, match="inputs='image': is not a graph input.*'x', 'conv.weight'"):
        oxi.load(weightless(), inputs=["image"])
    m = weightless()
    m.graph.input[1].type.tensor_type.shape.dim[0].dim_param = "K"
    with pytest.raises(oxi.OnnxImportError, match="graph input 'conv.weight' has a symbolic dimension at "
                                                  "axis 0; a parameter input .* needs a static shape"):
        oxi.load(m, inputs=["x"])
    m = weightless()
    m.graph.input[5].type.tensor_type.elem_type = TensorProto.INT64
    with pytest.raises(oxi.OnnxImportError, match="graph input 'fc.bias' is int64"):
        oxi.load(m, inputs=["x"])
    with pytest.raises(ParameterError, match="inputs="):
        oxi.load(weightless(), inputs="x")


def test_a_parameter_read_as_a_constant_is_named():
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"], name="r")]
    g = helper.make_graph(nodes, "t", [info("x", [2, 3]), info("shape", [2], TensorProto.INT64)], [info("y", None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(oxi.OnnxImportError, match="is int64"):
        oxi.load(m, inputs=["x"])
    g = helper.make_graph([helper.make_node("Clip", ["x", "lo"], ["y"], name="c")], "t",
                          [info("x", [2]), info("lo", [])], [info("y", None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(oxi.OnnxImportError, match="ONNX node 'c' \\(Clip\\): input 1 \\(min\\) must be a constant.*"
                                                  "graph input 'lo' has no value in the file"):
        oxi.load(m, inputs=["x"])


def test_undefined_tensors_are_all_named_with_their_readers():
    m = weightless()
    del m.graph.input[3]   # 'ones': read by bn (scale) and by the Identity of bn.running_var
    del m.graph.node[0]    # 'conv.bias' is no longer defined
    with pytest.raises(oxi.OnnxImportError) as e:
        oxi.load(m, inputs=["x"])
    msg = str(e.value)
    assert "2 tensor(s) are read but not defined" in msg
    assert "'ones' (read by ONNX node 'bn.running_var' (Identity))" in msg
    assert "'conv.bias' (read by ONNX node 'conv' (Conv))" in msg


@pytest.mark.parametrize("nodes,written", [
    # two nodes writing one tensor: onnxruntime refuses such a model; the importer read the last writer
    ([helper.make_node("Relu", ["x"], ["y"], name="a"), helper.make_node("Sigmoid", ["x"], ["y"], name="b")],
     "'y' (by ONNX node 'a' (Relu) and ONNX node 'b' (Sigmoid))"),
    # a node writing over a graph input
    ([helper.make_node("Relu", ["x"], ["x"], name="a"), helper.make_node("Sigmoid", ["x"], ["y"], name="b")],
     "'x' (a graph input or initializer, and by ONNX node 'a' (Relu))"),
])
def test_a_tensor_written_twice_is_an_error_naming_it_and_its_writers(nodes, written):
    """ONNX graphs are in single static assignment form (onnx.checker and onnxruntime refuse a
    tensor name defined twice); the importer took whichever definition came last, silently."""
    g = helper.make_graph(nodes, "t", [info("x", [2, 3])], [info("y", None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(oxi.OnnxImportError, match="defined more than once") as e:
        oxi.load(m)
    assert written in str(e.value)


@pytest.mark.parametrize("dtype,tol", [("float64", 1e-6), ("float16", 1e-2), ("bfloat16", 2e-2)])
def test_dtype_converts_every_floating_tensor(dtype, tol):
    m = weightless()
    graph, (x,), (y,) = oxi.load(m, batch=2, inputs=["x"], dtype=dtype)
    assert {s.type.dtype for s in graph.sources()} == {dtype} and y.dtype == dtype
    feeds = {"x": randn(2, 3, 4, 4), "conv.weight": randn(4, 3, 3, 3, seed=1), "zeros": randn(4, seed=2),
             "ones": np.abs(randn(4, seed=3)) + 0.5, "fc.weight": randn(5, 64, seed=4) / 8, "fc.bias": randn(5, seed=5)}
    origin = {"conv.bias": "zeros", "bn.running_mean": "zeros", "bn.running_var": "ones"}
    (got,) = og.compile([y])(**{s.name: feeds[origin.get(s.name, s.name)] for s in graph.sources()})
    assert got.dtype.name == dtype
    assert rel_error(got.astype(np.float64), reference(m, feeds)[0]) < tol


def test_dtype_casts_constants_and_initializers():
    x = randn(2, 3)
    nodes = [helper.make_node("Constant", [], ["c"], value_floats=[0.5, 1.0, 2.0]),
             helper.make_node("Mul", ["x", "c"], ["m"]), helper.make_node("Add", ["m", "w"], ["y"])]
    g = helper.make_graph(nodes, "t", [info("x", [2, 3])], [info("y", [2, 3])],
                          [helper.make_tensor("w", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])])
    graph, _, (y,) = oxi.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), dtype="bfloat16")
    kinds = {type(v.op).__name__: v.type.dtype for v in graph.nodes_in_order([y])}
    assert kinds == {"Source": "bfloat16", "Constant": "bfloat16", "Mul": "bfloat16", "BroadcastAdd": "bfloat16"}
    assert graph.param_values["w"].dtype.name == "bfloat16"
    np.testing.assert_allclose(og.compile([y])(x=x)[0].astype(np.float32), x * [0.5, 1, 2] + [1, 2, 3], rtol=1e-2)
    with pytest.raises(ParameterError, match="dtype='int64'"):
        oxi.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), dtype="int64")


def test_identity_of_a_weight_used_as_a_buffer_and_a_param_by_one_name_gets_two_sources():
    """One tensor read as a BN bias and, directly, as a running mean: a param and a buffer."""
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "z", "z", "s"], ["y"], name="bn")]
    g = helper.make_graph(nodes, "t", [info("x", [1, 2, 2, 2]), info("s", [2]), info("z", [2])],
                          [info("y", [1, 2, 2, 2])])
    graph, _, (y,) = oxi.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), inputs=["x"])
    assert [(s.name, s.op.role) for s in graph.sources() if s.op.role != "input"] == [
        ("s", "param"), ("z", "param"), ("z_2", "buffer"), ("s_2", "buffer")]
    assert isinstance(y.op, ops.BatchNorm)
