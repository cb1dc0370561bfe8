"""The ``bn-stats-parts`` rule (``passes/share_bn_stats.py``): the statistics of
a channel concat become the concat of its parts' statistics, each part's
computed once. Where it fires (a DenseNet block on the CPU and for cuda, cuDNN
stubbed), what the zero-copy plan then makes of it (every layer's statistics a
prefix view of the block's, nothing copied), where it must not fire
(excluded, a concat along another axis, the statistics an output), and the
values of whole training steps against the float64 reference and the same
compile without the rule."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import opgraph as og
from opgraph import ops
from opgraph.buffer_views import AssembleConcat
from opgraph.op import Lowered, abstract_of

from fused_training_steps import step_failures, training_step
from modern_blocks import dense_block
from passes_stubs import compile_for_cuda, cudnn_accepts

NOTE = "batch statistics of a channel concat computed per part fused"


def lowered(graph, outs):
    return [v for v in graph.nodes_in_order(outs) if isinstance(v.op, Lowered)]


def stats_nodes(graph, outs) -> list:
    return [v for v in lowered(graph, outs) if isinstance(v.op.op, ops.BatchNormStats)]


def shared(report) -> int:
    """How many statistics nodes the rule rewrote, from the fuse pass's note."""
    found = [n for n in report.notes if NOTE in n]
    return int(found[0].split()[1]) if found else 0


def compiled(outs, **policy):
    exe = og.compile(outs, policy=og.LoweringPolicy(**policy))
    return exe, exe.graph, exe.outputs


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_a_dense_block_computes_each_feature_maps_statistics_once(layout):
    """The block of ``tests/modern_blocks.py``: three layers read concats of 2, 3
    and the final batch norm 4 feature maps (the input and each layer's
    output). Without the rule 2 + 3 + 4 channel groups are reduced (plus the
    first layer's and each layer's second batch norm); with it, each of the
    4 feature maps once, and no statistics node reads a concat."""
    outs, feeds, _ = training_step(dense_block, np.random.default_rng(0))
    exe, graph, louts = compiled(outs, layout=layout)
    stats = stats_nodes(graph, louts)
    assert not [v for v in stats if isinstance(abstract_of(graph.node(graph.input_ids(v.id)[0]).op), ops.Concat)]
    # the block input, three layer outputs, and the three second batch norms (one input each)
    assert len(stats) == 4 + 3
    assert shared(exe.report) == 3
    off, off_graph, off_outs = compiled(outs, layout=layout, exclude=["bn-stats-parts"])
    assert len(stats_nodes(off_graph, off_outs)) == 3 + 3 + 1 and shared(off.report) == 0
    ref = og.compile(outs, pipeline="reference", dtype="float64")(**feeds)
    assert not step_failures(exe(**feeds), off(**feeds), ref, len(outs), "float32")


def test_every_layers_statistics_are_a_view_of_the_blocks():
    """The zero-copy plan homes every part's statistics in the last concat's
    buffer and each earlier statistics concat there as a prefix: no concat of
    statistics copies anything, and the layers' statistics share its memory."""
    outs, feeds, _ = training_step(dense_block, np.random.default_rng(1))
    exe, graph, louts = compiled(outs)
    concats = [v.id for v in lowered(graph, louts)
               if isinstance(v.op.op, ops.Concat) and v.type.ndim == 2]
    assert len(concats) == 3
    steps = {st.node: st for st in exe.steps}
    assert all(isinstance(steps[c].view, AssembleConcat) and not steps[c].view.copies for c in concats)
    homes = graph.inplace_plan.homes
    roots = set()
    for c in concats:
        n = c
        while n in homes:
            n = homes[n][0]
        roots.add(n)
    assert len(roots) == 1, "the statistics concats do not share one buffer"


@pytest.mark.parametrize("exclude", [["bn-stats-parts"], ["fused"]])
def test_excluded_every_layer_reduces_its_whole_concat(exclude):
    outs, _, _ = training_step(dense_block, np.random.default_rng(0))
    exe, graph, louts = compiled(outs, exclude=exclude)
    readers = [graph.input_ids(v.id)[0] for v in stats_nodes(graph, louts)]
    assert sum(isinstance(abstract_of(graph.node(r).op), ops.Concat) for r in readers) == 3
    assert shared(exe.report) == 0


def _bn_of_concat(axis: int, *, twice: bool = False, stats_out: bool = False):
    """``batch_norm(concat([a, b] (or [a, a]), axis))`` in training form."""
    g = og.Graph()
    a, b = g.input("a", (3, 4, 5, 5)), g.input("b", (3, 2, 5, 5))
    if axis == 0:
        b = g.input("b0", (2, 4, 5, 5))
    h = og.concat([a, a] if twice else [a, b], dim=axis, name="cat")
    stats = g.apply(ops.BatchNormStats, {}, [h], "stats") if stats_out else None
    y = og.batch_norm(h, None, None, None, None, training=True, name="bn")
    return g, [y] + ([stats] if stats_out else [])


def _check_values(g, outs, exe, seed):
    feeds = {s.name: np.random.default_rng(seed).standard_normal(s.type.shape) for s in g.sources()}
    ref = og.compile(outs, pipeline="reference", dtype="float64")(**feeds)
    for got, want in zip(exe(**feeds), ref):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_it_does_not_fire_on_a_concat_along_the_batch_axis():
    """Statistics of a concat along the batch axis mix the parts' values in
    each channel: not a concat of the parts' statistics."""
    g, outs = _bn_of_concat(0)
    exe = og.compile(outs)
    assert shared(exe.report) == 0
    _check_values(g, outs, exe, 2)


def test_statistics_that_are_an_output_stay_the_node_asked_for():
    """The batch norm's own statistics are shared; the statistics node the
    caller asked for (an output) still reduces the concat itself."""
    g, outs = _bn_of_concat(1, stats_out=True)
    exe = og.compile(outs)
    assert shared(exe.report) == 1
    asked = exe.graph.node(exe.outputs[1].node)
    assert isinstance(asked.op.op, ops.BatchNormStats) and asked.name == "stats"
    assert isinstance(abstract_of(exe.graph.node(exe.graph.input_ids(asked.id)[0]).op), ops.Concat)
    _check_values(g, outs, exe, 2)


def test_a_value_concatenated_twice_gets_one_statistics_node():
    g, outs = _bn_of_concat(1, twice=True)
    exe = og.compile(outs)
    assert shared(exe.report) == 1
    stats = stats_nodes(exe.graph, exe.outputs)
    assert [exe.graph.node(exe.graph.input_ids(v.id)[0]).name for v in stats] == ["a"]
    feeds = {"a": np.random.default_rng(3).standard_normal((3, 4, 5, 5))}
    want = og.compile(outs, pipeline="reference", dtype="float64")(**feeds)[0]
    np.testing.assert_allclose(exe(**feeds)[0], want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_it_fires_for_cuda_with_the_generated_kernels(monkeypatch, layout, dtype):
    """Compiled for cuda (no GPU: the passes ask the rules; cuDNN stubbed):
    the parts' statistics and the concats run ``codegen``, whose kernels read
    the statistics views at their row pitch (``tests/backends/test_codegen_views.py``)."""
    cudnn_accepts(monkeypatch)
    outs, _, _ = training_step(dense_block, np.random.default_rng(0))
    graph, louts, report = compile_for_cuda(outs, og.LoweringPolicy(layout=layout), dtype=dtype)
    assert shared(report) == 3
    stats = stats_nodes(graph, louts)
    assert len(stats) == 7 and {v.op.algorithm for v in stats} == {"codegen"}
    kinds = collections.Counter(graph.node(graph.input_ids(v.id)[0]).op.op.name for v in stats
                                if isinstance(graph.node(graph.input_ids(v.id)[0]).op, Lowered))
    assert not kinds["Concat"]
    # each part's statistics are written straight into the block's statistics buffer
    plan = graph.inplace_plan
    parts = [v.id for v in stats if v.id in plan.homes]
    assert len(parts) == 4 and not set(parts) & plan.copied_in


def test_a_forced_statistics_node_keeps_its_own_kernel():
    """``force`` names a node's kernel: the rule leaves that node as it is and
    says why; the other layers' statistics are still shared."""
    outs, feeds, _ = training_step(dense_block, np.random.default_rng(4))
    exe, graph, louts = compiled(outs, force={"l2.bn1/stats": "reference"})
    assert shared(exe.report) == 2
    assert any("l2.bn1/stats is forced to reference" in n for n in exe.report.notes), exe.report.notes
    (kept,) = [v for v in stats_nodes(graph, louts) if v.name == "l2.bn1/stats"]
    assert isinstance(abstract_of(graph.node(graph.input_ids(kept.id)[0]).op), ops.Concat)


def test_a_users_node_holding_the_new_nodes_name_is_left_alone():
    """The rule names a part's statistics ``<part>/batch-stats``; a node of the
    user's with that name keeps it and the new node takes ``..._2``."""
    g = og.Graph()
    a, b = g.input("a", (2, 3, 4, 4)), g.input("b", (2, 2, 4, 4))
    z = og.relu(a, name="a/batch-stats")
    y = og.batch_norm(og.concat([a, b], dim=1), None, None, None, None, training=True, name="bn")
    s = og.add(y, og.concat([z, b], dim=1))
    exe = og.compile([s])
    assert shared(exe.report) == 1
    names = {v.name for v in stats_nodes(exe.graph, exe.outputs)}
    assert names == {"a/batch-stats_2", "b/batch-stats"}
    _check_values(g, [s], exe, 5)
