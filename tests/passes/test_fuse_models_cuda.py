"""The fusion table on every built-in model compiled for cuda without a GPU
(cuDNN's checks stubbed to accept, ``passes_stubs.cudnn_accepts``): nothing
lowers to the reference, every fused node runs cuDNN or a generated kernel,
each node the table removed is listed under the node that absorbed it, the
table is at its fixed point, and the counts follow from the model's structure."""

from __future__ import annotations

import collections
import re

import pytest

import opgraph as og
from opgraph.benchmarks.models import MODELS, build
from opgraph.op import Lowered
from opgraph.passes.fuse import TABLE
from opgraph.passes.pattern import Scope
from opgraph.passes.base import PassContext

from passes_stubs import compile_for_cuda, cudnn_accepts

FORBIDDEN = {"reference", "direct"}


def training_step(key):
    m = build(key, batch=2)
    return m, [m.output, *og.grad(m.output, m.params, grad_outputs=[m.output])]


def lowered(graph, outs):
    return [v for v in graph.nodes_in_order(outs) if isinstance(v.op, Lowered)]


@pytest.mark.parametrize("key", list(MODELS))
def test_fusion_on_cuda_of_every_built_in_model(monkeypatch, key):
    cudnn_accepts(monkeypatch)
    m, outs = training_step(key)
    policy = og.LoweringPolicy(layout="NHWC")
    graph, louts, report = compile_for_cuda(outs, policy)
    nodes = lowered(graph, louts)
    assert not [v.name for v in nodes if v.op.algorithm in FORBIDDEN]
    fused = [v for v in nodes if v.op.op.fused]
    assert {v.op.algorithm for v in fused if v.op.op.name == "FusedElementwise"} <= {"codegen"}
    assert {v.op.algorithm for v in fused if v.op.family == "conv"} <= {"cudnn"}
    # every node the table removed is listed under the node that absorbed it
    off_graph, off_outs, off_report = compile_for_cuda(outs, og.LoweringPolicy(layout="NHWC", exclude=["fused"]))
    absorbed = sum(len(report.node(v.name).absorbed) for v in fused)
    # bn-backward-sums adds a sums node (a fused chain may end in it: bn-gradient-remat)
    added = sum(v.name.endswith("/sums") for v in fused)
    # bn-apply-remat adds a batch-norm copy per activation gradient, bn-gradient-remat copies of the
    # gradient's making (<node>/remat, <node>/remat_2), each absorbed into its fused chain
    added += sum(re.search(r"/remat(_\d+)?$", name) is not None for v in fused for name in report.node(v.name).absorbed)
    added += sum(v.name.endswith("/batch-stats") for v in nodes)  # bn-stats-parts: a part's statistics
    added += sum(v.name.endswith("/argmax") for v in nodes)  # pool-argmax: a pooling's saved winners
    assert len(off_report.nodes) - len(report.nodes) == absorbed - added
    assert not any(v.op.op.fused for v in lowered(off_graph, off_outs))
    # the report says which rules rewrote how many matches
    assert list(report.fusion) == [r.name for r in TABLE]
    assert not any(v.get("applied") for v in off_report.fusion.values())
    fused_kinds = collections.Counter(v.op.op.name for v in fused)
    assert report.fusion["dgrad-relu"]["applied"] == fused_kinds["Conv2dBackwardDataRelu"]
    # pool-argmax then turns a MaxPool2dBackwardRelu into a masked gather
    masked = sum(v.op.op.name == "MaxPool2dBackwardIndices" and v.op.op.masked for v in nodes)
    assert report.fusion["pool-relu-backward"]["applied"] == fused_kinds["MaxPool2dBackwardRelu"] + masked
    # pool-scan then makes each argmax + take one scan filling a slot
    assert report.fusion["pool-argmax"]["applied"] == fused_kinds["MaxPool2dBackwardIndices"] \
        == fused_kinds["MaxPool2dTake"] + fused_kinds["MaxPool2dScan"] \
        == fused_kinds["MaxPool2dArgmax"] + fused_kinds["MaxPool2dArgmaxSlot"]
    assert report.fusion["pool-scan"]["applied"] == fused_kinds["MaxPool2dScan"] == fused_kinds["MaxPool2dArgmaxSlot"]
    assert report.fusion["relu-bias-sums"]["applied"] == fused_kinds["ReluBackwardSums"] \
        == fused_kinds["ReluBackwardSumsSlot"]
    # each chain or n-ary sum is one FusedElementwise, unless a later chain took an n-ary sum in
    chains = report.fusion["elementwise"]["applied"] + report.fusion["gradient-sum"]["applied"]
    assert (chains > 0) == (fused_kinds["FusedElementwise"] > 0) and fused_kinds["FusedElementwise"] <= chains
    # the fixed point: no rule matches the result any more (a declined match would be noted)
    scope = Scope(graph, louts, PassContext(device="cuda", policy=policy))
    for rule in TABLE:
        left = [v.name for v in graph.nodes_in_order(louts) if rule.match(scope, v) is not None]
        assert not left or any("not fused: " in n for n in report.notes), (rule.name, left[:5])
    # counts that follow from the structure of the abstract graph
    g = m.graph
    abstract = [g.node(n) for n in g.ancestors(outs)]
    kinds = collections.Counter(v.op.op.name for v in fused)
    members = collections.Counter(s for v in fused if v.op.op.name == "FusedElementwise" for s in v.op.op.members)
    # a ReLU after a training batch norm joins it (its gradient reads the ReLU's output, so the
    # normalised value is private; SiLU's and ReLU6's gradients read it: those stay apart)
    relus = [v for v in abstract if v.op.name == "Relu" and g.node(g.input_ids(v.id)[0]).op.name == "BatchNormTraining"]
    assert members["BatchNormTraining"] >= len(relus)
    adds = sum(v.op.name == "Add" for v in abstract)
    left_adds = sum(v.op.op.name == "Add" for v in nodes)
    # the data gradient's pass holds copies (bn-gradient-remat); the originals are in the sums' pass
    copies = collections.Counter(s for v in fused if v.op.op.name == "FusedElementwise"
                                 and v.op.op.members[-1] == "BatchNormTrainingBackwardDataFromSums"
                                 for s in v.op.op.members)
    assert left_adds + members["Add"] - copies["Add"] == adds  # each Add is a step or a member, never lost
    if key in ("googlenet", "densenet121"):  # inception / dense-block fan-outs: n-ary sums
        assert any("n-ary sum(s) of Add nodes fused" in n and not n.startswith("fuse: 0") for n in report.notes)
        assert left_adds < adds / 4
    if key in ("alexnet", "overfeat", "vgg_a", "googlenet"):  # conv + bias + ReLU everywhere
        convs = sum(v.op.name == "Conv2d" for v in abstract)
        assert kinds["Conv2dBiasRelu"] == convs
    # every max pooling with its gradient saves its winners, and by default (pool-scan,
    # passes/fuse_pool_scan.py) its argmax + take is one scan filling a slot; none scans x in
    # its gradient any more
    pools = sum(v.op.name == "MaxPool2d" for v in abstract)
    assert kinds["MaxPool2dScan"] == kinds["MaxPool2dArgmaxSlot"] == report.fusion["pool-scan"]["applied"] == pools
    assert not (kinds["MaxPool2dTake"] or kinds["MaxPool2dArgmax"])
    # by default (relu-bias-sums, passes/fuse_relu_bias_sums.py) each bias gradient of a ReLU
    # gradient left out of the chains is written by it
    sums = report.fusion["relu-bias-sums"]["applied"]
    assert not [v.name for v in nodes if v.op.op.name == "BiasAddBackward"
                and v.inputs[0].op.op.name == "ReluBackward"]
    if key in ("alexnet", "overfeat", "vgg_a"):  # the classifier's Threshold(0, 1e-6) gradients, 2-D
        assert not kinds["ThresholdBackward"]
        assert sum(v.op.op.name == "ReluBackwardSums" and v.inputs[0].type.ndim == 2 for v in nodes) == 2
    if key == "googlenet":  # the inception branches' ReLU gradients read slices of the concat's gradient
        assert (pools, sums) == (13, 37)
    if key == "alexnet":
        assert pools == 3
    assert not [v.name for v in nodes if v.op.op.name in ("MaxPool2dBackward", "MaxPool2dBackwardRelu")]
    # exclude=['fused'] turns both off with the others (no pooling saves winners at all)
    off_kinds = collections.Counter(v.op.op.name for v in lowered(off_graph, off_outs))
    assert not (off_kinds["MaxPool2dScan"] or off_kinds["MaxPool2dArgmaxSlot"] or off_kinds["MaxPool2dTake"]
                or off_kinds["ReluBackwardSums"] or off_kinds["ReluBackwardSumsSlot"])
    # excluded by name: each argmax + take stays a pair, each bias gradient a node of its own,
    # and the other rules do what they did
    both = og.LoweringPolicy(layout="NHWC", exclude=["pool-scan", "relu-bias-sums"])
    graph, outs_ex, report_ex = compile_for_cuda(outs, both)
    ex = collections.Counter(v.op.op.name for v in lowered(graph, outs_ex))
    assert report_ex.fusion["pool-scan"] == report_ex.fusion["relu-bias-sums"] == {"excluded": True}
    assert ex["MaxPool2dTake"] == ex["MaxPool2dArgmax"] == pools and not (ex["MaxPool2dScan"] or ex["MaxPool2dArgmaxSlot"])
    assert not (ex["ReluBackwardSums"] or ex["ReluBackwardSumsSlot"])
    assert ex["BiasAddBackward"] == sum(v.op.op.name == "BiasAddBackward" for v in nodes) + sums
    assert {k: v for k, v in report_ex.fusion.items() if k not in ("pool-scan", "relu-bias-sums")} \
        == {k: v for k, v in report.fusion.items() if k not in ("pool-scan", "relu-bias-sums")}


@pytest.mark.parametrize("key, pools, sums", [("googlenet", 13, 37), ("alexnet", 3, None)])
def test_each_default_slot_rule_turns_off_alone_by_name(monkeypatch, key, pools, sums):
    """``pool-scan`` and ``relu-bias-sums`` run by default (their kernels ran on the H200,
    2026-12-05); ``exclude=[name]`` turns that rule off and leaves the other applied."""
    cudnn_accepts(monkeypatch)
    _, outs = training_step(key)

    def compiled(**policy):
        graph, louts, report = compile_for_cuda(outs, og.LoweringPolicy(layout="NHWC", **policy))
        return collections.Counter(v.op.op.name for v in lowered(graph, louts)), report

    kinds, report = compiled()
    assert report.fusion["pool-scan"] == {"applied": pools, "declined": 0} and kinds["MaxPool2dScan"] == pools
    if sums is not None:
        assert report.fusion["relu-bias-sums"]["applied"] == kinds["ReluBackwardSums"] == sums
    default_sums = report.fusion["relu-bias-sums"]["applied"]
    kinds, report = compiled(exclude=["pool-scan"])
    assert report.fusion["pool-scan"] == {"excluded": True}
    assert not kinds["MaxPool2dScan"] and kinds["MaxPool2dTake"] == kinds["MaxPool2dArgmax"] == pools
    assert report.fusion["relu-bias-sums"]["applied"] == kinds["ReluBackwardSums"] == default_sums
    kinds, report = compiled(exclude=["relu-bias-sums"])
    assert report.fusion["relu-bias-sums"] == {"excluded": True} and not kinds["ReluBackwardSums"]
    assert report.fusion["pool-scan"]["applied"] == kinds["MaxPool2dScan"] == pools
    assert report.fusion_summary().endswith("; excluded: relu-bias-sums")


def test_the_report_names_a_rule_the_policy_excluded(monkeypatch):
    cudnn_accepts(monkeypatch)
    _, outs = training_step("alexnet")
    _, _, report = compile_for_cuda(outs, og.LoweringPolicy(layout="NHWC", exclude=["conv-epilogue"]))
    assert report.fusion["conv-epilogue"] == {"excluded": True}
    assert report.fusion["pool-relu-backward"]["applied"] > 0
    said = report.fusion_summary()
    assert "conv-epilogue" not in said.split(";")[0] and said.endswith("; excluded: conv-epilogue")
    assert f"pool-relu-backward {report.fusion['pool-relu-backward']['applied']}" in said
    assert f"fusion rules: {said}" in report.format()


def test_exclude_fused_reports_every_rule_excluded(monkeypatch):
    cudnn_accepts(monkeypatch)
    _, outs = training_step("alexnet")
    _, _, report = compile_for_cuda(outs, og.LoweringPolicy(layout="NHWC", exclude=["fused"]))
    assert report.fusion == {r.name: {"excluded": True} for r in TABLE}
    assert report.fusion_summary() == "excluded: " + ", ".join(r.name for r in TABLE)
