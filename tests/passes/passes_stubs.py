"""Stub ops, rules and timers for the pass tests (imported by the test modules).

``Scale`` is a dummy abstract op (``y = 2 x``) whose rules are registered in
the global registry under a type nobody else uses, so they cannot leak into
other tests. Conv stubs are installed per test with ``monkeypatch`` and
removed afterwards.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import numpy as np

from opgraph.op import Op
from opgraph.backends import registry
from opgraph.backends.registry import Rule


@attrs.frozen
class Scale(Op):
    """Dummy op: ``y = 2 * x`` (any shape)."""

    kind: ClassVar[str] = "scale"

    def infer(self, x):
        return x


def _twice(ctx, op, x):
    return 2 * x


def _wrong(ctx, op, x):
    return 2 * x + 1


def _nan(ctx, op, x):
    return x * np.nan


def _boom(ctx, op, x):
    raise RuntimeError("kernel exploded")


SCALE_RULES = {
    "reference": Rule(Scale, "reference", _twice, tags={"reference"}),
    "fast": Rule(Scale, "fast", _twice),
    "slow": Rule(Scale, "slow", _twice),
    "wrong": Rule(Scale, "wrong", _wrong),
    "nan": Rule(Scale, "nan", _nan),
    "boom": Rule(Scale, "boom", _boom),
    "big": Rule(Scale, "big", _twice, workspace=lambda op, types, options: 10**9),
    "tiles": Rule(Scale, "tiles", _twice, variants=lambda op, types, dev: [{"t": 1}, {"t": 2}]),
    "extra": Rule(Scale, "extra", _twice, tags={"optional"}),
}


def install_scale_rules(monkeypatch, names):
    """Register exactly the Scale rules ``names`` for this test."""
    registry.rules_for(Scale)  # load the backends first
    monkeypatch.setitem(registry._RULES, Scale, {n: SCALE_RULES[n] for n in names})


def install_rule(monkeypatch, op_type, rule: Rule):
    """Add ``rule`` for ``op_type`` for this test only."""
    table = dict(registry.rules_for(op_type))
    table[rule.algorithm] = rule
    monkeypatch.setitem(registry._RULES, op_type, table)


class StubTimer:
    """Answers known times per candidate label; counts its calls."""

    def __init__(self, times_ms: dict[str, float], default_ms: float = 100.0):
        self.times_ms, self.default_ms = times_ms, default_ms
        self.calls: list[str] = []

    def measure(self, fn, *, label, warmup, repeats):
        self.calls.append(label)
        fn()
        return [self.times_ms.get(label, self.default_ms) / 1e3] * repeats


def _accept(op, in_types, device):
    """cuDNN's check without the GPU: what it declines on any machine (its
    ``static_reason``: dtypes, layouts, a strided fused backward-data)."""
    from opgraph.backends.cuda.cudnn_rules import static_reason
    return static_reason(op, in_types)


def cudnn_accepts(monkeypatch):
    """Every ``cudnn`` rule of the conv family with its check stubbed to accept
    what a GPU would (the real one needs a GPU and the frontend): kernel, tags, variants and
    workspace are the real rule's, so a compile for cuda on this machine
    surveys, legalizes, lowers and fuses as it would on the GPU (without
    autotune, which would run kernels)."""
    from opgraph import ops

    for op_type in ops.of_family("conv"):
        rule = registry.rules_for(op_type).get("cudnn")
        if rule is not None:
            install_rule(monkeypatch, op_type, attrs.evolve(rule, check=_accept))


def compile_for_cuda(outputs, policy=None, dtype=None):
    """The default pipeline for ``device='cuda'`` on this machine, no GPU needed
    (``og.compile`` would resolve the device and refuse), under compile's
    ``dtype`` override (None: the declared dtypes): returns the lowered
    graph, its outputs and the report. The cuda rules whose check needs a GPU
    must be stubbed first (:func:`cudnn_accepts`); our CuPy kernels' rules
    check dtypes only."""
    from opgraph.graph import graph_of
    from opgraph.passes.base import PassContext
    from opgraph.passes.pipelines import build
    from opgraph.passes.policy import LoweringPolicy

    policy = policy or LoweringPolicy()
    ctx = PassContext(device="cuda", policy=policy, dtype=dtype)
    graph, outs = build("default", policy).run(graph_of(*outputs), list(outputs), ctx)
    return graph, outs, ctx.report
