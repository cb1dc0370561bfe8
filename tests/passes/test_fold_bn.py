"""The ``bn-fold`` fusion rule (``passes/fold_bn.py``): an inference-form batch
norm after a convolution folded into its weights and bias. Where it fires
(the CPU; cuda compiled without a GPU, cuDNN's checks stubbed, where the
folded convolution then takes its ReLU in cuDNN's fused graph), where it must
not (the batch norm's scale differentiated, excluded by name or by the tag
``fused``, an output in between), and the values against the float64
reference: forward, and a training step of the convolution under a frozen
batch norm."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import opgraph as og
from opgraph.benchmarks import check
from opgraph.op import Lowered, abstract_of

from inference_blocks import conv_bn_relu
from passes_stubs import compile_for_cuda, cudnn_accepts

FOLDED = "convolution + inference batch norm (folded into the weights) fused"


def folded(notes) -> int:
    found = [n for n in notes if n.startswith("fuse: ") and FOLDED in n]
    return int(found[0].split()[1]) if found else 0


def ops_of(graph, outs) -> collections.Counter:
    return collections.Counter(v.op.op.name for v in graph.nodes_in_order(outs) if isinstance(v.op, Lowered))


def reference(outs, feeds):
    return og.compile(outs, pipeline="reference", dtype="float64")(**feeds)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("groups", [1, 4])
def test_the_forward_folds_on_the_cpu_and_equals_the_reference(bias, groups):
    g, y, _, feeds = conv_bn_relu(bias, groups)
    exe = og.compile([y])
    assert folded(exe.report.notes) == 1, exe.report.notes
    names = {abstract_of(st.op).name for st in exe.steps}
    assert "BatchNorm" in names  # the bias's fold, on (1, O): no step runs over the activations
    assert all(st.name.startswith("bn/fold_") for st in exe.steps if abstract_of(st.op).name == "BatchNorm")
    (want,), (got,) = reference([y], feeds), exe(**feeds)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    off = og.compile([y], policy={"exclude": ["bn-fold"]})
    assert folded(off.report.notes) == 0 and "bn" in {st.name for st in off.steps}


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_on_cuda_the_folded_convolution_takes_its_relu_in_one_cudnn_graph(monkeypatch, layout, dtype):
    cudnn_accepts(monkeypatch)
    g, y, _, _ = conv_bn_relu()
    graph, outs, report = compile_for_cuda([y], og.LoweringPolicy(layout=layout), dtype=dtype)
    count = ops_of(graph, outs)
    assert folded(report.notes) == 1 and count["Conv2dBiasRelu"] == 1, (count, report.notes)
    assert not count["Relu"] and not count["Conv2d"]
    steps = [v for v in graph.nodes_in_order(outs) if isinstance(v.op, Lowered)]
    assert {v.op.algorithm for v in steps if v.name.startswith("bn/fold_")} <= {"codegen", "cuda"}  # no oracle
    conv = next(v for v in steps if v.op.op.name == "Conv2dBiasRelu")
    assert graph.node(graph.input_ids(conv.id)[1]).type.layout == conv.input_types[0].layout  # weights stored alike
    assert report.node(conv.name).absorbed.keys() >= {"bn", "relu"}


def test_a_differentiated_scale_reads_the_convolution_output_so_nothing_folds():
    g, y, params, _ = conv_bn_relu()
    exe = og.compile([y, *og.grad(y, params, grad_outputs=[y])])
    assert folded(exe.report.notes) == 0 and "bn" in {st.name for st in exe.steps}


def test_a_frozen_batch_norm_folds_in_a_training_step_and_the_gradients_stay_right():
    g, y, params, feeds = conv_bn_relu()
    w, b = params[:2]
    outs = [y, *og.grad(y, [w, b], grad_outputs=[y])]
    exe = og.compile(outs)
    assert folded(exe.report.notes) == 1
    for got, want in zip(exe(**feeds), reference(outs, feeds)):
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_the_per_node_check_takes_the_batch_norm_as_the_folded_convolutions_twin():
    """The folded convolution computes the batch norm's value, so the per-node
    check (``benchmarks/check.py``) compares it with the abstract batch norm."""
    g, y, params, _ = conv_bn_relu()
    outs = [y, *og.grad(y, params[:2], grad_outputs=[y])]
    by_name = {v.name: v.id for v in g.nodes_in_order(outs)}
    for policy, twin in (({"exclude": ["conv-epilogue"]}, "bn"), ({}, "relu"), ({"exclude": ["bn-fold"]}, "conv2d")):
        exe = og.compile(outs, policy=policy)
        conv = next(st for st in exe.steps if st.name == "conv2d")
        assert abstract_of(conv.op).name == ("Conv2dBiasRelu" if twin == "relu" else "Conv2d")
        assert check.abstract_twin(exe.graph, g, conv.node) == by_name[twin], policy


@pytest.mark.parametrize("policy", [{"exclude": ["bn-fold"]}, {"exclude": ["fused"]}])
def test_excluded_by_name_or_by_the_fused_tag_nothing_folds(policy):
    g, y, _, _ = conv_bn_relu()
    exe = og.compile([y], policy=policy)
    assert folded(exe.report.notes) == 0 and "bn" in {st.name for st in exe.steps}


def test_a_convolution_output_that_is_also_an_output_stays():
    g, y, _, _ = conv_bn_relu()
    conv = next(v for v in g.nodes_in_order([y]) if v.op.name == "Conv2d")
    exe = og.compile([y, g.value(conv.id)])
    assert folded(exe.report.notes) == 0
