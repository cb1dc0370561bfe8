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
