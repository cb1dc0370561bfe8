"""Autotune times a concat's producers in the form they run (``passes/autotune_measure.py``).

The zero-copy plan (``passes/zero_copy.py``) makes a producer of a concat
write into its slice of the concat's buffer: a strided view. Autotune runs
before that plan, so it predicts it (``zero_copy.predict_homes``, the plan's
own conditions on the graph autotune tunes), times a rule that writes strided
views with ``out=`` such a view of a scratch buffer, and as a second
candidate ``strided_out: False`` (its dense result plus the copy into the
slice), which the plan honours by copying the result in (``copied_in``). The
cache key names the slice, so a dense decision is never reused for it.

The stub graph: ``x`` -> ``s0`` (Scale, tuned) and ``s1`` (Scale, forced to the
reference) -> ``cat`` (concat on the channels) -> output.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import opgraph as og
from opgraph import ops
from opgraph.backends import registry
from opgraph.backends.registry import Rule
from opgraph.benchmarks.models import build
from opgraph.graph import graph_of
from opgraph.passes.autotune_cache import AutotuneCache
from opgraph.passes.base import Pass, PassContext, Pipeline
from opgraph.passes.memory import MemoryPass, plan_inplace
from opgraph.passes.pipelines import default
from opgraph.passes.policy import LoweringPolicy

from passes_stubs import SCALE_RULES, Scale, StubTimer, cudnn_accepts

SHAPE = (2, 3, 4, 4)
CAT = (2, 6, 4, 4)


class Recorder:
    """Stub kernels that record what they were called with."""

    def __init__(self):
        self.outs, self.options = [], []

    def strided(self, ctx, op, x, out=None):
        """Writes ``2 x`` into ``out=`` when given (``writes_strided_out``)."""
        self.outs.append(out)
        self.options.append(dict(ctx.options))
        if out is None:
            return 2 * x
        out[...] = 2 * x
        return out

    def dense(self, ctx, op, x):
        self.outs.append(None)
        self.options.append(dict(ctx.options))
        return 2 * x


def install(monkeypatch) -> Recorder:
    """Scale rules: the reference, ``engine`` (writes strided views) and ``lean`` (does not)."""
    rec = Recorder()
    registry.rules_for(Scale)  # load the backends first
    monkeypatch.setitem(registry._RULES, Scale, {
        "reference": SCALE_RULES["reference"],
        "engine": Rule(Scale, "engine", rec.strided, writes_strided_out=True, fresh_output=True),
        "lean": Rule(Scale, "lean", rec.dense, fresh_output=True)})
    return rec


def concat_graph():
    g = og.Graph("cat")
    x = g.input("x", SHAPE)
    s0 = g.add_node(Scale(), [x], name="s0")
    s1 = g.add_node(Scale(), [x], name="s1")
    return g, og.concat([s0, s1], 1, name="cat")


def alone_graph():
    g = og.Graph("alone")
    return g, g.add_node(Scale(), [g.input("x", SHAPE)], name="s0")


def tune(out, cache, timer):
    """``og.compile`` for the CPU with autotune and ``cache``; ``s1`` (if any) forced to the reference."""
    force = {"s1": "reference"} if any(v.name == "s1" for v in graph_of(out).nodes_in_order([out])) else {}
    policy = LoweringPolicy(autotune=True, cache=str(cache), force=force)
    return og.compile([out], device="cpu", policy=policy, timer=timer, dtype="float64")


def rows(exe, name="s0"):
    return {c.label: c for c in exe.report.node(name).candidates}


def test_a_homed_producer_is_timed_writing_a_strided_view_of_the_concat_buffer(monkeypatch, tmp_path):
    rec = install(monkeypatch)
    g, cat = concat_graph()
    timer = StubTimer({"engine": 1.0, "engine[strided_out=False]": 2.0, "lean": 3.0, "reference": 9.0})
    exe = tune(cat, tmp_path / "c.json", timer)
    # both forms of the strided writer, the other rule once (dense, then the copy)
    assert {"engine", "engine[strided_out=False]", "lean"} <= set(rows(exe))
    assert {"engine", "engine[strided_out=False]", "lean"} <= set(timer.calls)
    views = [o for o in rec.outs if o is not None]
    assert views, "no candidate got out="
    itemsize = np.dtype("float64").itemsize
    for v in views:  # the slice of a (2, 6, 4, 4) buffer: the concat's strides, not a dense array's
        assert v.shape == SHAPE and v.strides == tuple(itemsize * s for s in (96, 16, 4, 1))
        assert not v.flags.c_contiguous
    assert all("strided_out" not in o for o in rec.options)  # the plan's option, never a kernel's
    # the strided write was fastest: the step writes into its slice
    assert exe.report.node("s0").options == {}
    step = next(st for st in exe.steps if st.name == "s0")
    assert step.view is not None and not step.view.copy
    x = np.random.default_rng(0).standard_normal(SHAPE)
    np.testing.assert_array_equal(exe(x=x)[0], np.concatenate([2 * x, 2 * x], axis=1))


def test_dense_plus_copy_faster_is_copied_into_the_slice_and_matches_the_reference(monkeypatch, tmp_path):
    rec = install(monkeypatch)
    g, cat = concat_graph()
    timer = StubTimer({"engine": 3.0, "engine[strided_out=False]": 1.0, "lean": 2.0, "reference": 9.0})
    exe = tune(cat, tmp_path / "c.json", timer)
    assert exe.report.node("s0").algorithm == "engine"
    assert exe.report.node("s0").options == {"strided_out": False}
    assert rows(exe)["engine[strided_out=False]"].status == "chosen"
    step = next(st for st in exe.steps if st.name == "s0")
    assert step.view is not None and step.view.copy  # the zero-copy plan honours the option
    assert "copied into its slice of cat" in exe.report()
    rec.outs.clear(), rec.options.clear()
    x = np.random.default_rng(1).standard_normal(SHAPE)
    ref = og.compile([cat], device="cpu", dtype="float64", pipeline="reference")
    np.testing.assert_allclose(exe(x=x)[0], ref(x=x)[0], rtol=0, atol=0)
    assert rec.outs == [None] and rec.options == [{}]  # the step ran dense, without the option


def test_real_convolutions_copied_in_equal_the_float64_reference(tmp_path):
    """An inception module (four branches into a concat) on the CPU's conv
    algorithms, every dense-plus-copy form timed faster: each conv producer
    is copied into its slice, the algorithms' kernels never see the option
    (those passing ``**ctx.options`` on would raise), and a training step
    equals the reference pipeline's."""
    from test_zero_copy import _training, inception, _assert_matches_the_reference

    class DenseFaster(StubTimer):
        def measure(self, fn, *, label, warmup, repeats):
            self.calls.append(label)
            fn()
            return [(1.0 if "strided_out=False" in label else 2.0) / 1e3] * repeats

    g, out, cat, outputs = _training(inception)
    timer = DenseFaster({})
    exe = og.compile(outputs, device="cpu", dtype="float64", timer=timer,
                     policy=LoweringPolicy(autotune=True, cache=str(tmp_path / "c.json")))
    concat = next(st for st in exe.steps if st.name == "inception")
    producers = [st for st in exe.steps if st.node in exe.graph.input_ids(concat.node)]
    convs = [st for st in producers if st.op.op.family == "conv"]
    assert convs and all(st.view.copy and st.op.option_dict.get("strided_out") is False for st in convs)
    for st in convs:  # the strided form was checked correct too (it lost on time only)
        strided = [c for c in exe.report.node(st.name).candidates
                   if c.status != "declined" and "strided_out" not in c.options and c.status != "excluded"]
        assert strided and all(c.status in ("ok", "chosen") for c in strided), [(c.label, c.status) for c in strided]
    assert concat.view.copies == ()
    _assert_matches_the_reference(g, out, outputs, exe, seed=5)


def test_the_cache_key_of_a_homed_node_differs_from_a_dense_one(monkeypatch, tmp_path):
    """The same node (op, inputs, policy, machine), once a concat input and once
    alone: two entries, and neither compile reuses the other's decision."""
    install(monkeypatch)
    cache = tmp_path / "c.json"
    timer = StubTimer({"engine": 3.0, "engine[strided_out=False]": 1.0, "lean": 2.0})
    homed = tune(concat_graph()[1], cache, timer)
    alone = tune(alone_graph()[1], cache, timer)
    assert homed.report.node("s0").how == alone.report.node("s0").how == "autotune"
    assert homed.report.node("s0").cache_key != alone.report.node("s0").cache_key
    assert "| out=NCHW[2x6x4x4] 1:0:3 |" in homed.report.node("s0").cache_key
    assert "| out=" not in alone.report.node("s0").cache_key
    assert alone.report.node("s0").options == {}  # no strided_out where nothing is homed
    assert "engine[strided_out=False]" not in rows(alone)
    entries = json.loads(cache.read_text())["entries"]
    assert len([k for k in entries if k.startswith("Scale")]) == 2
    # and each compile again reuses its own entry
    assert tune(concat_graph()[1], cache, StubTimer({})).report.node("s0").options == {"strided_out": False}
    assert tune(alone_graph()[1], cache, StubTimer({})).report.node("s0").how == "cache"


def _edit_choice(cache, options):
    """Give the Scale entry's ``engine`` row (the fastest, chosen) ``options``
    and make it the entry's choice, by hand."""
    data = json.loads(cache.read_text())
    (key,) = [k for k in data["entries"] if k.startswith("Scale")]
    entry = data["entries"][key]
    (row,) = [r for r in entry["candidates"] if r["algorithm"] == "engine" and r["options"] == {}]
    row["options"] = entry["options"] = options
    entry["tuned"] = {"algorithm": "engine", "options": options}
    cache.write_text(json.dumps(data))


@pytest.mark.parametrize("graph, options", [(alone_graph, {"strided_out": False}),
                                            (concat_graph, {"strided_out": True})],
                         ids=["dense-node", "strided_out-true"])
def test_a_cached_strided_out_the_plan_would_not_read_is_refused(monkeypatch, tmp_path, graph, options):
    """``strided_out`` edited into a dense node's entry (the plan would ignore
    it), or set to anything but false: the entry is refused, saying why, and
    the node re-tuned."""
    install(monkeypatch)
    cache = tmp_path / "c.json"
    tune(graph()[1], cache, StubTimer({"engine": 1.0}))
    _edit_choice(cache, options)
    why = (r"this node's output is not written into a concat's buffer" if graph is alone_graph
           else r"the one value it takes is false")
    with pytest.warns(RuntimeWarning, match=r"cached option strided_out=(False|True) of engine: " + why):
        exe = tune(graph()[1], cache, StubTimer({"engine": 1.0}))
    assert exe.report.node("s0").how == "autotune" and exe.report.node("s0").options == {}


class _Predict(Pass):
    """Records ``predict_homes`` on the graph as autotune would see it."""

    name = "predict"

    def __init__(self):
        self.homes = None

    def run(self, graph, outputs, ctx):
        from opgraph.passes.zero_copy import predict_homes  # imported here: the other tests run without it

        self.homes = predict_homes(graph, outputs)
        return graph


def _prediction_and_plan(outputs, dtype):
    """The default cuda pipeline (cuDNN's checks stubbed, no autotune) with the
    prediction made where autotune runs (between fuse and memory)."""
    policy = LoweringPolicy(layout="NHWC")
    passes = default(policy).passes
    spy = _Predict()
    at = next(i for i, p in enumerate(passes) if isinstance(p, MemoryPass))
    pipe = Pipeline("spy", passes[:at] + [spy] + passes[at:])
    ctx = PassContext(device="cuda", policy=policy, dtype=dtype)
    graph, outs = pipe.run(graph_of(*outputs), list(outputs), ctx)
    return spy.homes, plan_inplace(graph, outs, zero_copy=True), graph


def test_the_prediction_is_the_final_plan_on_googlenet_and_densenet(monkeypatch):
    """The prediction (made where autotune runs) against the executor's own reading of the final
    plan: ``buffer_views.step_views`` walks the plan's homes by its own code, so the region each
    homed value's step writes (root, channels-last, bounds in the root buffer) is an independent
    oracle of ``Home.region``; ``zero_copy._region`` (the prediction's code) is compared too."""
    import numpy as np

    from opgraph.buffer_views import step_views
    from opgraph.passes.zero_copy import _region

    cudnn_accepts(monkeypatch)
    for key in ("googlenet", "densenet121"):
        m = build(key, batch=2)
        outputs = [m.output, *og.grad(m.output, m.params, grad_outputs=[m.output])]
        predicted, plan, graph = _prediction_and_plan(outputs, "bfloat16")
        assert predicted and set(predicted) == set(plan.homes), key
        views = step_views(graph, plan, np)
        for v, home in predicted.items():
            mine, theirs = home.region(np.float32), views[v].region
            assert (mine.bounds(), mine.channels_last) == (theirs.bounds(), theirs.channels_last), \
                (key, graph.node(v).name)
            root, chain = _region(plan.homes, graph, v)
            assert (home.root, home.chain) == (root, chain), (key, graph.node(v).name)
            assert home.shape == graph.node(root).type.shape
            assert home.layout == graph.node(root).type.layout == ("NHWC" if len(home.shape) == 4 else None)
        # the strided writers among them are the conv producers (cuDNN forward, NHWC)
        convs = [v for v in predicted if graph.node(v).op.op.family == "conv"]
        assert convs and not set(convs) & plan.copied_in, key
        if key == "googlenet":  # e.g. inception_3b's 3x3 branch: a channel slice of the module's output
            names = {graph.node(v).name for v in convs}
            assert any(n.startswith("inception_3b") for n in names), sorted(names)[:5]
            assert not any(isinstance(graph.node(v).op.op, ops.Concat) for v in convs)
