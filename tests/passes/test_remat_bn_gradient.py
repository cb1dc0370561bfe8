"""The ``bn-gradient-remat`` fusion rule (``passes/remat_bn_gradient.py``):
where it fires (cuda compiled without a GPU, cuDNN's checks stubbed; the CPU's
oracle with the fused chains opted in), what it makes (each backward pass of
a training batch norm with its own copy of the activation gradient, the
activation recomputed from the batch norm's input), where it must not fire
(excluded, no fusion to follow, no pass saved, a gradient read elsewhere or
taken by cuDNN's backward-data), and whole training steps against the float64
reference and the same compile without the rule."""

from __future__ import annotations

import collections

import pytest

import opgraph as og
from opgraph.op import Lowered

from fused_training_steps import rule_on_and_off
from passes_stubs import compile_for_cuda, cudnn_accepts

SUMS, DATA = "BatchNormTrainingBackwardSums", "BatchNormTrainingBackwardDataFromSums"


def conv_bn_act_conv(act, tail=None):
    """conv -> training batch norm -> ``act`` -> conv (-> ``tail``) -> global
    pool: the activation's gradient comes from the second conv's backward-data."""
    g = og.Graph()
    x, w = g.input("x", (2, 3, 8, 8)), g.param("w", (8, 3, 3, 3))
    w2 = g.param("w2", (4, 8, 1, 1))
    gamma, beta = g.param("gamma", (8,)), g.param("beta", (8,))
    h = og.batch_norm(og.conv2d(x, w, padding=1), None, None, gamma, beta, training=True, name="bn")
    h = og.conv2d(act(h), w2)
    if tail is not None:
        h = tail(g, h)
    return og.flatten(og.adaptive_avg_pool2d(h, 1)), [w, w2, gamma, beta], []


def step(make):
    y, params, _ = make()
    return [y, *og.grad(y, params, grad_outputs=[y])]


def fired(notes) -> int:
    found = [n for n in notes if "recomputed in both backward passes fused" in n]
    return int(found[0].split()[1]) if found else 0


def members(graph, outs) -> collections.Counter:
    """Op names of the steps; a fused chain's members as ``<last member>:<member>``."""
    c = collections.Counter()
    for v in graph.nodes_in_order(outs):
        if not isinstance(v.op, Lowered):
            continue
        names = getattr(v.op.op, "members", ())
        c[v.op.op.name] += 1
        for m in names:
            c[f"{names[-1]}:{m}"] += 1
    return c


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_each_backward_pass_gets_the_relu6_gradient_on_cuda(monkeypatch, layout, dtype):
    act, grad = og.relu6, "HardtanhBackward"
    cudnn_accepts(monkeypatch)
    graph, outs, report = compile_for_cuda(step(lambda: conv_bn_act_conv(act)), og.LoweringPolicy(layout=layout),
                                           dtype=dtype)
    count = members(graph, outs)
    assert fired(report.notes) == 1
    assert not count[grad] and not count[SUMS] and not count[DATA], count  # no gradient written
    assert count[f"{SUMS}:{grad}"] == 1 and count[f"{DATA}:{grad}"] == 1
    # each pass recomputes the batch norm's output from its input
    assert count[f"{SUMS}:BatchNormTraining"] == 1 and count[f"{DATA}:BatchNormTraining"] == 1


def test_the_forward_activation_is_no_longer_read_by_the_backward(monkeypatch):
    """ReLU6's gradient read its output ``y``, kept from the forward; after the
    rule the fused forward's output is read by the next convolution only."""
    cudnn_accepts(monkeypatch)
    graph, outs, _ = compile_for_cuda(step(lambda: conv_bn_act_conv(og.relu6)), og.LoweringPolicy())
    forward = [v for v in graph.nodes_in_order(outs) if isinstance(v.op, Lowered)
               and getattr(v.op.op, "members", ()) == ("BatchNormTraining", "Hardtanh")]
    assert len(forward) == 1
    readers = {graph.node(u).op.op.name for u in graph.users(forward[0].id)}
    assert readers <= {"Conv2d", "Conv2dBackwardFilter"}, readers


def test_excluded_by_name_the_gradient_is_written(monkeypatch):
    cudnn_accepts(monkeypatch)
    graph, outs, report = compile_for_cuda(step(lambda: conv_bn_act_conv(og.relu6)),
                                           og.LoweringPolicy(exclude=["bn-gradient-remat"]))
    count = members(graph, outs)
    assert fired(report.notes) == 0 and count["HardtanhBackward"] == 1 and count[SUMS] == 1 and count[DATA] == 1
    assert any("bn-gradient-remat: not applied: excluded by policy" in n for n in report.notes)


def test_no_copy_where_no_fused_chain_would_take_it():
    """On the CPU's oracle without the opt-in nothing is fused, so two copies
    would be passes more: the rule declines, saying why."""
    exe = og.compile(step(lambda: conv_bn_act_conv(og.relu6)), device="cpu")
    assert fired(exe.report.notes) == 0
    assert any("recomputed in both backward passes" in n and "no fused chain would take it" in n
               for n in exe.report.notes), exe.report.notes


def test_a_relu_gradient_before_a_conv_stays_in_cudnns_backward_data(monkeypatch):
    """Before a convolution a ReLU's gradient is fused into cuDNN's backward-data
    (``dgrad-relu``, earlier in the table; measured no slower than this rule's
    form on ResNet-50 and DenseNet-121): no memory-bound node makes gy."""
    cudnn_accepts(monkeypatch)
    graph, outs, report = compile_for_cuda(step(lambda: conv_bn_act_conv(og.relu)))
    count = members(graph, outs)
    assert fired(report.notes) == 0 and count["Conv2dBackwardDataRelu"] == 1 and count[SUMS] == 1


@pytest.mark.parametrize("act", [og.silu, og.hardswish], ids=["silu", "hardswish"])
def test_not_for_activations_whose_gradient_reads_their_input(monkeypatch, act):
    """SiLU's and hardswish's gradients (after ``bn-apply-remat``) stay a chain
    of their own: the wider rule made EfficientNet-B0 slower (module docstring)."""
    cudnn_accepts(monkeypatch)
    graph, outs, report = compile_for_cuda(step(lambda: conv_bn_act_conv(act)))
    assert fired(report.notes) == 0 and members(graph, outs)[SUMS] == 1


@pytest.mark.parametrize("make", [lambda: conv_bn_act_conv(og.relu6),
                                  lambda: conv_bn_act_conv(og.relu6, tail=lambda g, h: og.hardswish(h))],
                         ids=["relu6", "relu6-conv-hardswish"])
def test_training_steps_on_the_oracle_match_the_reference(make):
    """Opted in on the CPU (``include=['fused-reference']``), the rule fires, and
    every output of the step (output, gradients) is within 1e-4 of the float64
    reference and within 1e-5 of the compile without the rule."""
    on, off, errors = rule_on_and_off(make, "bn-gradient-remat")
    assert (fired(on.report.notes), fired(off.report.notes)) == (1, 0)
    bad = [(k, e) for k, e in enumerate(errors) if not (e[0] < 1e-4 and e[2] < 1e-5)]
    assert not bad, bad


def test_the_scope_holds_the_copies_in_topological_order(monkeypatch):
    """The rewrite adds chains of new nodes read by the data gradient and by
    the sums' tree: the scope takes each in (``Scope.rewired`` follows new
    nodes through one another), in an order the later rules can sweep."""
    from opgraph.passes.base import PassContext
    from opgraph.passes.fuse_bn_backward import BN_BACKWARD_SUMS
    from opgraph.passes.pattern import apply_table
    from opgraph.passes.remat_bn_gradient import BN_GRADIENT_REMAT
    cudnn_accepts(monkeypatch)
    unfused = og.LoweringPolicy(exclude=["bn-backward-sums", "bn-gradient-remat", "elementwise"])
    graph, louts, _ = compile_for_cuda(step(lambda: conv_bn_act_conv(og.relu6)), unfused)
    tallies, scope = apply_table([BN_BACKWARD_SUMS, BN_GRADIENT_REMAT], graph, louts, PassContext(device="cuda"))
    assert [len(t.done) for t in tallies.values()] == [1, 1]
    live = graph.ancestors(louts)
    assert scope.nodes == live  # every copy joined the scope, nothing dead is left in it
    position = {n: k for k, n in enumerate(scope.order())}
    assert all(position[u] < position[n] for n in position for u in graph.input_ids(n))
    copies = [graph.node(n).name for n in live if "/remat" in graph.node(n).name]
    assert sorted(copies) == ["bn/remat", "bn/remat_2", "hardtanh.grad/hardtanh_backward/remat", "hardtanh/remat",
                              "hardtanh/remat_2"], copies


def test_a_rule_recomputing_the_wrong_activation_is_caught_end_to_end(monkeypatch):
    """The per-node check holds these chains to their own members on the operands
    they were fed (``benchmarks/check.py``), so it cannot see a wrong member: the
    step against float64 does. ReLU6 recomputed with lower bound 0.5 instead of 0
    (found by a fresh-user review: 0.3-0.9 relative error on the gradients)."""
    import attrs
    from opgraph.passes import remat_bn_gradient as rule

    def wrong(graph, plan, ctx):
        bn, act = graph.node(plan.bn), graph.node(plan.activation)
        z = rule.add_lowered(graph, bn.op, bn.inputs, f"{bn.name}/remat", ctx)
        bad = attrs.evolve(act.op, op=attrs.evolve(act.op.op, min_val=0.5))
        return rule.add_lowered(graph, bad, [z], f"{act.name}/remat", ctx)

    monkeypatch.setattr(rule, "_recomputed", wrong)
    on, _, errors = rule_on_and_off(lambda: conv_bn_act_conv(og.relu6), "bn-gradient-remat")
    assert fired(on.report.notes) == 1 and max(e[0] for e in errors) > 0.05, errors


def test_force_keys_do_not_reach_the_copies(monkeypatch):
    """``force={'bn/*': ...}`` names the user's ``bn/stats``; the rule's copies
    (``bn/remat``, not forceable) still fuse into both passes. Before, the key
    kept them out of every chain: five more kernels than without the rule."""
    cudnn_accepts(monkeypatch)
    graph, outs, report = compile_for_cuda(step(lambda: conv_bn_act_conv(og.relu6)),
                                           og.LoweringPolicy(force={"bn/*": "reference"}))
    count = members(graph, outs)
    assert fired(report.notes) == 1 and not count["BatchNormTraining"] and not count["Hardtanh"], count
    assert count[f"{SUMS}:BatchNormTraining"] == 1 and count[f"{DATA}:BatchNormTraining"] == 1
