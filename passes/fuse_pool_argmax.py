"""The ``pool-argmax`` fusion rule: a max pooling saves its winners for its gradient.

A max-pool gradient, ``MaxPool2dBackward(x, gy)`` (or the fuse pass's
``MaxPool2dBackwardRelu``), finds every window's winner by scanning ``x``
again: on the H200 that scan was half the gradient's time and as long as the
forward pooling (GoogLeNet bf16, 2026-12-04: forward 1.03 ms, gradient 2.23
ms). Where the forward ``y = MaxPool2d(x)`` is in the graph, the rule writes
the three ops of ``opgraph/ops/pool_indices.py`` instead:

* ``idx = MaxPool2dArgmax(x)``, a new node ``<y>/argmax`` (with ``relu`` when
  the gradient was ``MaxPool2dBackwardRelu``: the ReLU mask goes into the
  index's mark);
* ``y`` becomes ``MaxPool2dTake(x, idx)``, ``x`` read once more at each
  window's winner;
* the gradient becomes ``MaxPool2dBackwardIndices(idx, gy)`` (``masked`` for
  the ReLU form), a gather that does not read ``x``.

So the window scan runs once per step, not twice, and the gradient no longer
keeps ``x`` alive. A second gradient of the same pooling (two losses, a double
backward) reads the saved winners too, when they carry the mark its form
needs. The rule applies when

* the gradient and the pooling read the same ``x`` with the same window
  (kernel, stride, padding, ceil mode) and are lowered to one algorithm,
  which has rules for the three ops the policy does not exclude;
* the window has at most 128 cells (the index's 7 bits);
* the algorithm is not one of the CPU's oracles, unless the policy opts in
  (``include=['fused-reference']``, as for the ``elementwise`` rule): there
  the scan is NumPy's, and the take and gather add passes.

It runs after ``pool-relu-backward`` (which makes the ReLU form) and before
autotune, which then times each new node's own variants.
"""

from __future__ import annotations

from opgraph.graph import Graph, NodeView
from opgraph.op import abstract_of
from opgraph.ops import (MaxPool2d, MaxPool2dArgmax, MaxPool2dBackward, MaxPool2dBackwardIndices,
                         MaxPool2dBackwardRelu, MaxPool2dTake)
from opgraph.ops.pool_indices import MAX_CELLS, window_params

from .base import PassContext
from .fuse_elementwise import OPT_IN, OPT_IN_HINT, oracle_waits
from .pattern import FusionRule, Match, Scope, add_lowered, lowered_for, report_rewrite

NAME = "pool-argmax"
LABEL = "max pooling(s) saving their winners for the gradient"


def _forward_of(scope: Scope, gradient: int) -> tuple[int, int | None] | None:
    """``(forward, idx)``: the ``MaxPool2d`` node reading the gradient's ``x`` with
    its window on its algorithm (``idx`` None), or, where an earlier match
    rewrote it (a second gradient of the same pooling: two losses, a double
    backward), the ``MaxPool2dTake`` there and the argmax it reads, when that
    argmax serves this gradient (the ReLU form needs the mark; the plain form
    strips it). Equal algorithms also keep a node the policy forces elsewhere
    out of a match: the rewrite keeps each node's algorithm."""
    x = scope.graph.input_ids(gradient)[0]
    window, algorithm = window_params(scope.op(gradient)), scope.algorithm(gradient)
    relu = isinstance(scope.op(gradient), MaxPool2dBackwardRelu)
    for reader in scope.readers(x):
        op = scope.op(reader)
        if not hasattr(op, "kernel_size") or scope.algorithm(reader) != algorithm or window_params(op) != window:
            continue
        if isinstance(op, MaxPool2d):
            return reader, None
        if isinstance(op, MaxPool2dTake):
            idx = scope.graph.input_ids(reader)[1]
            argmax = scope.op(idx)
            if isinstance(argmax, MaxPool2dArgmax) and (argmax.relu or not relu):
                return reader, idx
    return None


def _oracle_without_opt_in(algorithm: str, ctx: PassContext) -> str | None:
    """Why the rule leaves a pooling on ``algorithm`` alone (the CPU's oracle, not opted in), or None."""
    if oracle_waits(ctx, algorithm):
        return (f"on {algorithm} the take and the gather are passes more than NumPy's one scan saves; "
                f"{OPT_IN_HINT}")
    return None


def match_pool_argmax(scope: Scope, view: NodeView) -> Match | None:
    """A max-pool gradient whose forward pooling is in the graph (module docstring)."""
    op = abstract_of(view.op)
    if type(op) not in (MaxPool2dBackward, MaxPool2dBackwardRelu) or scope.algorithm(view.id) is None:
        return None
    if op.kernel_size[0] * op.kernel_size[1] > MAX_CELLS:
        scope.note(NAME, f"a window of over {MAX_CELLS} cells")
        return None
    why = _oracle_without_opt_in(scope.algorithm(view.id), scope.ctx)
    if why:  # no match rather than a declined one: a CPU run's fusion line would count every pooling
        scope.note(NAME, why, waits_for=OPT_IN)
        return None
    found = _forward_of(scope, view.id)
    if found is None:
        return None
    forward, idx = found
    return Match(view.id, (), LABEL, found, rewired=(forward,) if idx is None else ())


def fuse_pool_argmax(graph: Graph, m: Match, ctx: PassContext) -> str | None:
    """Rewrite gradient ``m.root`` and pooling ``m.data`` (module docstring);
    returns None when done, else why not (then nothing changed)."""
    gradient, forward = graph.node(m.root), graph.node(m.data[0])
    saved = m.data[1]
    algorithm = gradient.op.algorithm
    abstract = abstract_of(gradient.op)
    relu = isinstance(abstract, MaxPool2dBackwardRelu)
    x, gy = gradient.inputs
    window = window_params(abstract)
    argmax_op = MaxPool2dArgmax(**window, relu=relu)
    idx_type = argmax_op.infer(x.type)
    gather = lowered_for(MaxPool2dBackwardIndices(**window, masked=relu, input_shape=x.shape),
                         (idx_type, gy.type), algorithm, ctx, {}, what="max-pool gather kernel")
    if isinstance(gather, str):
        return gather
    if saved is None:  # else the pooling saves its winners already: only the gradient changes
        argmax = lowered_for(argmax_op, (x.type,), algorithm, ctx, {}, what="max-pool argmax kernel")
        take = lowered_for(MaxPool2dTake(**window), (x.type, idx_type), algorithm, ctx, {},
                           what="max-pool take kernel")
        why = next((w for w in (argmax, take) if isinstance(w, str)), None)
        if why:
            return why
        saved = add_lowered(graph, argmax, [x], f"{forward.name}/argmax", ctx).node
        graph.rewrite(forward.id, take, [x, graph.value(saved)])
        report_rewrite(ctx, forward.name, take)
    graph.rewrite(gradient.id, gather, [graph.value(saved), gy])
    report_rewrite(ctx, gradient.name, gather)
    return None


POOL_ARGMAX = FusionRule(NAME, match_pool_argmax, fuse_pool_argmax)

__all__ = ["NAME", "LABEL", "match_pool_argmax", "fuse_pool_argmax", "POOL_ARGMAX"]
