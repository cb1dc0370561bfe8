"""``Rule.output_view`` of the generated data-movement kernels decides from
types exactly what the kernel decides from arrays (``backends/registry.py``).

The memory pass counts no buffer for a step whose rule says its output is a
view of an input (ConvNeXt's permutes, the reshapes around its Linear layers,
a classifier's Flatten of a C-ordered value). A decision that says "view"
where the kernel copies undercounts the planned peak; one that says "copy"
where the kernel returns a view overcounts it. Each case below runs the
``codegen`` kernel (through the g++ emulator, which the copies need) on an
array stored as its type says and compares whether the result shares memory
with the input against the rule's decision; then the memory plan of a ConvNeXt
block's training step, lowered for cuda with NHWC storage, against the views
its kernels returned."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from codegen_emulated import emu, emulated_cuda_executable, needs_gxx  # noqa: F401  (emu: fixture)
from fused_training_steps import training_step
from opgraph import ops
import opgraph as og
from opgraph.backends.registry import KernelContext, rules_for
from opgraph.executable import run_step
from opgraph.passes.memory import output_views, plan_memory
from opgraph.types import TensorType, to_layout
from test_layout_permute_views import convnext_block, _run_keeping

pytestmark = needs_gxx

LAYOUTS = ("NCHW", "NHWC")
SHAPE = (2, 3, 4, 5)
TRANSPOSES = [(perm, lin, lout) for perm in [(0, 2, 3, 1), (0, 3, 1, 2), (0, 1, 3, 2), (1, 0, 2, 3), (0, 1, 2, 3)]
              for lin in LAYOUTS for lout in LAYOUTS]
#: (input shape, input layout, op, output layout)
RESHAPES = [(SHAPE, lin, ops.Reshape(shape=(2, 60)), None) for lin in LAYOUTS] \
    + [(SHAPE, lin, ops.Reshape(shape=SHAPE), lout) for lin in LAYOUTS for lout in LAYOUTS] \
    + [((2, 60), None, ops.Reshape(shape=SHAPE), lout) for lout in LAYOUTS] \
    + [((2, 3), None, ops.Reshape(shape=(2, 3, 1, 1)), lout) for lout in LAYOUTS] \
    + [((2, 3, 1, 1), lin, ops.Flatten(start_dim=1), None) for lin in LAYOUTS] \
    + [(SHAPE, lin, ops.Flatten(start_dim=1), None) for lin in LAYOUTS] \
    + [((2, 3, 4, 5, 6), None, ops.Flatten(start_dim=3), lout) for lout in LAYOUTS] \
    + [(SHAPE, lin, ops.Flatten(start_dim=3), lout) for lin in LAYOUTS for lout in LAYOUTS]  # review: into NHWC


def _decision_and_result(op, in_type: TensorType, out_layout):
    rng = np.random.default_rng(0)
    x = to_layout(np, rng.standard_normal(in_type.shape).astype(np.float32), in_type.layout)
    out_type = attrs.evolve(op.infer(in_type), layout=out_layout)
    rule = rules_for(type(op))["codegen"]
    y = rule.kernel(KernelContext(np, "cuda", {}, out_type), op, x)
    np.testing.assert_array_equal(y, x.reshape(out_type.shape) if not isinstance(op, ops.Transpose)
                                  else x.transpose(op.perm))
    return rule.output_view(op, (in_type,), out_type), np.shares_memory(y, x)


@pytest.mark.parametrize("perm,lin,lout", TRANSPOSES)
def test_transpose_decision_is_the_kernels(emu, perm, lin, lout):
    decided, shared = _decision_and_result(ops.Transpose(perm=perm), TensorType(SHAPE, "float32", lin), lout)
    assert (decided == 0) == shared and decided in (0, None)


@pytest.mark.parametrize("shape,lin,op,lout", RESHAPES)
def test_reshape_decision_is_the_kernels(emu, shape, lin, op, lout):
    decided, shared = _decision_and_result(op, TensorType(shape, "float32", lin), lout)
    assert (decided == 0) == shared and decided in (0, None)


def test_both_decisions_occur():
    """The cases above include views and copies of each op (a test of one answer could not fail)."""
    seen = set()
    for perm, lin, lout in TRANSPOSES:
        op, t = ops.Transpose(perm=perm), TensorType(SHAPE, "float32", lin)
        seen.add(("T", rules_for(ops.Transpose)["codegen"].output_view(op, (t,), attrs.evolve(op.infer(t), layout=lout))))
    for shape, lin, op, lout in RESHAPES:
        t = TensorType(shape, "float32", lin)
        seen.add(("R", rules_for(type(op))["codegen"].output_view(op, (t,), attrs.evolve(op.infer(t), layout=lout))))
    assert seen == {("T", 0), ("T", None), ("R", 0), ("R", None)}


def test_the_memory_plan_counts_the_views_the_block_step_returns(emu):
    outs, feeds, _ = training_step(convnext_block, np.random.default_rng(0))
    exe = emulated_cuda_executable(outs, {"layout": "NHWC"}, "float32")
    kept, _ = _run_keeping(exe, feeds)
    returned = {n for n, (stored, args) in kept.items() if any(np.shares_memory(stored, a) for a in args)}
    declared = output_views(exe.graph, [st.node for st in exe.steps], exe.graph.inplace_plan)
    assert set(declared) == returned and len(returned) >= 8  # 4 transposes, reshapes around 2 Linear layers
    memory = plan_memory(exe.graph, exe.outputs, "float32", exe.graph.inplace_plan)
    assert memory["output_views"] == len(returned)
    assert memory["output_view_bytes"] == sum(exe.graph.node(n).type.nbytes for n in returned)


def _sliced_and_concatenated():
    """Flattens whose input is a zero-copy slice (strided: the kernel copies) and
    flattens homed in a zero-copy concat (the plan places them already)."""
    g = og.Graph("views")
    x = g.input("x", (2, 8, 4, 4))
    w = g.param("w", (8, 8, 3, 3))
    h = og.relu(og.conv2d(x, w, padding=1, name="c"), name="r")
    sliced = og.flatten(og.narrow(h, 1, 0, 4, name="narrow"), 1, name="flat_slice")
    homed = og.concat([og.flatten(h, 1, name="flat_h"), og.flatten(og.relu(x, name="r2"), 1, name="flat_x")],
                      dim=1, name="cat")
    same = og.flatten(og.relu(h, name="r3"), 3, name="flat_same")  # 4-D to 4-D: stored as the layout says
    # 5-D (C order) to 4-D, stored NHWC under that layout (review: planned as a view, copied by the executor)
    five = og.flatten(og.relu(g.input("x5", (2, 3, 4, 5, 6)), name="r5"), 3, name="flat_five")
    return [sliced, og.relu(homed, name="out"), og.relu(h, name="keep"), og.relu(same, name="out2"),
            og.relu(five, name="out3")]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_no_view_is_counted_where_the_plan_places_or_slices(emu, layout):
    """The executor's own steps (zero-copy slices and concat homes included, and its
    conversion of an output into NHWC storage): a step counted as a view returned one,
    and none the plan places is counted twice."""
    exe = emulated_cuda_executable(_sliced_and_concatenated(), {"layout": layout}, "float32")
    graph, plan = exe.graph, exe.graph.inplace_plan
    assert plan.views and plan.homes  # the cases this test is about
    declared = output_views(graph, [st.node for st in exe.steps], plan)
    rng = np.random.default_rng(2)
    slots = exe.feed({"x": rng.standard_normal((2, 8, 4, 4)).astype(np.float32),
                      "w": rng.standard_normal((8, 8, 3, 3)).astype(np.float32),
                      "x5": rng.standard_normal((2, 3, 4, 5, 6)).astype(np.float32)})
    for st in exe.steps:
        slots[st.node] = run_step(st, slots)
        if st.node in declared:
            assert np.shares_memory(slots[st.node], slots[st.args[declared[st.node]]]), st.name
    assert not declared.keys() & (plan.homes.keys() | plan.views | plan.writes.keys())
    assert "flat_slice" not in {graph.node(n).name for n in declared}


def test_a_step_reading_a_source_is_not_counted_as_a_view(emu):
    """Review: a graph input is fed with the caller's strides (an F-ordered host array stays
    so), so its reshape may copy; the plan counts a buffer for it (the safe side)."""
    g = og.Graph("fed")
    x = g.input("x", (6, 8))
    y = og.relu(og.reshape(x, (48,), name="flat"), name="out")
    exe = emulated_cuda_executable([y], {}, "float32")
    assert output_views(exe.graph, [st.node for st in exe.steps], exe.graph.inplace_plan) == {}
    slots = exe.feed({"x": np.asfortranarray(np.arange(48, dtype=np.float32).reshape(6, 8))})
    flat = next(st for st in exe.steps if st.name == "flat")
    assert not np.shares_memory(run_step(flat, slots), slots[flat.args[0]])  # the premise: it copied
