"""The modern convnets (ResNet-50, DenseNet-121, MobileNet-v2, EfficientNet-B0)
against ``benchmarks/specs/modern_convnets.json``, which
``scripts/torchvision_specs.py`` recorded from torchvision 0.29 with forward
hooks (not from this code).

Every module call torchvision makes is a node of the same name here, in the
same order, with the spec's op, attributes, output shape and parameter
count; every convolution and linear layer has the spec's FLOPs. FLOPs are
compared for convolutions and linear layers only: that is what the spec
(and torchvision-style counts) record, while opgraph's element-wise ops
(batch norm, activations, multiplies) count their own FLOPs too. The nodes
torchvision computes without a module (residual adds, concatenations,
flatten, the squeeze-and-excitation multiply, the batch-norm statistics) are
checked by op and count. That the numbers match torchvision's is
``test_models_torchvision.py`` (needs torchvision).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from opgraph.analysis import summarize, totals
from opgraph.benchmarks import models as M
from opgraph.errors import ParameterError
from opgraph.op import Source

SPECS = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "specs"
                    / "modern_convnets.json").read_text())["models"]
BATCH = 3  # any batch works for static checks; 3 catches per-image vs per-batch mix-ups
#: torchvision module type -> opgraph abstract op of its node.
OP_OF_TYPE = {"Conv2d": "Conv2d", "BatchNorm2d": "BatchNormTraining", "ReLU": "Relu",
              "ReLU6": "Hardtanh", "SiLU": "Silu", "Sigmoid": "Sigmoid", "MaxPool2d": "MaxPool2d",
              "AvgPool2d": "AvgPool2d", "AdaptiveAvgPool2d": "GlobalAvgPool2d", "Linear": "Linear",
              "Dropout": "Dropout", "StochasticDepth": "Mul"}
#: Per model, the nodes of computations torchvision makes without a module, by op
#: (besides three per batch norm: its statistics and two running updates), from
#: torchvision's forward code: ResNet-50 adds the identity in each of its 16
#: bottlenecks; DenseNet-121 concatenates in every dense layer but the first of a
#: block (5 + 11 + 23 + 15) and at the end of each of its 4 blocks, then applies
#: F.relu and global pooling; MobileNet-v2 has 10 residual blocks; EfficientNet-B0
#: gates each of its 16 blocks by squeeze-and-excitation (a Mul), has 9 residual
#: blocks, each with a stochastic-depth mask (a Constant); all flatten once.
FUNCTIONAL = {
    "resnet50": {"Add": 16, "Flatten": 1},
    "densenet121": {"Concat": 54 + 4, "Relu": 1, "GlobalAvgPool2d": 1, "Flatten": 1},
    "mobilenet_v2": {"Add": 10, "GlobalAvgPool2d": 1, "Flatten": 1},
    "efficientnet_b0": {"Mul": 16, "Add": 9, "Constant": 9, "Flatten": 1},
}
BN_PARTS = ("BatchNormStats", "BatchNormRunningUpdate")


@pytest.fixture(scope="module", params=M.MODERN)
def modern(request):
    model = M.build(request.param, batch=BATCH)
    rows = summarize(model.graph, model.forward_outputs)
    return model, SPECS[request.param], rows, {r.name: r for r in rows}


def test_registry_suite_names_aliases_and_batches():
    assert M.MODERN == tuple(SPECS)
    assert {M.SEED_BATCHES[k] for k in M.MODERN} == {128, 64} and M.SEED_BATCHES["densenet121"] == 64
    for alias, key in (("ResNet-50", "resnet50"), ("densenet-121", "densenet121"),
                       ("MobileNetV2", "mobilenet_v2"), ("efficientnet-b0", "efficientnet_b0")):
        assert M.resolve(alias) == key
    m = M.build("mobilenet_v2")
    assert (m.key, m.spec_key, m.batch, m.input.shape) == ("mobilenet_v2", "mobilenet_v2", 128,
                                                           (128, 3, 224, 224))
    small = M.MODELS["efficientnet_b0"](batch=2, dtype="float64", image=64)
    assert small.input.shape == (2, 3, 64, 64) and small.output.shape == (2, 1000)
    assert {p.dtype for p in small.params} == {"float64"}


def test_stochastic_depth_mask_and_its_probability_check():
    m = M.ModelBuilder("sd", "sd", "sd", input_chw=(4, 2, 2), batch=64, seed_batch=64)
    y = m.stochastic_depth(m.input, "sd", 0.25, seed=5)
    mask = m.graph["sd/mask"].op.value
    keep = np.random.default_rng(5).random((64, 1, 1, 1)) >= 0.25  # the Dropout op's rule
    np.testing.assert_array_equal(mask, np.where(keep, np.float32(1 / 0.75), np.float32(0)))
    assert 0 < keep.sum() < 64 and y.op.name == "Mul" and y.shape == (64, 4, 2, 2)
    assert m.stochastic_depth(m.input, "none", 0.0, seed=0) is m.input
    with pytest.raises(ParameterError, match="node bad: parameter p=1.0"):
        m.stochastic_depth(m.input, "bad", 1.0, seed=0)


def test_every_module_call_is_a_node_in_torchvision_order(modern):
    model, spec, rows, by_name = modern
    names = [layer["name"] for layer in spec["layers"]]
    assert [r.name for r in rows if r.name in set(names)] == names
    assert model.output.name == names[-1]


def test_every_layer_has_the_spec_op_attributes_shape_and_params(modern):
    model, spec, _, by_name = modern
    g = model.graph
    for layer in spec["layers"]:
        name, row = layer["name"], by_name[layer["name"]]
        node = g.node(g[name].node)
        op = node.op
        assert row.op == OP_OF_TYPE[layer["type"]], name
        assert row.shape == (BATCH, *layer["out"]), name
        assert row.params == layer["params"], name
        params = {v.name.rsplit(".", 1)[1]: v.shape for v in node.inputs
                  if isinstance(v.op, Source) and v.op.role == "param"}
        t = layer["type"]
        if t == "Conv2d":
            (ph, pw), kernel = layer["padding"], tuple(layer["kernel"])
            assert params["weight"][2:] == kernel and op.groups == layer["groups"], name
            assert op.stride == tuple(layer["stride"]) and op.padding == ((ph, ph), (pw, pw)), name
            assert ("bias" in params) == layer["bias"], name
            assert row.flops == BATCH * layer["flops"], name
        elif t == "Linear":
            assert ("bias" in params) == layer["bias"] and row.flops == BATCH * layer["flops"], name
        elif t == "BatchNorm2d":
            assert op.eps == layer["eps"], name
            for stat in ("mean", "var"):
                update = g.node(model.state_updates[f"{name}.running_{stat}"].node)
                assert update.op.momentum == layer["momentum"] and update.op.statistic == stat, name
        elif t in ("MaxPool2d", "AvgPool2d"):
            (ph, pw) = layer["padding"]
            assert op.kernel_size == tuple(layer["kernel"]) and op.stride == tuple(layer["stride"])
            assert op.padding == ((ph, ph), (pw, pw)) and not op.ceil_mode, name
        elif t == "AdaptiveAvgPool2d":
            assert layer["output_size"] == [1, 1], name
        elif t == "ReLU6":
            assert (op.min_val, op.max_val) == (0.0, 6.0), name
        elif t == "Dropout":
            assert op.training and op.p == layer["p"], name
        elif t == "StochasticDepth":
            mask = g.node(g[f"{name}/mask"].node).op.value
            assert layer["mode"] == "row" and mask.shape == (BATCH, 1, 1, 1), name
            assert set(np.unique(mask)) <= {0.0, np.float32(1 / (1 - layer["p"]))}, name


def test_nodes_without_a_module_are_the_functional_ones(modern):
    model, spec, rows, _ = modern
    named = {layer["name"] for layer in spec["layers"]}
    extra = Counter(r.op for r in rows if r.name not in named)
    bns = sum(layer["type"] == "BatchNorm2d" for layer in spec["layers"])
    assert extra.pop("BatchNormStats") == bns and extra.pop("BatchNormRunningUpdate") == 2 * bns
    assert dict(extra) == FUNCTIONAL[model.key]


def test_running_statistics_are_buffers_updated_by_every_batch_norm(modern):
    model, spec, rows, _ = modern
    bns = [layer["name"] for layer in spec["layers"] if layer["type"] == "BatchNorm2d"]
    assert list(model.state_updates) == [f"{n}.running_{s}" for n in bns for s in ("mean", "var")]
    buffers = {src.name for src in model.graph.sources("buffer")}
    assert buffers == set(model.state_updates)
    assert not buffers & {p.name for p in model.params}
    for name, value in model.state_updates.items():
        assert value.shape == model.graph[name].shape and value.dtype == "float32"


def test_totals_equal_the_spec(modern):
    model, spec, rows, _ = modern
    tot = totals(rows, model.graph, model.forward_outputs)
    assert tot.params == spec["params"] == model.param_count
    assert sum(r.flops for r in rows if r.op == "Conv2d") == BATCH * spec["conv_flops_per_image"]
    assert sum(r.flops for r in rows if r.op == "Linear") == BATCH * spec["linear_flops_per_image"]
    assert model.output.shape == (BATCH, *spec["output"])
    assert model.input.shape == (BATCH, *spec["input_chw"])
    assert model.first_conv_input.node == model.input.node
