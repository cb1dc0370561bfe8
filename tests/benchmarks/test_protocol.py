"""The convnet-benchmarks protocol: training graph, phase split, timed loops."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

import opgraph as og
from opgraph.benchmarks.models import build
from opgraph.benchmarks.protocol import (PHASES, PhaseRunner, layer_of, random_feeds, schedule,
                                         training_graph)
from opgraph.benchmarks.timer import CpuTimer, Timing
from opgraph.op import abstract_of


def compiled(model, algo="gemm", **policy):
    tg = training_graph(model, input_grad=model.key.startswith("L"))
    exe = og.compile(tg.outputs, policy={"prefer": {"conv": [algo]}, **policy})
    return tg, exe, schedule(exe, tg)


def ops_by_phase(sched):
    return {p: [(st.name, abstract_of(st.op).name) for st in steps] for p, steps in sched.phases.items()}


def test_alexnet_first_conv_has_no_backward_data():
    tg, exe, sched = compiled(build("alexnet", batch=1))
    names = {st.name for st in exe.steps}
    assert "conv1.grad/conv2d_backward_data" not in names
    assert "conv2.grad/conv2d_backward_data" in names
    assert "backward_data" not in sched.layers["conv1"]
    assert set(sched.layers["conv2"]) == set(PHASES)
    assert "conv1" not in tg.data_grad_layers and "conv2" in tg.data_grad_layers


def test_phase_split_of_a_small_model(tiny):
    tg, exe, sched = compiled(tiny)
    got = ops_by_phase(sched)
    assert {n for n, _ in got["forward"]} == {"conv1", "pool1", "conv2", "flatten", "fc"}
    filt = dict(got["backward_filter"])
    assert filt == {"fc.grad/matmul_2": "MatMul", "fc.grad/bias_add_backward": "BiasAddBackward",
                    "conv2.grad/conv2d_backward_filter": "Conv2dBackwardFilter",
                    "conv2.grad/bias_add_backward": "BiasAddBackward",
                    "conv1.grad/conv2d_backward_filter": "Conv2dBackwardFilter",
                    "conv1.grad/bias_add_backward": "BiasAddBackward"}
    data = {op for _, op in got["backward_data"]}
    # the ReLU gradient below the first layer (fused with pool1's: MaxPool2dBackwardRelu) is
    # read by weight gradients only, yet it is an activation's gradient: backward-data
    # (Torch: updateGradInput)
    assert {"MatMul", "Reshape", "Conv2dBackwardData", "MaxPool2dBackwardRelu"} <= data
    assert dict(got["backward_data"])["pool1.grad/max_pool2d_backward"] == "MaxPool2dBackwardRelu"
    unfused = ops_by_phase(compiled(tiny, exclude=["fused"])[2])  # a second grad: names get _2
    assert any(name.startswith("relu1.grad/relu_backward") for name, _ in unfused["backward_data"])
    assert not {"Conv2dBackwardFilter", "BiasAddBackward"} & data
    # every step in exactly one phase, schedule order kept
    flat = [st.node for p in PHASES for st in sched.phases[p]]
    assert sorted(flat) == sorted(st.node for st in exe.steps)


def test_legalize_pads_join_their_convolution_and_phase(tiny):
    # explicit padding for gemm: Pad before conv and wgrad, PadBackward after dgrad
    tg, exe, sched = compiled(tiny, explicit_padding=["gemm"])
    ops = {st.name: (abstract_of(st.op).name, p) for p, steps in sched.phases.items() for st in steps}
    assert ops["conv2/pad"] == ("Pad", "forward")
    pads = [n for n, (op, p) in ops.items() if op == "Pad" and ".grad/" in n]
    assert pads and all(ops[n][1] == "backward_filter" for n in pads)
    assert ops["conv2.grad/conv2d_backward_data"] == ("PadBackward", "backward_data")
    assert {st.name for st in sched.layers["conv2"]["forward"]} == {"conv2/pad", "conv2"}
    assert layer_of("conv2.grad/conv2d_backward_data/unpadded") == "conv2"
    assert layer_of("inception_3a/5x5.grad/conv2d_backward_filter/pad") == "inception_3a/5x5"
    assert layer_of("inception_3a/5x5") == "inception_3a/5x5"


def test_layer_suite_times_the_input_gradient():
    tg, exe, sched = compiled(build("L4", batch=1))
    assert tg.input_grad is not None and tg.output_names[-1] == "data"
    assert [abstract_of(st.op).name for st in sched.phases["backward_data"]] == ["Conv2dBackwardData"]
    assert set(sched.layers["L4"]) == set(PHASES)


class CountingTimer:
    """Stub clock: runs ``fn`` ``repeat`` times, records which label ran, returns 1 ms each."""

    clock = "stub"

    def __init__(self):
        self.labels, self.syncs = [], 0

    def measure(self, fn, *, label, repeat):
        self.labels.append((label, repeat))
        for _ in range(repeat):
            fn()
        return [1.0] * repeat

    def synchronize(self):
        self.syncs += 1


def test_each_phase_runs_its_kernels_in_its_own_loop(tiny):
    tg, exe, sched = compiled(tiny)
    calls = {}

    def counting(st):
        def kernel(ctx, op, *arrays):
            calls[st.name] = calls.get(st.name, 0) + 1
            return st.kernel(ctx, op, *arrays)
        return attrs.evolve(st, kernel=kernel)

    steps = {st.node: counting(st) for st in sched.steps}
    sched = attrs.evolve(sched, steps=tuple(steps[s.node] for s in sched.steps),
                         phases={p: tuple(steps[s.node] for s in v) for p, v in sched.phases.items()},
                         layers={k: {p: tuple(steps[s.node] for s in v) for p, v in d.items()}
                                 for k, d in sched.layers.items()})
    timer = CountingTimer()
    runner = PhaseRunner(sched, exe.feed(random_feeds(tiny)), timer)
    runner.warmup(2)
    assert set(calls.values()) == {2} and len(calls) == len(exe.steps)
    calls.clear()
    timings = runner.time_phases(3)
    assert [lab for lab, _ in timer.labels] == list(PHASES)
    for p in PHASES:
        assert isinstance(timings[p], Timing) and timings[p].median_ms == 1.0
        assert all(calls[st.name] == 3 for st in sched.phases[p])
    assert sum(calls.values()) == 3 * len(exe.steps)
    calls.clear()
    timer.labels.clear()
    per_layer = runner.time_layers(2)
    assert set(per_layer) == {"conv1", "conv2", "fc"}
    assert set(per_layer["conv1"]) == {"forward", "backward_filter"}  # no input gradient
    assert ("conv2/backward_data", 2) in timer.labels
    layer_steps = {st.name for d in sched.layers.values() for v in d.values() for st in v}
    assert set(calls) == layer_steps and set(calls.values()) == {2}
    assert "pool1" not in calls and timer.syncs >= 1


def test_phases_without_warmup_fill_the_values_first(tiny):
    tg, exe, sched = compiled(tiny)
    runner = PhaseRunner(sched, exe.feed(random_feeds(tiny)), CpuTimer())
    out = runner.time_phases(2)  # backward reads forward values: filled by one untimed run
    assert all(len(out[p].times_ms) == 2 for p in PHASES)
    with pytest.raises(ValueError, match="warmup=-1"):
        runner.warmup(-1)


def test_timer_and_timing():
    t = CpuTimer()
    n = []
    times = t.measure(lambda: n.append(1), label="x", repeat=4)
    assert len(n) == 4 and len(times) == 4 and all(x >= 0 for x in times)
    with pytest.raises(ValueError, match="repeat=0"):
        t.measure(lambda: None, label="x", repeat=0)
    s = Timing([3.0, 1.0, 2.0, 10.0])
    assert (s.median_ms, s.min_ms, s.mean_ms) == (2.5, 1.0, 4.0)
    assert Timing.from_dict(s.as_dict()) == s
    with pytest.raises(ValueError):
        Timing([])


def test_a_shared_weight_sums_its_partial_gradients_in_backward_filter():
    from opgraph.benchmarks.models import Model

    g = og.Graph("shared")
    x = g.input("data", (2, 4))
    w = g.param("w", (4, 4))
    h = og.relu(og.linear(x, w, name="fc1"), name="relu")
    y = og.linear(h, w, name="fc2")
    m = Model(key="shared", spec_key="shared", title="", graph=g, input=x, output=y, params=[w],
              first_conv_input=x, seed_batch=2, batch=2, dtype="float32")
    tg, exe, sched = compiled(m)
    got = ops_by_phase(sched)
    assert sorted(op for _, op in got["backward_filter"]) == ["Add", "MatMul", "MatMul"]
    assert sorted(op for _, op in got["backward_data"]) == ["MatMul", "ReluBackward"]


def test_phases_are_captured_once_per_runner(tiny, monkeypatch):
    from opgraph import graph_replay

    tg, exe, sched = compiled(tiny)
    runner = PhaseRunner(sched, exe.feed(random_feeds(tiny)), CpuTimer())
    monkeypatch.setattr(graph_replay, "GraphReplay", lambda steps, slots, run, stream: object())
    assert set(runner.graph_phases(stream=None)) == set(PHASES)
    with pytest.raises(RuntimeError, match="already captured"):
        runner.graph_phases(stream=None)


def test_a_slot_runs_in_its_fillers_phase_and_the_phase_loops_keep_what_it_wrote(tiny):
    """``relu-bias-sums`` makes a parameter gradient (backward-filter by its readers) a slot that a
    ReLU gradient (backward-data) fills: the slot's step joins its filler's phase, or each
    backward-filter loop would give the bias gradient a fresh, unwritten buffer."""
    tg, exe, sched = compiled(tiny, include=["fused-reference"])  # both slot rules run by default
    phase = {st.node: p for p, steps in sched.phases.items() for st in steps}
    fillers = [(st.node, exe.graph.input_ids(st.node)[k]) for st in exe.steps for k in abstract_of(st.op).fills]
    assert {abstract_of(exe.graph.node(s).op).name for _, s in fillers} == {"ReluBackwardSumsSlot",
                                                                          "MaxPool2dArgmaxSlot"}
    assert all(phase[slot] == phase[filler] for filler, slot in fillers)
    assert {phase[s] for _, s in fillers} == {"forward", "backward_data"}

    def garbage(ctx, op, *arrays):  # what uninitialised memory may hold
        return np.full(ctx.out_shape(op, *arrays), 77, dtype=np.dtype(ctx.out_type.dtype))

    steps = {st.node: attrs.evolve(st, kernel=garbage) if abstract_of(st.op).filled_by_reader else st
             for st in sched.steps}
    sched = attrs.evolve(sched, steps=tuple(steps[s.node] for s in sched.steps),
                         phases={p: tuple(steps[s.node] for s in v) for p, v in sched.phases.items()})
    feeds = random_feeds(tiny)
    runner = PhaseRunner(sched, exe.feed(feeds), CpuTimer())
    runner.time_phases(2)
    want = og.compile(tg.outputs, policy={"include": ["fused-reference"],
                                          "exclude": ["relu-bias-sums", "pool-scan"]})(**feeds)
    for v, w in zip(tg.outputs, want):
        node = exe.outputs[tg.outputs.index(v)].node
        np.testing.assert_allclose(runner.slots[node], w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("weight_first", [False, True])
def test_a_matmul_layer_has_backward_data_only_when_its_data_operand_needs_it(weight_first):
    """Review: a MatMul layer's data operand was taken to be its first input, so
    ``MatMul(W, x)`` on the model input (nothing to differentiate) was flagged as having
    a backward-data step, and a second such layer on a differentiated value was not."""
    from opgraph.benchmarks.models import Model

    g = og.Graph("mm")
    x = g.input("data", (4, 4))
    w1, w2 = g.param("w1", (4, 4)), g.param("w2", (4, 4))

    def layer(a, w, name):
        return og.matmul(w, a, name=name) if weight_first else og.matmul(a, w, name=name)

    y = layer(og.relu(layer(x, w1, "mm1")), w2, "mm2")
    m = Model(key="mm", spec_key="mm", title="", graph=g, input=x, output=y, params=[w1, w2],
              first_conv_input=x, seed_batch=4, batch=4, dtype="float32")
    tg = training_graph(m)
    assert set(tg.layers) == {"mm1", "mm2"}
    assert tg.data_grad_layers == {"mm2"}  # mm1 reads the model input: no data gradient
