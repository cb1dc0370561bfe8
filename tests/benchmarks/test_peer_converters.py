"""The PyTorch peer's converters: every op is converted or is a gradient autograd
computes, and each converter computes our op (float64 on the CPU against the
float64 reference, forward and gradients)."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph import ops
from opgraph.benchmarks.peer_converters import CONVERTERS, GRADIENT_OPS, PREPARED
from opgraph.benchmarks.protocol import training_graph
from opgraph.errors import NotDifferentiableError
from opgraph.op import Source, abstract_of

from peer_cases import CASES, feeds_of


def test_every_op_has_a_converter_or_is_a_gradient():
    """A new op fails here until it has a converter (or is declared a gradient op)."""
    every = set(ops.__all__)
    made_by_fusion = {n for n in every if getattr(ops, n).fused}  # the fuse pass runs after grad: no peer sees them
    missing = every - set(CONVERTERS) - set(GRADIENT_OPS) - made_by_fusion
    assert not missing, f"no PyTorch converter for {sorted(missing)} (benchmarks/peer_converters.py)"
    assert not set(CONVERTERS) & set(GRADIENT_OPS)
    assert set(CONVERTERS) | set(GRADIENT_OPS) <= every  # no entry for an op that is gone
    assert set(PREPARED) <= set(CONVERTERS)


def _new_ops(graph, before: set) -> set[str]:
    return {abstract_of(graph.node(n).op).name for n in graph.nx.nodes if n not in before
            and not isinstance(graph.node(n).op, Source)}


def test_the_gradient_ops_are_what_gradient_rules_make():
    """What the peer leaves to autograd is what opgraph's own gradient rules add
    (first and second order, over graphs that use every converted op): no forward
    op hides among them. The fuse pass's backward fusions are gradients too."""
    made, forward = set(), set()
    for build in CASES.values():
        model, _ = build()
        g = model.graph
        forward |= {abstract_of(n.op).name for n in g.nodes_in_order() if not isinstance(n.op, Source)}
        before = set(g.nx.nodes)
        tg = training_graph(model, input_grad=True)
        wrt = [*model.params, model.input]
        for value in tg.grads + (tg.input_grad,):
            try:
                og.grad(value, wrt, grad_outputs=[value])
            except NotDifferentiableError:  # a third derivative, a refused path
                pass
        made |= _new_ops(g, before)
    fused = {n for n in GRADIENT_OPS if getattr(ops, n).fused}
    assert set(GRADIENT_OPS) - fused <= made, sorted(set(GRADIENT_OPS) - fused - made)
    assert all("Backward" in n for n in fused)
    assert not set(GRADIENT_OPS) & forward


def test_the_cases_use_every_converter():
    used = set()
    for build in CASES.values():
        model, extras = build()
        used |= {abstract_of(n.op).name for n in model.graph.nodes_in_order([model.output, *extras])
                 if not isinstance(n.op, Source)}
    assert set(CONVERTERS) <= used, f"no converter test uses {sorted(set(CONVERTERS) - used)}"


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("case", list(CASES))
def test_converters_match_the_float64_reference(case, channels_last):
    torch = pytest.importorskip("torch")
    from opgraph.benchmarks.peer_torch import TorchModel

    model, extras = CASES[case]()
    tg = training_graph(model, input_grad=True)
    feeds = feeds_of(model)
    want = og.compile(tg.outputs + extras, pipeline="reference", dtype="float64")(**feeds)
    tm = TorchModel(model, feeds, "cpu", dtype=torch.float64, channels_last=channels_last, input_grad=True,
                    outputs=[model.output, *extras])
    y, *rest = tm.forward_outputs()
    got = [y, *tm.grads(y), *rest]
    names = ["output", *(p.name for p in model.params), "input", *(v.name for v in extras)]
    assert len(got) == len(want) == len(names)
    for name, g, w in zip(names, got, want):
        g, w = g.detach().numpy(), np.asarray(w)
        assert g.shape == w.shape and g.dtype == (w.dtype if w.dtype.kind != "f" else np.float64), name
        scale = max(float(np.abs(w).max(initial=0.0)), 1e-300)
        np.testing.assert_allclose(g, w, rtol=1e-8, atol=1e-8 * scale, err_msg=f"{case}: {name}")


def test_running_statistics_are_updated_inside_batch_norm(monkeypatch):
    """Both running statistics fetched: one F.batch_norm call updates them (no
    separate formula runs); one fetched: the formula runs for it."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    from opgraph.benchmarks import peer_converters as pc
    from opgraph.benchmarks.peer_torch import TorchModel

    calls = []
    real = F.batch_norm
    monkeypatch.setattr(F, "batch_norm", lambda *a, **k: calls.append((a[1] is not None, k)) or real(*a, **k))
    formula = []
    monkeypatch.setitem(pc.CONVERTERS, "BatchNormRunningUpdate",
                        lambda *a: formula.append(a[1].statistic) or pc._running_update(*a))
    model, extras = CASES["norms"]()
    tm = TorchModel(model, feeds_of(model), "cpu", dtype=torch.float64, outputs=[model.output, *extras])
    tm.forward_outputs()
    with_running = [k for has, k in calls if has and k.get("training")]
    assert len(with_running) == 1 and with_running[0]["momentum"] == 0.3
    assert formula == ["mean"]  # bn2's mean only: its variance update is not computed at all
