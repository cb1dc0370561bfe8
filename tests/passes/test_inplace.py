"""In-place steps: planned by the memory pass, run by the executor.

The memory pass (``passes/memory.py``) lets an element-wise step (ReLU,
ReLU-backward, a gradient sum ``Add``...) write its output into an input that
dies at that step; it records the plan on the lowered graph and the executor
copies it into its steps (``Step.inplace``). Each test below compares the
values with the same executable run out of place (``inplace=None`` on every
step), exactly: an in-place kernel computes the same numbers into another
array.
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest

import opgraph as og
from opgraph import ops
from opgraph.backends.registry import Rule
from opgraph.errors import ExecutionError
from opgraph.executable import Executable, InplacePlan, run_step
from opgraph.passes.base import FunctionPass, Pipeline
from opgraph.passes.lower import LowerPass
from opgraph.passes.memory import MemoryPass, plan_inplace, plan_memory
from opgraph.passes.pipelines import REFERENCE_POLICY
from opgraph.passes.verify import VerifyPass
from opgraph.types import is_channels_last

from passes_stubs import install_rule

F32 = 4  # bytes


def feeds_for(exe, seed=0):
    rng = np.random.default_rng(seed)
    return {s.name: rng.standard_normal(s.type.shape).astype(np.float32) for s in exe.sources
            if s.op.role != "grad"}


def out_of_place(exe):
    """The same executable with every step allocating its output."""
    copy = Executable.__new__(Executable)
    copy.__dict__.update(exe.__dict__)
    copy.steps = [attrs.evolve(st, inplace=None) for st in exe.steps]
    return copy


def in_place_steps(exe) -> dict[str, int]:
    """Step name -> node id of the input it overwrites."""
    return {st.name: st.writes_into for st in exe.steps if st.writes_into is not None}


def assert_same_results(exe, feeds, grad_outputs=None):
    got = exe(grad_outputs=grad_outputs, **feeds)
    want = out_of_place(exe)(grad_outputs=grad_outputs, **feeds)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    return got


def small_net(branch=False):
    """x -> conv1 (+b) -> relu1 -> pool1 -> conv2 -> relu2 -> flat -> fc, the
    fc output passed back as its own gradient (the benchmark protocol). With
    ``branch`` relu2's output is also read by a 1x1 convolution added to
    conv2's path (so its gradient is a sum of two)."""
    g = og.Graph()
    x = g.input("x", (2, 3, 8, 8))
    w1, b1 = g.param("w1", (4, 3, 3, 3)), g.param("b1", (4,))
    w2, w3 = g.param("w2", (8, 4, 3, 3)), g.param("w3", (10, 128))
    r1 = og.relu(og.conv2d(x, w1, b1, padding=1, name="conv1"), name="relu1")
    p1 = og.max_pool2d(r1, 2, name="pool1")
    r2 = og.relu(og.conv2d(p1, w2, padding=1, name="conv2"), name="relu2")
    params = [w1, b1, w2, w3]
    if branch:
        w4 = g.param("w4", (8, 8, 1, 1))
        params.append(w4)
        r2 = og.add(r2, og.conv2d(r2, w4, name="side"), name="join")
    y = og.linear(og.flatten(r2, name="flat"), w3, name="fc")
    grads = og.grad(y, params, grad_outputs=[y])
    return g, y, grads


# ------------------------------------------------------------------ the executor writes in place

def test_training_graph_runs_relu_and_its_gradient_in_place_with_the_same_results():
    _, y, grads = small_net()
    exe = og.compile([y, *grads], pipeline="reference")
    ids = {st.name: st.node for st in exe.steps}
    assert in_place_steps(exe) == {
        "relu1": ids["conv1"], "relu2": ids["conv2"],
        # into the output gradient each reads (the pooling / reshape gradient)
        "relu2.grad/relu_backward": ids["flat.grad/reshape"],
        "relu1.grad/relu_backward": ids["pool1.grad/max_pool2d_backward"]}
    assert exe.report.memory["inplace"] == 4
    assert_same_results(exe, feeds_for(exe))


def test_the_output_array_is_the_input_array():
    _, y, grads = small_net()
    exe = og.compile([y, *grads], pipeline="reference")
    slots = exe.feed(feeds_for(exe))
    seen = 0
    for st in exe.steps:
        target = st.writes_into
        before = slots[target] if target is not None else None
        kept = before.copy() if before is not None else None
        slots[st.node] = out = run_step(st, slots)
        if target is not None:
            seen += 1
            assert out is before and np.shares_memory(out, before)
            # the same step out of place leaves its input alone and gives the same values
            slots[target] = kept
            fresh = run_step(attrs.evolve(st, inplace=None), slots)
            assert not np.shares_memory(fresh, kept)
            np.testing.assert_array_equal(fresh, out)
            slots[target] = out
        for f in st.free:
            slots.pop(f, None)
    assert seen == 4


def test_a_step_that_frees_nothing_writes_nothing_in_place():
    # the benchmark's phase loops keep every value (free=()) to re-run phases
    _, y, grads = small_net()
    exe = og.compile([y, *grads], pipeline="reference")
    keep_all = [attrs.evolve(st, free=()) for st in exe.steps]
    assert any(st.inplace is not None for st in keep_all)
    assert all(st.writes_into is None for st in keep_all)
    slots = exe.feed(feeds_for(exe))
    for st in keep_all:
        slots[st.node] = run_step(st, slots)
    for st in keep_all:
        for a in st.args:
            assert not np.shares_memory(slots[st.node], slots[a])


def test_a_gradient_sum_accumulates_in_place():
    _, y, grads = small_net(branch=True)
    exe = og.compile([y, *grads], pipeline="reference")
    steps = {st.name: st for st in exe.steps}
    adds = [st for st in exe.steps if st.op.op.name == "Add"]
    sums = [st for st in adds if st.name != "join"]
    assert [st.name for st in sums] == ["relu2.grad/add"]  # relu2's gradient: two partial sums
    # into the first addend (the reshaped fc gradient), dead there
    assert steps["relu2.grad/add"].writes_into == steps["flat.grad/reshape"].node
    # the forward join: not into relu2 (read later by the gradients), into the side branch
    assert steps["join"].writes_into == steps["side"].node
    assert exe.report.memory["inplace"] == len(in_place_steps(exe)) == 6
    assert_same_results(exe, feeds_for(exe, seed=3))


# ------------------------------------------------------------------ what must not run in place

def test_relu_whose_input_is_read_later_does_not_run_in_place():
    g = og.Graph()
    x, w = g.input("x", (1, 2, 4, 4)), g.param("w", (2, 2, 3, 3))
    c = og.conv2d(x, w, padding=1, name="c")
    r = og.relu(c, name="r")
    z = og.add(r, c, name="z")  # reads c after the ReLU
    exe = og.compile(z, pipeline="reference")
    assert "r" not in in_place_steps(exe)
    assert in_place_steps(exe) == {"z": exe.graph["r"].node}  # into r, dead there
    feeds = feeds_for(exe)
    (got,) = assert_same_results(exe, feeds)
    cv = og.compile(c, pipeline="reference")(**feeds)[0]
    assert (cv < 0).any()
    np.testing.assert_array_equal(got, np.maximum(cv, 0) + cv)


def test_relu_that_reads_its_input_last_of_two_readers_runs_in_place():
    # the other reader ran before: nothing reads c after the ReLU
    g = og.Graph()
    x, w, w2 = g.input("x", (1, 2, 4, 4)), g.param("w", (2, 2, 3, 3)), g.param("w2", (3, 2, 1, 1))
    c = og.conv2d(x, w, padding=1, name="c")
    z = og.conv2d(c, w2, name="z")
    r = og.relu(c, name="r")
    exe = og.compile([z, r], pipeline="reference")
    assert [st.name for st in exe.steps] == ["c", "z", "r"]
    assert in_place_steps(exe) == {"r": exe.graph["c"].node}
    feeds = feeds_for(exe)
    zv, rv = assert_same_results(exe, feeds)
    cv = og.compile(c, pipeline="reference")(x=feeds["x"], w=feeds["w"])[0]
    np.testing.assert_array_equal(rv, np.maximum(cv, 0))
    np.testing.assert_array_equal(zv, og.compile(z, pipeline="reference")(**feeds)[0])


def test_a_requested_value_is_never_overwritten():
    g = og.Graph()
    x, w = g.input("x", (1, 2, 4, 4)), g.param("w", (2, 2, 3, 3))
    c = og.conv2d(x, w, padding=1, name="c")
    r = og.relu(c, name="r")  # c's last reader, but c is an output
    exe = og.compile([c, r], pipeline="reference")
    assert in_place_steps(exe) == {}
    cv, rv = assert_same_results(exe, feeds_for(exe))
    assert (cv < 0).any() and not np.shares_memory(cv, rv)


def test_relu_of_a_feed_a_parameter_or_a_gradient_feed_leaves_them_alone():
    g = og.Graph()
    x, w = g.input("x", (2, 5)), g.param("w", (2, 5))
    y = og.add(og.relu(x, name="rx"), og.relu(w, name="rw"), name="y")
    (gx,) = og.grad(y, [x])
    exe = og.compile([y, gx], pipeline="reference")
    names = in_place_steps(exe)
    assert "rx" not in names and "rw" not in names
    # ReLU-backward reads the gradient feed: never overwritten
    assert all(not n.startswith("rx.grad") for n in names), names
    feeds = feeds_for(exe)
    gy = np.linspace(-1, 1, 10, dtype=np.float32).reshape(2, 5)
    held = {k: v.copy() for k, v in feeds.items()}
    held_gy = gy.copy()
    assert_same_results(exe, feeds, {y: gy})
    for k in feeds:  # the caller's arrays (fed without a copy) are unchanged
        np.testing.assert_array_equal(feeds[k], held[k])
    np.testing.assert_array_equal(gy, held_gy)


def _view_reshape(ctx, op, x):
    """A reshape that returns a view of its input (no ``fresh_output``)."""
    return x.reshape(op.shape)


def compile_with_view(outputs, view_nodes):
    """Reference kernels everywhere, a view-returning reshape on ``view_nodes``."""
    policy = og.LoweringPolicy(prefer={"*": ["reference", "direct"]},
                               force={n: "view" for n in view_nodes})
    pipe = Pipeline("p", [LowerPass(), MemoryPass(), VerifyPass()])
    return og.compile(outputs, policy=policy, pipeline=pipe)


def test_nothing_overwrites_a_buffer_that_a_view_still_shares(monkeypatch):
    install_rule(monkeypatch, ops.Reshape, Rule(ops.Reshape, "view", _view_reshape))
    g = og.Graph()
    x, w = g.input("x", (1, 2, 4, 4)), g.param("w", (2, 2, 3, 3))
    c = og.conv2d(x, w, padding=1, name="c")
    v = og.reshape(c, (2, 16), name="v")  # a view of c
    r = og.relu(c, name="r")  # c's last reader, but v (alive) shares its buffer
    s = og.add(v, v, name="s")  # reads the view after the ReLU
    exe = compile_with_view([r, s], ["v"])
    assert exe.graph.node(exe.graph["v"].node).op.algorithm == "view"
    assert "r" not in in_place_steps(exe)
    assert "s" not in in_place_steps(exe)  # v is not its own buffer
    feeds = feeds_for(exe)
    rv, sv = assert_same_results(exe, feeds)
    cv = og.compile(c, pipeline="reference")(**feeds)[0]
    np.testing.assert_array_equal(sv, 2 * cv.reshape(2, 16))  # not 2 * relu(c)
    np.testing.assert_array_equal(rv, np.maximum(cv, 0))


def test_a_relu_of_a_view_does_not_write_into_its_live_base(monkeypatch):
    install_rule(monkeypatch, ops.Reshape, Rule(ops.Reshape, "view", _view_reshape))
    g = og.Graph()
    x, w = g.input("x", (1, 2, 4, 4)), g.param("w", (2, 2, 3, 3))
    c = og.conv2d(x, w, padding=1, name="c")
    r = og.relu(og.reshape(c, (2, 16), name="v"), name="r")
    exe = compile_with_view([r, c], ["v"])  # c is requested: it lives to the end
    assert in_place_steps(exe) == {}
    feeds = feeds_for(exe)
    rv, cv = assert_same_results(exe, feeds)
    assert (cv < 0).any()  # the base kept its negative values
    np.testing.assert_array_equal(rv, np.maximum(cv.reshape(2, 16), 0))


def test_a_declared_view_free_rule_would_be_overwritten(monkeypatch):
    # the same graph with the view rule declared fresh: the plan trusts it
    # (which is why only audited rules declare fresh_output)
    install_rule(monkeypatch, ops.Reshape,
                 Rule(ops.Reshape, "view", _view_reshape, fresh_output=True))
    g = og.Graph()
    x, w = g.input("x", (1, 2, 4, 4)), g.param("w", (2, 2, 3, 3))
    c = og.conv2d(x, w, padding=1, name="c")
    r = og.relu(og.reshape(c, (2, 16), name="v"), name="r")
    exe = compile_with_view([r], ["v"])
    assert in_place_steps(exe) == {"r": exe.graph["v"].node}


# ------------------------------------------------------------------ layouts

def _stamp(layout_of):
    def stamp(graph, outputs, ctx):
        for view in graph.nodes_in_order(outputs):
            layout = layout_of(view)
            if view.type.ndim == 4 and layout is not None:
                graph.nx.nodes[view.id]["type"] = attrs.evolve(view.type, layout=layout)
        return graph
    return FunctionPass("stamp", stamp)


def compile_layout(outputs, layout_of):
    pipe = Pipeline("p", [LowerPass(REFERENCE_POLICY), _stamp(layout_of), MemoryPass(), VerifyPass()])
    return og.compile(outputs, pipeline=pipe)


def test_a_channels_last_value_is_overwritten_through_its_strides():
    _, y, grads = small_net()
    exe = compile_layout([y, *grads], lambda view: "NHWC")
    assert set(in_place_steps(exe)) == {"relu1", "relu2", "relu2.grad/relu_backward",
                                        "relu1.grad/relu_backward"}
    feeds = feeds_for(exe)
    assert_same_results(exe, feeds, None)
    slots = exe.feed(feeds)
    for st in exe.steps:
        target = st.writes_into
        before = slots[target] if target is not None else None
        slots[st.node] = out = run_step(st, slots)
        if target is not None and out.ndim == 4:
            assert out is before and is_channels_last(out)
        for f in st.free:
            slots.pop(f, None)
    # and NHWC storage changes no value: the NCHW run gives the same numbers
    nchw = og.compile([y, *grads], pipeline="reference")
    for a, b in zip(exe(**feeds), nchw(**feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_one_channel_nhwc_value_is_overwritten_too():
    # C == 1: NCHW and NHWC storage coincide; the step must still return its input
    g = og.Graph()
    x, w = g.input("x", (2, 3, 4, 4)), g.param("w", (1, 3, 3, 3))
    c = og.conv2d(x, w, padding=1, name="c")
    r = og.relu(c, name="r")
    exe = compile_layout(og.add(r, r, name="s"), lambda view: "NHWC")
    assert set(in_place_steps(exe)) == {"r", "s"}
    slots = exe.feed(feeds_for(exe))
    for st in exe.steps:
        before = slots[st.writes_into] if st.writes_into is not None else None
        slots[st.node] = out = run_step(st, slots)
        assert before is None or out is before
    assert_same_results(exe, feeds_for(exe))


def test_input_and_output_of_different_layouts_do_not_share_a_buffer():
    g = og.Graph()
    x, w = g.input("x", (1, 2, 4, 4)), g.param("w", (2, 2, 3, 3))
    r = og.relu(og.conv2d(x, w, padding=1, name="c"), name="r")
    exe = compile_layout(r, lambda view: "NHWC" if view.name == "r" else "NCHW")
    assert in_place_steps(exe) == {}
    (got,) = exe(**feeds_for(exe))
    assert is_channels_last(got)


# ------------------------------------------------------------------ the plan and its report

def test_planned_peak_drops_by_the_bytes_the_in_place_steps_save():
    _, y, grads = small_net()
    exe = og.compile([y, *grads], pipeline="reference")
    graph, outs = exe.graph, exe.outputs
    a = 2 * 4 * 8 * 8 * F32  # conv1 / relu1 / their gradients
    p = 2 * 4 * 4 * 4 * F32  # pool1 and its input gradient (conv2's backward-data)
    # the outputs computed by the time of the peak: fc, its weight gradient, conv2's
    kept = 2 * 10 * F32 + 10 * 128 * F32 + 8 * 4 * 3 * 3 * F32
    none = plan_memory(graph, outs, inplace=InplacePlan({v.node for v in outs}, {}))
    # out of place the peak is relu1's gradient: relu1 (its mask), the pooling
    # gradient and the new output
    assert none["planned_peak_bytes"] == kept + 3 * a and none["peak_step"] == "relu1.grad/relu_backward"
    assert none["inplace"] == 0 and none["inplace_bytes"] == 0
    plan = exe.report.memory
    # in place that step holds 2 a; the peak moves to the pooling gradient:
    # relu1, conv2's data gradient (its input) and its own output
    assert plan["planned_peak_bytes"] == kept + 2 * a + p
    assert plan["peak_step"] == "pool1.grad/max_pool2d_backward"
    assert none["planned_peak_bytes"] - plan["planned_peak_bytes"] == a - p == 1536
    c = 2 * 8 * 4 * 4 * F32  # conv2 / relu2 and their gradients
    assert plan["inplace"] == 4 and plan["inplace_bytes"] == 2 * a + 2 * c
    # no_reuse_bytes still counts every output buffer
    assert plan["no_reuse_bytes"] == none["no_reuse_bytes"]


def _root(a):
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def measured_live_peak(exe, feeds) -> int:
    """Most bytes of distinct buffers the executor holds at once (sources apart)."""
    slots = exe.feed(feeds)
    sources = set(slots)
    peak = 0
    for st in exe.steps:
        slots[st.node] = run_step(st, slots)
        bufs = {id(_root(v)): _root(v).nbytes for n, v in slots.items() if n not in sources}
        peak = max(peak, sum(bufs.values()))
        for f in st.free:
            slots.pop(f, None)
    return peak


@pytest.mark.parametrize("branch", [False, True])
def test_the_executor_holds_what_the_plan_says(branch):
    _, y, grads = small_net(branch)
    exe = og.compile([y, *grads], pipeline="reference")
    feeds = feeds_for(exe)
    assert measured_live_peak(exe, feeds) == exe.report.memory["activation_peak_bytes"]
    outs = exe.outputs
    none = plan_memory(exe.graph, outs, inplace=InplacePlan({v.node for v in outs}, {}))
    assert measured_live_peak(out_of_place(exe), feeds) == none["activation_peak_bytes"]
    assert none["activation_peak_bytes"] > exe.report.memory["activation_peak_bytes"]


def test_the_default_pipeline_plans_in_place_too():
    _, y, grads = small_net(branch=True)
    exe = og.compile([y, *grads])  # gemm convolutions, conv + bias + ReLU fused
    names = in_place_steps(exe)
    assert "relu2" in names and "relu2.grad/relu_backward" in names
    assert exe.report.memory["inplace"] == len(names)
    assert "inplace=" in exe.report()  # the text report shows the count
    assert_same_results(exe, feeds_for(exe, seed=5))


def test_an_abstract_graph_plans_nothing_in_place():
    _, y, grads = small_net()
    plan = plan_inplace(y.graph, [y, *grads])
    assert plan.writes == {}
    assert plan_memory(y.graph, [y, *grads])["inplace"] == 0


def test_the_plan_is_for_its_outputs_and_dropped_by_a_rewrite():
    _, y, grads = small_net()
    exe = og.compile([y, *grads], pipeline="reference")
    graph = exe.graph
    assert graph.inplace_plan is not None and graph.inplace_plan.writes
    # an executable for other outputs: another schedule, the plan does not apply
    relu1 = graph["relu1"]
    other = Executable(graph, [y, relu1], _resolve)
    assert all(st.inplace is None for st in other.steps)
    same = Executable(graph, exe.outputs, _resolve)
    assert [st.inplace for st in same.steps] == [st.inplace for st in exe.steps]
    # a copy keeps it; a rewrite drops it
    copy = graph.copy()
    assert copy.inplace_plan is graph.inplace_plan
    copy.replace_op(relu1.node, graph.node(relu1.node).op)
    assert copy.inplace_plan is None


def test_a_plan_that_no_longer_holds_is_refused():
    _, y, grads = small_net()
    exe = og.compile([y, *grads], pipeline="reference")
    graph = exe.graph.copy()
    relu1 = graph["relu1"].node
    # relu1's input made a (different) layout behind the pass's back
    conv1 = graph["conv1"].node
    graph.nx.nodes[conv1]["type"] = attrs.evolve(graph.node(conv1).type, layout="NHWC")
    with pytest.raises(ExecutionError, match="relu1 cannot write its output into its input 0"):
        Executable(graph, exe.outputs, _resolve)
    graph.nx.nodes[conv1]["type"] = exe.graph.node(conv1).type
    Executable(graph, exe.outputs, _resolve)  # holds again
    # a plan naming an input that is read later, or of another type
    for node, why in [("pool1", "relu1 is read after it"),
                      ("conv1.grad/bias_add_backward", r"relu1.grad/relu_backward is float32\[2, 4, 8, 8\]")]:
        graph.inplace_plan = InplacePlan({v.node for v in exe.outputs}, {graph[node].node: 0})
        with pytest.raises(ExecutionError, match=why):
            Executable(graph, exe.outputs, _resolve)


def _resolve(op, out_type):
    from opgraph.backends.registry import KernelContext, lookup
    return lookup(type(op.op), op.algorithm).kernel, KernelContext(np, "cpu", op.option_dict, out_type)


def test_the_plan_counts_float32_statistics_under_a_bfloat16_override():
    """Under ``compile(dtype='bfloat16')`` batch statistics still run in float32
    (``BatchNormStats``: SEMANTICS.md), so the plan counts each value in the
    dtype it runs in (``run_types``), as the executor allocates it: a DenseNet
    block's zero-copy statistics buffers included."""
    from fused_training_steps import training_step
    from modern_blocks import dense_block
    outs, feeds, _ = training_step(dense_block, np.random.default_rng(0))
    exe = og.compile(outs, dtype="bfloat16")
    assert measured_live_peak(exe, feeds) == exe.report.memory["activation_peak_bytes"]
