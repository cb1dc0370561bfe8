"""``opgraph.benchmarks.onnx_model``: an ONNX file as a benchmark Model that
the driver times like the built-in models."""

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx.reference")

from onnx import helper  # noqa: E402

from onnxcheck import model, reference  # noqa: E402
from test_onnx_networks import build  # noqa: E402

import opgraph as og  # noqa: E402
from opgraph.benchmarks import driver  # noqa: E402
from opgraph.benchmarks.onnx_model import declared_batch, load_model  # noqa: E402
from opgraph.benchmarks.protocol import random_feeds  # noqa: E402
from opgraph.errors import ParameterError  # noqa: E402
from opgraph.onnx import OnnxImportError  # noqa: E402


@pytest.fixture
def resnet_file(tmp_path):
    m, x = build("resnet")
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"  # symbolic batch
    path = tmp_path / "tiny_resnet.onnx"
    path.write_bytes(m.SerializeToString())
    return path, m, x


def test_load_model_fills_the_benchmark_record(resnet_file):
    path, m, x = resnet_file
    assert declared_batch(path) is None
    mod = load_model(path, batch=3)
    assert (mod.key, mod.spec_key, mod.batch, mod.seed_batch, mod.dtype) == ("tiny_resnet", "onnx", 3, 1, "float32")
    assert mod.input.shape == (3, 4, 8, 8) and mod.output.shape == (3, 10)
    assert mod.first_conv_input.node == mod.input.node
    # 6 conv weights, scale and bias of 6 batch norms, Gemm weight and bias;
    # the running mean and var are constants, not parameters
    assert len(mod.params) == 6 + 2 * 6 + 2
    stats = {n for node in m.graph.node if node.op_type == "BatchNormalization" for n in node.input[3:]}
    assert len(stats) == 12 and not stats & {p.name for p in mod.params}
    xs = np.concatenate([x, x[:1]])
    got = og.compile([mod.output])(**{mod.input.name: xs})[0]
    np.testing.assert_allclose(got, reference(m, {"x": xs})[0], rtol=1e-4, atol=1e-5)


def test_driver_times_an_imported_model(resnet_file):
    path, _, _ = resnet_file
    mod = load_model(path, batch=2)
    res = driver.time_forward(mod, device="cpu", warmup=0, repeat=1)
    assert res.model == "tiny_resnet" and res.batch == 2 and len(res.times_ms) == 1 and res.flops > 0
    grads = og.grad(mod.output, mod.params)  # parameters only, as the protocol's backward
    assert len(grads) == len(mod.params)


def test_load_model_refuses_what_the_protocol_cannot_feed(tmp_path):
    x = np.zeros((2, 3), np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Relu", ["x"], ["z"])]
    path = tmp_path / "two.onnx"
    path.write_bytes(model(nodes, {"x": x}, ["y", "z"]).SerializeToString())
    with pytest.raises(ParameterError, match="one input and one output"):
        load_model(path)
    path = tmp_path / "flat.onnx"
    path.write_bytes(model(nodes[:1], {"x": x}, ["y"]).SerializeToString())
    with pytest.raises(ParameterError, match="\\(N, C, H, W\\)"):
        load_model(path)
    assert declared_batch(path) == 2


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_dtype_converts_the_model(resnet_file, dtype):
    """``--dtype`` applies to an imported model as to the built-in ones: every
    floating tensor is stored in it (it was ignored: the record said float32)."""
    path, m, x = resnet_file
    mod = load_model(path, batch=2, dtype=dtype)
    assert mod.dtype == dtype and mod.input.dtype == mod.output.dtype == dtype
    assert {p.dtype for p in mod.params} == {dtype}
    assert {s.type.dtype for s in mod.graph.sources("buffer")} == {dtype}
    assert load_model(path).dtype == "float32"  # None: the file's
    xs = np.concatenate([x, x[:1]])[:2]
    got = og.compile([mod.output])(**{mod.input.name: xs})[0]
    assert got.dtype.name == dtype
    want = reference(m, {"x": xs})[0]
    assert np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want) < (1e-6 if dtype == "float64" else 3e-2)
    with pytest.raises(ParameterError, match="dtype='int64'"):
        load_model(path, dtype="int64")


WEIGHTLESS = Path(__file__).parent / "models" / "resnet18.onnx"


def test_weightless_file_takes_its_parameters_from_the_graph_inputs():
    mod = load_model(WEIGHTLESS, batch=2)
    assert mod.input.name == "x" and mod.input.shape == (2, 3, 224, 224) and mod.seed_batch == 1
    assert len(mod.params) == 42 and sum(p.type.size for p in mod.params) == 11_684_712
    feeds = random_feeds(mod)  # the protocol draws them as the built-in models' parameters
    assert set(feeds) == {"x", *(p.name for p in mod.params)}
    assert all(np.isfinite(a).all() for a in feeds.values())


def test_the_image_input_can_be_named(tmp_path):
    """``--onnx-input NAME``: another graph input than the first is the image, the rest parameters."""
    nodes = [helper.make_node("Conv", ["img", "w"], ["y"])]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("w", 1, [4, 3, 3, 3]),
                                       helper.make_tensor_value_info("img", 1, ["N", 3, 8, 8])],
                          [helper.make_tensor_value_info("y", 1, ["N", 4, 6, 6])])
    path = tmp_path / "second.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    with pytest.raises(OnnxImportError, match="graph input 'img' has a symbolic dimension at axis 0; a parameter "
                                              "input \\(any input but 'w'\\) needs a static shape"):
        load_model(path)
    mod = load_model(path, batch=2, input_name="img")
    assert mod.input.name == "img" and [p.name for p in mod.params] == ["w"] and mod.output.shape == (2, 4, 6, 6)
    with pytest.raises(ParameterError, match="second.onnx has no graph input of that name; its graph inputs are w, img"):
        load_model(path, input_name="image")


def test_a_matmul_with_a_parameter_is_a_layer_of_the_flop_counts():
    """ConvNeXt-tiny's MLPs import as MatMul (nn.Linear on a channels-last 4-D value): each is a
    layer as Linear is, so the model's FLOPs (records.model_flops: TFLOP/s, % of peak) are its
    convolutions' and matrix products' (about 8.9 GFLOP at batch 1), not its 22 convolutions' and
    classifier's 0.59."""
    from opgraph.benchmarks.protocol import training_graph
    from opgraph.op import abstract_of
    from opgraph.analysis import node_flops

    m = load_model(Path(__file__).parent / "models" / "convnext_tiny.onnx", batch=1)
    tg = training_graph(m)
    g = m.output.graph
    kinds = {}
    want = 0
    for node in g.nodes_in_order([m.output]):
        name = abstract_of(node.op).name
        if name in ("Conv2d", "MatMul", "Linear"):
            kinds[name] = kinds.get(name, 0) + 1
            want += node_flops(node)
    assert set(tg.layers.values()) == {"Conv2d", "MatMul", "Linear"}  # the classifier is a Gemm: Linear
    assert len(tg.layers) == sum(kinds.values()) == 59 and kinds["MatMul"] == 36
    assert sum(tg.layer_flops.values()) == want > 8e9
