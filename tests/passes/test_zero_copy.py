"""The zero-copy plan (passes/zero_copy.py, opgraph/buffer_views.py): concat
producers write into their slice of the concat's buffer, concats that are
prefixes of a larger one and the concat gradient's slices are views.

Each graph is checked in float64 against the reference pipeline (which keeps
every copy), and the views are checked to be real: the concat step copies
nothing (``AssembleConcat.copies``), the producer's array shares memory with
the concat's, the memory plan's peak drops."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

import opgraph as og
from opgraph import ops
from opgraph.backends import registry
from opgraph.buffer_views import AssembleConcat, SliceView, WriteInto
from opgraph.executable import run_step
from opgraph.passes.memory import _rule, plan_inplace, plan_memory
from opgraph.passes.zero_copy import plan_views


def _conv_relu(g, h, cout, k, name, bias=True):
    w = g.param(f"{name}.w", (cout, h.shape[1], k, k))
    b = g.param(f"{name}.b", (cout,)) if bias else None
    return og.relu(og.conv2d(h, w, b, padding=k // 2), name=f"{name}.relu")


def inception():
    """An inception module (GoogLeNet's four branches, the pool branch
    through a 1x1 conv) followed by a second conv reading the concat."""
    g = og.Graph("inception")
    x = g.input("x", (2, 8, 6, 6))
    y1 = _conv_relu(g, x, 4, 1, "b1")
    y2 = _conv_relu(g, _conv_relu(g, x, 3, 1, "b2r"), 5, 3, "b2")
    y3 = _conv_relu(g, _conv_relu(g, x, 2, 1, "b3r"), 3, 5, "b3")
    y4 = _conv_relu(g, og.max_pool2d(x, 3, 1, 1), 3, 1, "b4")
    cat = og.concat([y1, y2, y3, y4], 1, name="inception")
    out = _conv_relu(g, cat, 4, 3, "next")
    return g, out, cat


def dense_block(layers=3):
    """A DenseNet block after a max pool: each layer reads the concatenation
    of the block input and every earlier layer's output (as
    ``benchmarks/models/densenet.py``), the block's output concatenates all."""
    g = og.Graph("dense")
    x = g.input("x", (2, 4, 8, 8))
    features = [og.max_pool2d(x, 3, 2, 1, name="pool0")]
    for i in range(1, layers + 1):
        h = features[0] if len(features) == 1 else og.concat(features, 1, name=f"layer{i}/cat")
        h = _conv_relu(g, h, 6, 1, f"layer{i}.conv1", bias=False)
        features.append(og.conv2d(h, g.param(f"layer{i}.conv2.w", (3, 6, 3, 3)), padding=1,
                                  name=f"layer{i}.conv2"))
    cat = og.concat(features, 1, name="block/cat")
    return g, og.relu(cat), cat


def _feeds(g, rng):
    return {s.name: rng.standard_normal(s.type.shape) for s in g.sources() if s.op.role in ("input", "param")}


def _training(build):
    """The graph, its output, its concat and the outputs of a training step
    (the output and the gradients of every input and parameter)."""
    g, out, cat = build()
    wrt = [g.value(s.id) for s in g.sources() if s.op.role in ("input", "param")]
    return g, out, cat, [out, *og.grad(out, wrt)]


def _assert_matches_the_reference(g, out, outputs, exe, seed):
    """``exe``'s outputs on random feeds equal the reference pipeline's (which keeps every copy)."""
    rng = np.random.default_rng(seed)
    feeds, gy = _feeds(g, rng), rng.standard_normal(out.shape)
    ref = og.compile(outputs, device="cpu", dtype="float64", pipeline="reference")
    for got, want in zip(exe(grad_outputs={out: gy}, **feeds), ref(grad_outputs={out: gy}, **feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def _all_slots(exe, feeds, gy, out):
    """Every value of one run (nothing freed), by node id."""
    slots = exe.feed(feeds, {out: gy})
    for st in exe.steps:
        slots[st.node] = run_step(st, slots)
    return slots


@pytest.mark.parametrize("build", [inception, dense_block], ids=["inception", "dense_block"])
def test_forward_and_gradients_equal_the_reference_pipeline(build):
    g, out, cat, outputs = _training(build)
    rng = np.random.default_rng(0)
    feeds, gy = _feeds(g, rng), rng.standard_normal(out.shape)
    exe = og.compile(outputs, device="cpu", dtype="float64")
    ref = og.compile(outputs, device="cpu", dtype="float64", pipeline="reference")
    assert any(st.view is not None for st in exe.steps) and not any(st.view for st in ref.steps)
    for got, want in zip(exe(grad_outputs={out: gy}, **feeds), ref(grad_outputs={out: gy}, **feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_inception_producers_write_into_the_concat_and_its_gradient_is_sliced_in_place():
    g, out, cat, outputs = _training(inception)
    exe = og.compile(outputs, device="cpu", dtype="float64")
    steps = {st.node: st for st in exe.steps}
    concat = next(st for st in exe.steps if st.name == "inception")
    assert isinstance(concat.view, AssembleConcat) and concat.view.copies == ()  # moves no byte
    producers = exe.graph.input_ids(concat.node)
    assert all(isinstance(steps[p].view, WriteInto) for p in producers)
    slices = [st for st in exe.steps if isinstance(st.op.op, ops.Slice)]
    assert len(slices) == 4 and all(isinstance(st.view, SliceView) for st in slices)
    assert "zero-copy: every input written in place" in exe.report()
    assert exe.report.memory["zero_copy"] == 4 + 4  # four producers, four slices
    rng = np.random.default_rng(1)
    slots = _all_slots(exe, _feeds(g, rng), rng.standard_normal(out.shape), out)
    for p in producers:
        assert np.shares_memory(slots[p], slots[concat.node])
    gcat = exe.graph.input_ids(slices[0].node)[0]
    assert all(np.shares_memory(slots[s.node], slots[gcat]) for s in slices)


def test_dense_block_layer_concats_are_prefixes_of_the_block_buffer_and_the_pool_is_copied_in():
    g, out, cat, outputs = _training(dense_block)
    exe = og.compile(outputs, device="cpu", dtype="float64")
    by_name = {st.name: st for st in exe.steps}
    block = by_name["block/cat"]
    assert block.view.copies == ()
    # the max pool's reference kernel cannot write a strided view: its step copies its result in
    pool = by_name["pool0"]
    assert pool.view.copy and "copied into its slice of block/cat" in exe.report()
    assert not any(by_name[f"layer{i}.conv2"].view.copy for i in (1, 2, 3))
    for i in (2, 3):  # each layer's concatenation is a slice of the block's buffer, copying nothing
        layer = by_name[f"layer{i}/cat"]
        assert layer.view.region.root == block.node and layer.view.copies == ()
    rng = np.random.default_rng(2)
    slots = _all_slots(exe, _feeds(g, rng), rng.standard_normal(out.shape), out)
    for name in ("layer2/cat", "layer3/cat", "pool0", "layer1.conv2", "layer3.conv2"):
        assert np.shares_memory(slots[by_name[name].node], slots[block.node])


@pytest.mark.parametrize("build", [inception, dense_block], ids=["inception", "dense_block"])
def test_the_memory_plan_counts_the_concat_buffer_once(build):
    g, out, cat, outputs = _training(build)
    exe = og.compile(outputs, device="cpu", dtype="float64")
    lowered, outs = exe.graph, exe.outputs
    with_views = plan_memory(lowered, outs, "float64", plan_inplace(lowered, outs, zero_copy=True))
    copies = plan_memory(lowered, outs, "float64", plan_inplace(lowered, outs))
    assert with_views["planned_peak_bytes"] < copies["planned_peak_bytes"]
    assert with_views["zero_copy_bytes"] > 0 == copies["zero_copy_bytes"]
    assert with_views["no_reuse_bytes"] == copies["no_reuse_bytes"]
    assert exe.report.memory["planned_peak_bytes"] == with_views["planned_peak_bytes"]


def test_a_reader_that_needs_dense_inputs_keeps_the_copies(monkeypatch):
    """A rule declaring ``contiguous_inputs`` never gets a view: the producers
    it reads are not written into the concat, the slices it reads stay copies;
    the numbers still match the reference."""
    g, out, cat, outputs = _training(inception)
    relu_backward = registry.lookup(ops.ReluBackward, "reference")
    monkeypatch.setitem(registry._RULES[ops.ReluBackward], "reference",
                        attrs.evolve(relu_backward, contiguous_inputs=True))
    exe = og.compile(outputs, device="cpu", dtype="float64")
    slices = [st for st in exe.steps if isinstance(st.op.op, ops.Slice)]
    assert slices and all(st.view is None for st in slices)
    rules = {n: _rule(exe.graph.node(n).op) for n in exe.graph.topological(exe.graph.ancestors(exe.outputs))}
    homes, views, _ = plan_views(exe.graph, exe.outputs, rules)
    assert not views
    _assert_matches_the_reference(g, out, outputs, exe, seed=3)


def test_a_requested_output_is_never_a_view():
    g, out, cat, outputs = _training(inception)
    producer = g.input_ids(cat.node)[0]
    exe = og.compile([*outputs, g.value(producer)], device="cpu", dtype="float64")
    steps = {st.node: st for st in exe.steps}
    assert steps[exe.outputs[-1].node].view is None
    concat = next(st for st in exe.steps if st.name == "inception")
    assert [c[0] for c in concat.view.copies] == [0]  # that input alone is copied


def test_a_slice_concatenated_again_is_copied_into_the_concat_not_a_view():
    """ShuffleNet's unit: one half of a split is concatenated with the other
    half's branch; that slice's step copies it into the concat's buffer."""
    g = og.Graph("shuffle")
    x = g.input("x", (2, 8, 5, 5))
    keep = og.narrow(x, 1, 0, 4)
    branch = _conv_relu(g, og.relu(x), 4, 3, "branch")
    out = og.relu(og.concat([keep, branch], 1, name="cat"))
    outputs = [out, *og.grad(out, [x, g["branch.w"], g["branch.b"]])]
    exe = og.compile(outputs, device="cpu", dtype="float64")
    ref = og.compile(outputs, device="cpu", dtype="float64", pipeline="reference")
    sliced = next(st for st in exe.steps if isinstance(st.op.op, ops.Slice) and st.args[0] == x.node)
    assert isinstance(sliced.view, WriteInto) and sliced.view.copy
    rng = np.random.default_rng(4)
    feeds, gy = _feeds(g, rng), rng.standard_normal(out.shape)
    for got, want in zip(exe(grad_outputs={out: gy}, **feeds), ref(grad_outputs={out: gy}, **feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("declared", [{"NHWC"}, {"NCHW", "NHWC"}])
def test_a_producer_writes_strided_only_in_the_layouts_its_rule_declares(monkeypatch, declared):
    """``writes_strided_out=frozenset({'NHWC'})`` (cuDNN's forward: its fp32
    NCHW channel slices ran 2.6x slower on the H200): a producer whose NCHW
    output (the CPU's layout) is not among the declared layouts has its
    result copied into its slice (``WriteInto.copy``), one declared writes
    there; the concat moves nothing either way and the numbers match the
    reference."""
    g, out, cat, outputs = _training(inception)
    first = og.compile(outputs, device="cpu", dtype="float64")
    concat = next(st for st in first.steps if st.name == "inception")
    producers = first.graph.input_ids(concat.node)
    assert {first.graph.node(p).type.layout for p in producers} == {"NCHW"}
    for rule in {_rule(first.graph.node(p).op) for p in producers}:
        assert rule.writes_strided_out is True  # what the test narrows
        monkeypatch.setitem(registry._RULES[rule.op_type], rule.algorithm,
                            attrs.evolve(rule, writes_strided_out=frozenset(declared)))
    exe = og.compile(outputs, device="cpu", dtype="float64")
    steps = {st.name: st for st in exe.steps}
    assert steps["inception"].view.copies == ()
    views = [steps[exe.graph.node(p).name].view for p in exe.graph.input_ids(steps["inception"].node)]
    assert all(isinstance(v, WriteInto) and v.copy == ("NCHW" not in declared) for v in views)
    _assert_matches_the_reference(g, out, outputs, exe, seed=4)


def test_writes_strided_reads_the_declared_layouts():
    rule = registry.Rule(ops.Relu, "x", lambda ctx, op, a: a)
    assert not rule.writes_strided("NHWC")
    assert attrs.evolve(rule, writes_strided_out=True).writes_strided("NCHW")
    nhwc = attrs.evolve(rule, writes_strided_out=["NHWC"])
    assert nhwc.writes_strided_out == frozenset({"NHWC"})
    assert nhwc.writes_strided("NHWC") and not nhwc.writes_strided("NCHW") and not nhwc.writes_strided(None)


@pytest.mark.parametrize("bad", ["NHWC", {"nhwc"}, set(), None, 1])
def test_a_bad_writes_strided_out_names_the_value(bad):
    with pytest.raises(ValueError, match=r"writes_strided_out=.*must be a bool or .*set of layouts"):
        registry.Rule(ops.Relu, "x", lambda ctx, op, a: a, writes_strided_out=bad)
