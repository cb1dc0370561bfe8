"""The ``pool-scan`` fusion rule: one scan writes a max pooling's value and its winners.

``pool-argmax`` (``passes/fuse_pool_argmax.py``) leaves a pooling that saves
its winners as two kernels: ``idx = MaxPool2dArgmax(x)`` scans the windows
and writes 1-byte indices, then ``y = MaxPool2dTake(x, idx)`` reads ``x``
again at each winner. On the H200 (GoogLeNet bf16, 2026-12-04) the 13 takes
were 0.41 ms beside the 13 scans' 0.36 ms, and the take's second read of x
held it at 52 % of the copy bandwidth. A node has one output, so the scan
could not write both; this rule makes it write the second into a buffer its
input already is (``Op.fills``):

* ``idx`` becomes ``MaxPool2dArgmaxSlot(x)``, whose step only allocates the
  indices' buffer (same node, name and readers);
* ``y`` becomes ``MaxPool2dScan(x, idx)``, one kernel that writes y and fills
  ``idx`` with the argmax.

The gathers that read ``idx`` run after the scan: they read ``y``'s gradient,
so they descend from it. The rule applies when

* the take reads the argmax of its own ``x`` with the argmax's window, is not
  ``masked`` (a masked take is a second derivative's, reading indices the
  forward saved), and both run one algorithm that has rules for the two ops
  the policy does not exclude or decline, and the policy forces neither node
  elsewhere;
* every other reader of the indices descends from the take (so none reads
  the buffer before the scan fills it);
* the algorithm is not one of the CPU's oracles unless the policy opts in
  there (``include=['fused-reference']``, as for ``pool-argmax``): there
  the slot's kernel computes the argmax itself (its value), and the scan again.

The rule is a default (``exclude=['pool-scan']`` turns it off alone). It was
opt-in until its CUDA kernels (``pool_vector_lanes``' and
``pool_vector_tile_kernels``' ``scan`` kind), checked bit for bit against the
argmax and take kernels on the CPU's emulator
(``tests/backends/test_pool_scan_kernels.py``), had run on a GPU: on the H200
(2026-12-05) ``tests/gpu/test_pool_scan_gpu.py`` passed, and with it and
``relu-bias-sums`` bf16 whole-step times were equal or better on every model
(GoogLeNet -4.9 %, AlexNet -1.2 %, VGG-A -2.7 %), every per-node check passing.

Autotune times the scan's own variants (those of the argmax: ``vector``,
``pixels``, ``tile``); each candidate fills a poisoned copy of the slot,
checked against the argmax's reference (``passes/autotune_measure.py``).
"""

from __future__ import annotations

import networkx as nx

from opgraph.graph import Graph, NodeView
from opgraph.op import abstract_of
from opgraph.ops import MaxPool2dArgmax, MaxPool2dArgmaxSlot, MaxPool2dScan, MaxPool2dTake
from opgraph.ops.pool_indices import window_params

from .base import PassContext
from .fuse_elementwise import OPT_IN
from .fuse_pool_argmax import _oracle_without_opt_in
from .pattern import FusionRule, Match, Scope, forced_elsewhere, lowered_for, report_rewrite

NAME = "pool-scan"
LABEL = "max pooling(s) writing the value and the winners in one scan"


def _descends_from(graph: Graph, node: int, ancestor: int) -> bool:
    """Whether ``node`` reads, directly or not, ``ancestor``'s value."""
    return node != ancestor and nx.has_path(graph.nx, ancestor, node)


def match_pool_scan(scope: Scope, view: NodeView) -> Match | None:
    """A take reading its own x's argmax (module docstring); ``data`` the argmax's id."""
    op = abstract_of(view.op)
    algorithm = scope.algorithm(view.id)
    if type(op) is not MaxPool2dTake or op.masked or algorithm is None:
        return None
    x, idx = scope.graph.input_ids(view.id)
    argmax = scope.op(idx)
    if (not isinstance(argmax, MaxPool2dArgmax) or scope.algorithm(idx) != algorithm
            or scope.graph.input_ids(idx) != [x] or window_params(argmax) != window_params(op)):
        return None
    why = _oracle_without_opt_in(algorithm, scope.ctx)
    if why:
        scope.note(NAME, why, waits_for=OPT_IN)
        return None
    early = [r for r in scope.readers(idx) if r != view.id and not _descends_from(scope.graph, r, view.id)]
    if early:
        # e.g. the pooling is an output whose gradient is fed at run time: the gather reads the
        # fed gradient, not one computed from y, so nothing orders it after the scan
        scope.note(NAME, f"a reader of the winners ({scope.graph.node(early[0]).name}) does not read the "
                         "pooled value, directly or not (a pooling that is an output, its gradient fed), "
                         "so it could run before the scan writes them")
        return None
    return Match(view.id, (), LABEL, idx)


def fuse_pool_scan(graph: Graph, m: Match, ctx: PassContext) -> str | None:
    """Rewrite take ``m.root`` and argmax ``m.data`` (module docstring); returns
    None when done, else why not (then nothing changed)."""
    take, argmax = graph.node(m.root), graph.node(m.data)
    algorithm = take.op.algorithm
    why = forced_elsewhere(graph, take.id, [argmax.id], algorithm, ctx)
    if why:
        return why
    window, relu = window_params(abstract_of(take.op)), abstract_of(argmax.op).relu
    x = take.inputs[0]
    slot = lowered_for(MaxPool2dArgmaxSlot(**window, relu=relu), (x.type,), algorithm, ctx, {},
                       what="max-pool winners' slot")
    scan = lowered_for(MaxPool2dScan(**window, relu=relu), (x.type, argmax.type), algorithm, ctx, {},
                       what="max-pool scan writing value and winners")
    why = next((w for w in (slot, scan) if isinstance(w, str)), None)
    if why:
        return why
    graph.rewrite(argmax.id, slot, [x])
    report_rewrite(ctx, argmax.name, slot)
    graph.rewrite(take.id, scan, [x, graph.value(argmax.id)])
    report_rewrite(ctx, take.name, scan)
    return None


POOL_SCAN = FusionRule(NAME, match_pool_scan, fuse_pool_scan)

__all__ = ["NAME", "LABEL", "match_pool_scan", "fuse_pool_scan", "POOL_SCAN"]
