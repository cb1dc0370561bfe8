"""Passes and pipelines.

A pass is a named pure function ``Graph -> Graph``: :meth:`Pass.__call__`
hands :meth:`Pass.run` a *copy* of the graph (``Graph.copy`` keeps node ids),
so a pass may rewrite what it gets freely and the caller's graph never
changes. ``run(graph, outputs, ctx)`` receives the outputs as values of that
copy and returns the rewritten graph.

Contract on outputs: a pass keeps the node ids of the requested outputs
valid (a rewrite that replaces an output node reuses its id, as the legalize
pass does), so the outputs of the result are ``[result.value(v.node) for v in
outputs]`` (:func:`map_values`). The pipeline checks this after every pass.

A :class:`Pipeline` is an explicit list of passes run in order; it records
the wall time of each in ``ctx.report.passes``. Named pipelines live in
``passes/pipelines.py``.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import attrs

from opgraph.errors import OpgraphError
from opgraph.graph import Graph, Value

from .policy import LoweringPolicy
from .report import LoweringReport


def host_versions() -> dict[str, str | None]:
    """opgraph, NumPy and Python versions and the processor: the CPU part of
    autotune cache keys."""
    import platform

    import numpy

    import opgraph

    return {"opgraph": opgraph.__version__, "numpy": numpy.__version__,
            "python": platform.python_version(), "processor": platform.processor() or platform.machine()}


def host_name() -> str:
    """The CPU's name and core count (autotune cache keys on cpu)."""
    import os
    import platform

    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


@attrs.define
class PassContext:
    """What every pass of one compile shares.

    Attributes:
        device: ``'cpu'`` or ``'cuda'``.
        policy: the :class:`LoweringPolicy` (the lower/autotune passes read it).
        dtype: the compile-time floating dtype override (``None``: declared).
        report: the :class:`LoweringReport` the passes fill in.
        xp: array module of ``device`` (autotune runs kernels on it).
        timer: autotune's timer (``passes.autotune_timers.Timer``); ``None`` = the
            device's default (perf_counter on cpu, CUDA events on cuda).
        versions: ``() -> dict`` of library versions, part of autotune cache
            keys (the registry's ``device_support().versions`` plugs in here on cuda).
        device_name: ``() -> str``, the device's name for cache keys.
        warmup, repeats: autotune timing protocol per candidate (after an
            untimed check run and one timed run; see ``passes/autotune.py``).
        seed: seed of the random inputs autotune runs candidates on.
        aliases: node name -> the name ``policy.force`` keys are matched
            against (``None``: not forceable); set by the legalize pass for
            the nodes it creates or repurposes.
        surveys: each node's candidate survey, kept by
            ``passes.candidates.survey_node`` (keyed by the node's state and
            the policy) so that a node is surveyed once per compile.
    """

    device: str = "cpu"
    policy: LoweringPolicy = attrs.field(factory=LoweringPolicy)
    dtype: str | None = None
    report: LoweringReport = attrs.field(factory=LoweringReport)
    xp: Any = None
    timer: Any = None
    versions: Callable[[], dict] = host_versions
    device_name: Callable[[], str] = host_name
    warmup: int = 1
    repeats: int = 5
    seed: int = 0
    aliases: dict[str, str | None] = attrs.field(factory=dict)
    surveys: dict = attrs.field(factory=dict)

    def __attrs_post_init__(self):
        if self.xp is None and self.device == "cpu":
            import numpy
            self.xp = numpy
        self.report.device = self.device
        self.report.policy = self.policy.to_dict()


def map_values(graph: Graph, outputs: Sequence[Value]) -> list[Value]:
    """``outputs`` (values of any copy of ``graph``) as values of ``graph``.

    Raises:
        OpgraphError: an output node no longer exists in ``graph``.
    """
    try:
        return [graph.value(v.node) for v in outputs]
    except KeyError as e:
        raise OpgraphError(f"output node lost by a rewrite: {e}") from None


class Pass:
    """A named graph rewrite. Subclasses set ``name`` and implement ``run``."""

    name: str = "pass"

    def run(self, graph: Graph, outputs: list[Value], ctx: PassContext) -> Graph:  # pragma: no cover
        raise NotImplementedError

    def __call__(self, graph: Graph, outputs: Sequence[Value], ctx: PassContext) -> Graph:
        """Run on a copy of ``graph``; ``graph`` itself is never modified."""
        g = graph.copy()
        return self.run(g, map_values(g, outputs), ctx)

    def __repr__(self) -> str:
        return f"<Pass {self.name}>"


class FunctionPass(Pass):
    """A pass from a plain function ``fn(graph, outputs, ctx) -> graph``."""

    def __init__(self, name: str, fn: Callable[[Graph, list[Value], PassContext], Graph]):
        self.name, self.fn = name, fn
        self.__doc__ = fn.__doc__

    def run(self, graph, outputs, ctx):
        return self.fn(graph, outputs, ctx)


def graph_pass(name: str):
    """Decorator: ``@graph_pass('fuse')`` over ``fn(graph, outputs, ctx)``."""
    return lambda fn: FunctionPass(name, fn)


class Pipeline:
    """An explicit, ordered list of passes.

    Args:
        name: reported as ``report.pipeline``.
        passes: run in this order, each on the previous one's result.
    """

    def __init__(self, name: str, passes: Sequence[Pass]):
        self.name, self.passes = name, list(passes)

    def run(self, graph: Graph, outputs: Sequence[Value], ctx: PassContext) -> tuple[Graph, list[Value]]:
        """Run every pass; returns the final graph and the outputs in it.

        Raises:
            Whatever a pass raises (``LoweringError`` ...); ``OpgraphError``
            if a pass dropped an output node.
        """
        ctx.report.pipeline = self.name
        for p in self.passes:
            t0 = time.perf_counter()
            graph = p(graph, outputs, ctx)
            ctx.report.passes.append((p.name, time.perf_counter() - t0))
            try:
                outputs = map_values(graph, outputs)
            except OpgraphError as e:
                raise OpgraphError(f"pass {p.name}: {e}") from None
        return graph, outputs

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.passes]

    def __repr__(self) -> str:
        return f"<Pipeline {self.name}: {' -> '.join(self.names)}>"


__all__ = ["Pass", "FunctionPass", "graph_pass", "Pipeline", "PassContext", "map_values", "host_versions",
           "host_name"]
