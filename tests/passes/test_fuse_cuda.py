"""What the fuse pass does on cuda, compiled on this machine without a GPU
(the cuDNN checks stubbed to accept, ``passes_stubs.cudnn_accepts``): the
lowering decisions are the real rules' (tags, order, fused op types)."""

from __future__ import annotations

import pytest

import opgraph as og
from opgraph.op import Lowered

from passes_stubs import compile_for_cuda, cudnn_accepts


def small_training_step():
    """Two conv + bias + ReLU + max pool blocks (the second with asymmetric
    padding), with every parameter gradient."""
    g = og.Graph()
    x = g.input("x", (2, 3, 12, 12))
    w1, b1 = g.param("w1", (8, 3, 3, 3)), g.param("b1", (8,))
    w2, b2 = g.param("w2", (8, 8, 3, 3)), g.param("b2", (8,))
    h = og.relu(og.conv2d(x, w1, b1, padding=1, name="conv1"), name="relu1")
    p = og.max_pool2d(h, 2, name="pool1")
    h2 = og.relu(og.conv2d(p, w2, b2, padding=((1, 0), (0, 1)), name="conv2"), name="relu2")
    y = og.max_pool2d(h2, 2, name="pool2")
    grads = og.grad(y, [w1, b1, w2, b2])
    return [y, *grads]


def lowered(graph, outs):
    return [v for v in graph.nodes_in_order(outs) if isinstance(v.op, Lowered)]


@pytest.fixture
def cudnn_ok(monkeypatch):
    cudnn_accepts(monkeypatch)


def test_excluding_fused_keeps_cudnn_on_every_convolution(cudnn_ok):
    """issue 17: ``exclude=['fused']`` turns fusion off and nothing else; the
    plain convolutions stay on cuDNN (their rules are not tagged ``fused``)."""
    graph, outs, report = compile_for_cuda(small_training_step(), og.LoweringPolicy(exclude=["fused"]))
    nodes = lowered(graph, outs)
    convs = [v for v in nodes if v.op.family == "conv"]
    assert len(convs) == 5  # 2 forward, 1 backward-data (conv1's is not needed), 2 backward-filter
    assert {v.op.algorithm for v in convs} == {"cudnn"}
    assert not any(v.op.op.fused for v in nodes)
    assert {v.op.op.name for v in convs} == {"Conv2d", "Conv2dBackwardData", "Conv2dBackwardFilter"}
    assert any("0 conv + bias + relu chain(s) fused" in n and "excluded by policy" in n for n in report.notes)
    # cuDNN takes symmetric padding only: conv2's asymmetric excess is explicit in all three directions
    assert sum(v.op.op.name in ("Pad", "PadBackward") for v in nodes) == 3


def test_fusion_on_cuda_runs_the_fused_ops_on_cudnn(cudnn_ok):
    """The same step with fusion on: each conv + bias + ReLU is one fused node
    on cuDNN; the unfused convolutions are on cuDNN too."""
    graph, outs, _ = compile_for_cuda(small_training_step())
    nodes = lowered(graph, outs)
    fused = [v for v in nodes if v.op.op.fused and v.op.family == "conv"]
    assert {v.name for v in fused if v.op.direction == "fwd"} == {"conv1", "conv2"}
    assert {v.op.algorithm for v in nodes if v.op.family == "conv"} == {"cudnn"}
    assert not any(v.op.op.name == "Relu" for v in nodes)


def resnet_and_mobilenet_step():
    """A ResNet basic block (the residual added before the block's ReLU) and a
    MobileNet-style ReLU6 convolution, with every parameter gradient."""
    g = og.Graph()
    x = g.input("x", (2, 8, 8, 8))
    p = {n: g.param(n, s) for n, s in (("w1", (8, 8, 3, 3)), ("b1", (8,)), ("w2", (8, 8, 3, 3)), ("b2", (8,)),
                                        ("w3", (8, 8, 1, 1)), ("b3", (8,)))}
    a = og.relu(og.conv2d(x, p["w1"], p["b1"], padding=1, name="conv1"), name="relu1")
    h = og.relu(og.add(og.conv2d(a, p["w2"], p["b2"], padding=1, name="conv2"), x, name="add"), name="relu2")
    m = og.relu6(og.conv2d(h, p["w3"], p["b3"], name="conv3"), name="relu6")
    y = og.max_pool2d(m, 2, name="pool")
    return [y, *og.grad(y, list(p.values()))]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_residual_relu6_and_dgrad_relu_fuse_onto_cudnn(cudnn_ok, layout):
    graph, outs, report = compile_for_cuda(resnet_and_mobilenet_step(), og.LoweringPolicy(layout=layout))
    nodes = lowered(graph, outs)
    convs = {v.name: v.op for v in nodes if v.op.family == "conv"}
    assert {op.algorithm for op in convs.values()} == {"cudnn"}
    assert convs["conv1"].op.name == "Conv2dBiasRelu"
    assert (convs["conv2"].op.name, convs["conv2"].op.activation, convs["conv2"].op.residual) == \
        ("Conv2dBiasActivation", "relu", True)
    assert (convs["conv3"].op.activation, convs["conv3"].op.residual) == ("relu6", False)
    dgrad_relu = [op for op in convs.values() if op.op.name == "Conv2dBackwardDataRelu"]
    # conv2's input gradient masked by relu1's, conv3's by relu2's (both read by that conv alone)
    assert sorted(op.op.padding[0][0] for op in dgrad_relu) == [0, 1]
    assert not any(v.op.op.name in ("Add", "Relu", "Hardtanh") for v in nodes)
    assert all(op.option_dict.get("precision") == "fp32" for op in convs.values())
    # excluding "fused" leaves every convolution on cuDNN, unfused
    graph, outs, _ = compile_for_cuda(resnet_and_mobilenet_step(),
                                      og.LoweringPolicy(layout=layout, exclude=["fused"]))
    nodes = lowered(graph, outs)
    assert not any(v.op.op.fused for v in nodes)
    assert {v.op.algorithm for v in nodes if v.op.family == "conv"} == {"cudnn"}


def strided_bottleneck_step():
    """A ResNet-50 downsampling block's first two convolutions: 1x1 + ReLU,
    then 3x3 at stride 2 + ReLU (torchvision's v1.5 puts the stride there),
    then a 1x1 at stride 1, with every parameter gradient."""
    g = og.Graph()
    x = g.input("x", (2, 8, 8, 8))
    p = {n: g.param(n, s) for n, s in (("w1", (8, 8, 1, 1)), ("w2", (8, 8, 3, 3)), ("w3", (8, 8, 1, 1)))}
    a = og.relu(og.conv2d(x, p["w1"], name="conv1"), name="relu1")
    b = og.relu(og.conv2d(a, p["w2"], stride=2, padding=1, name="conv2"), name="relu2")
    y = og.conv2d(b, p["w3"], name="conv3")
    return [y, *og.grad(y, list(p.values()))]


def test_a_strided_backward_data_keeps_its_relu_gradient_apart(cudnn_ok):
    """cuDNN declines the fused backward-data + ReLU gradient of a strided
    convolution (``cudnn_rules.STRIDED_DGRAD_RELU``: 10-20x slower on the
    H200), so ``dgrad-relu`` leaves conv2's pair alone, saying why, and still
    fuses conv3's (stride 1)."""
    from opgraph.backends.cuda.cudnn_rules import STRIDED_DGRAD_RELU
    graph, outs, report = compile_for_cuda(strided_bottleneck_step(), og.LoweringPolicy(layout="NHWC"))
    dgrads = {v.name: v.op.op.name for v in lowered(graph, outs)
              if v.op.family == "conv" and v.op.direction == "dgrad"}
    assert dgrads == {"conv3.grad/conv2d_backward_data": "Conv2dBackwardDataRelu",
                      "conv2.grad/conv2d_backward_data": "Conv2dBackwardData"}, dgrads
    assert any(STRIDED_DGRAD_RELU in note for note in report.notes), report.notes
