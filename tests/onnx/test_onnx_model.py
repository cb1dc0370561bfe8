"""``opgraph.benchmarks.onnx_model``: an ONNX file as a benchmark Model that
the driver times like the built-in models."""

import numpy as np
import pytest

pytest.importorskip("onnx.reference")

from onnx import helper  # noqa: E402

from onnxcheck import model, reference  # noqa: E402
from test_onnx_networks import build  # noqa: E402

import opgraph as og  # noqa: E402
from opgraph.benchmarks import driver  # noqa: E402
from opgraph.benchmarks.onnx_model import declared_batch, load_model  # noqa: E402
from opgraph.errors import ParameterError  # noqa: E402


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


def test_dtype_must_be_the_files(resnet_file):
    path, _, _ = resnet_file
    assert load_model(path, dtype="float32").dtype == "float32"
    with pytest.raises(ParameterError, match="dtype='float16'"):
        load_model(path, dtype="float16")
