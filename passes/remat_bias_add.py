"""The ``bias-remat`` fusion rule: a bias add read by several element-wise
nodes is recomputed for each of them but one, so that every reader's fused
chain takes the add in and its output is never written.

A linear layer imported from ONNX is ``MatMul`` then ``Add`` of its bias
(a ``BroadcastAdd``: ``(N, H, W, C) + (C,)``), and ConvNeXt's first linear
layer of each block feeds a GELU: ``z = BroadcastAdd(m, b)``, ``y =
Gelu(z)``. GELU's gradient reads its input, so ``z`` is read twice: by the
GELU in the forward and by ``GeluBackward(z, gy)`` in the backward. The
``elementwise`` rule fuses a chain only through values nobody else reads, so
``z`` was written by one kernel and read back by the GELU's: on the H100 in
bf16 at batch 128 (2026-12-06, ``docs/results/h100-2026-12-06b/``) ConvNeXt-tiny's
36 bias adds took 2.67 of its 56.2 ms of steps, 2.11 of them the 18 of the
first linear layers (616 MB a step in stage 1).

The rule gives each reader of ``z`` after the first (in the scope's order:
the forward's reader keeps ``z``) its own ``z' = z``'s op on ``z``'s inputs,
a new node named ``<z>/remat`` (not forceable) on ``z``'s algorithm. Then
``elementwise`` fuses ``z`` into the GELU (read ``m`` and the bias, write
``y``) and ``z'`` into the gradient (read ``m``, the bias and ``gy``, write
the input gradient): one full-tensor write and one read fewer per bias add,
a kernel launch fewer, and ``m`` kept to the backward instead of ``z`` (the
same size: no more memory). This is Chen et al. 2016, "Training deep nets with
sublinear memory cost", recomputation in the backward, and Inductor's
partitioner recomputes such cheap element-wise producers the same way; it is
``bn-apply-remat``'s rewrite (``passes/remat_bn_apply.py``) for an add.

A reader ``g`` is rewritten when

* ``z`` is a ``BroadcastAdd`` or a ``BiasAdd``, no output, at most one of
  whose operands has as many elements as ``z`` (the copy then reads what
  reading ``z`` would, plus a broadcast operand; an add of two full tensors
  would read twice as much);
* every reader of ``z`` may join a fused chain (``fuse_elementwise.ends_chain``),
  there are at least two, all on ``z``'s algorithm, and ``g`` is one of them,
  not the first and no output;
* that algorithm's fused chains are made (``fuse_elementwise.fusable``:
  ``codegen`` on cuda; the oracle only with ``include=['fused-reference']``,
  without which the rule is reported as waiting for that opt-in, as the
  element-wise rules are), the policy excludes neither this rule nor
  ``elementwise`` (else the match is noted, not made), and its
  ``FusedElementwise`` rule accepts ``z`` with each of its readers: where one
  reader could not take it in, ``z`` would still be written, and its operand
  ``m`` kept beside it for the copies: more memory for the same traffic.

Numbers: a copy computes ``z`` in fp32 inside its chain, as the forward's
fused chain does, without the rounding to the storage dtype that a written
``z`` had; the per-node check holds each chain to its members' float64
kernels on the operands it was fed (``benchmarks/check.py``).
"""

from __future__ import annotations

import math

from opgraph.graph import Graph, NodeView
from opgraph.ops import BiasAdd, BroadcastAdd

from .base import PassContext
from .fuse_elementwise import OPT_IN, chains_declined, declines, ends_chain, oracle_waits
from .pattern import FusionRule, Match, Scope, add_lowered

NAME = "bias-remat"
LABEL = "bias add(s) recomputed for an element-wise reader"
#: The ops whose output the rule recomputes.
ADDS = (BiasAdd, BroadcastAdd)


def _cheap_to_recompute(scope: Scope, z: int) -> bool:
    """Whether recomputing add ``z`` reads no more than reading it: at most one
    operand with as many elements as ``z`` (module docstring)."""
    size = math.prod(scope.graph.node(z).type.shape)
    full = [u for u in scope.graph.input_ids(z) if math.prod(scope.graph.node(u).type.shape) >= size]
    return len(full) <= 1


def match_bias_remat(scope: Scope, view: NodeView) -> Match | None:
    """A reader ``view`` of a bias add that its first reader's chain could
    otherwise take in (module docstring); ``data``: the add's node id and its
    readers in the scope's order. Where no chain would be made, the rule is
    noted instead (on the CPU's oracle as waiting for the opt-in)."""
    if scope.is_output(view.id) or not ends_chain(scope.op(view.id)):
        return None
    for z in dict.fromkeys(scope.graph.input_ids(view.id)):
        if not isinstance(scope.op(z), ADDS) or scope.is_output(z) or not _cheap_to_recompute(scope, z):
            continue
        readers = scope.sorted(scope.readers(z))
        algorithm = scope.algorithm(z)
        if (len(readers) < 2 or readers[0] == view.id or algorithm is None
                or any(scope.algorithm(u) != algorithm or not ends_chain(scope.op(u)) for u in readers)):
            continue
        why = chains_declined(scope.ctx, algorithm)
        if why:  # noted once for the rule, as the element-wise rules note it (the CPU's oracle: an opt-in)
            scope.note(NAME, f"no fused chain would take the add in: {why}",
                       waits_for=OPT_IN if oracle_waits(scope.ctx, algorithm) else None)
            return None
        return Match(view.id, (), LABEL, (z, tuple(readers)))
    return None


def remat_bias_add(graph: Graph, m: Match, ctx: PassContext) -> str | None:
    """Give reader ``m.root`` its own copy of the add in ``m.data``; returns
    None when done, else why not (then nothing changed)."""
    z, readers = m.data
    node = graph.node(z)
    for reader in readers:
        why = declines(graph, [z, reader], node.op.algorithm, ctx)
        if why:
            return f"{graph.node(reader).name} would not take it into its chain: {why}"
    copy = add_lowered(graph, node.op, node.inputs, f"{node.name}/remat", ctx)
    root = graph.node(m.root)
    graph.rewrite(m.root, root.op, [copy if v.node == z else v for v in root.inputs])
    return None


BIAS_REMAT = FusionRule(NAME, match_bias_remat, remat_bias_add)


__all__ = ["NAME", "LABEL", "ADDS", "match_bias_remat", "remat_bias_add", "BIAS_REMAT"]
