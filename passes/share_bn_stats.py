"""The ``bn-stats-parts`` rule: the batch statistics of a channel concat are the
concat of its parts' statistics, each computed once.

A training batch norm's statistics are per channel (``BatchNormStats``: the
mean and biased variance of each channel over ``N * H * W`` values;
``opgraph/ops/batchnorm_training.py``), so for ``x = Concat(a, b, ...)`` along
the channel axis::

    BatchNormStats(Concat(a, b, ...)) == Concat(BatchNormStats(a), BatchNormStats(b), ...)   (axis 1)

DenseNet's dense layers each normalise the concatenation of every earlier
feature map of their block (Huang et al. 2017, section 3; torchvision's
``bn_function``), so without the rule every layer reads all earlier features
again for its statistics: DenseNet-121 at batch 64 reads about 1 GB per step
for statistics where each feature map read once is about 0.1 GB
(docs/performance.md, sixth session). With it, each feature map's statistics
are computed once, by one ``BatchNormStats`` node reading that part (a node
that already computes them, such as the first layer's, which reads the block
input alone, is shared), and each layer's statistics are a ``Concat`` of them.
The zero-copy plan (``passes/zero_copy.py``) then writes every part's
statistics into its columns of the block's last concat (the transition's
statistics) and makes each layer's a prefix view of it: no statistics are
copied, and the generated kernels read a view's rows at its pitch
(``backends/cuda/codegen/contexts.RowPitch``).

A ``BatchNormStats`` node is rewritten when its input is a ``Concat`` of two or
more values along axis 1, the statistics node is not an output and the policy
does not force it (a forced node keeps the kernel asked for), and its
algorithm has a rule for
``BatchNormStats`` of each part and for the ``Concat`` (``codegen`` on cuda,
``reference`` on the CPU) that the policy does not exclude and that does not
decline. The node keeps its id and name and computes the ``Concat``; a part's
new statistics node is named ``<part>/batch-stats`` (not forceable). Every node is
checked against the float64 reference as any lowering is. The rule moves no
computation into a fused op; ``exclude=['fused']`` turns it off with the
rest of the table, as ``exclude=['bn-stats-parts']`` does alone.
"""

from __future__ import annotations

from opgraph.graph import Graph, NodeView
from opgraph.op import abstract_of
from opgraph.ops import BatchNormStats, Concat

from .base import PassContext
from .pattern import FusionRule, Match, Scope, add_lowered, forced_onto, lowered_for, report_rewrite

NAME = "bn-stats-parts"
LABEL = "batch statistics of a channel concat computed per part"


def _existing_stats(scope: Scope, part: int, algorithm: str) -> int | None:
    """A ``BatchNormStats`` node of ``part`` on ``algorithm`` already in the
    scope (the first in graph order), to share."""
    found = [u for u in scope.readers(part)
             if isinstance(scope.op(u), BatchNormStats) and scope.algorithm(u) == algorithm]
    return scope.sorted(found)[0] if found else None


def match_bn_stats_parts(scope: Scope, view: NodeView) -> Match | None:
    """A ``BatchNormStats`` node of a channel ``Concat`` of several values, no
    output (module docstring); the match's data is ``(concat node id, the
    statistics node of each part already in the scope or None)``."""
    if not isinstance(abstract_of(view.op), BatchNormStats) or scope.is_output(view.id):
        return None
    (source,) = scope.graph.input_ids(view.id)
    op, algorithm = scope.op(source), scope.algorithm(view.id)
    parts = scope.graph.input_ids(source)
    if not isinstance(op, Concat) or len(parts) < 2 or algorithm is None:
        return None
    if op.axis % scope.graph.node(source).type.ndim != 1:
        return None
    return Match(view.id, (), LABEL, (source, tuple(_existing_stats(scope, p, algorithm) for p in parts)))


def share_bn_stats(graph: Graph, m: Match, ctx: PassContext) -> str | None:
    """Rewrite one match (module docstring); returns None when done, else why
    not (then nothing changed: every new node's lowering is settled first)."""
    if "fused" in ctx.policy.exclude:
        return "excluded by policy (exclude=['fused'])"
    stats = graph.node(m.root)
    algorithm = stats.op.algorithm
    forced = forced_onto(ctx, stats.name)
    if forced is not None:
        return f"{stats.name} is forced to {forced}: it keeps its own kernel"
    options = {k: v for k, v in stats.op.options if k != "engine"}
    source, existing = m.data
    parts = graph.node(source).inputs
    planned = {}
    for k, (part, shared) in enumerate(zip(parts, existing)):
        if shared is None:
            planned[k] = lowered_for(BatchNormStats(), (part.type,), algorithm, ctx, options,
                                     "batch statistics kernel")
            if isinstance(planned[k], str):
                return planned[k]
    types = [planned[k].op.infer(part.type) if k in planned else graph.node(shared).type
             for k, (part, shared) in enumerate(zip(parts, existing))]
    concat = lowered_for(Concat(axis=1), types, algorithm, ctx, {}, "concat kernel")
    if isinstance(concat, str):
        return concat
    made: dict = {}  # part node id -> its new statistics (a value concatenated twice: once)
    inputs = []
    for k, (part, shared) in enumerate(zip(parts, existing)):
        if k not in planned:
            inputs.append(graph.value(shared))
            continue
        if part.node not in made:
            made[part.node] = add_lowered(graph, planned[k], [part], f"{part.name}/batch-stats", ctx)
        inputs.append(made[part.node])
    graph.rewrite(m.root, concat, inputs)
    report_rewrite(ctx, stats.name, concat)
    return None


BN_STATS_PARTS = FusionRule(NAME, match_bn_stats_parts, share_bn_stats)


__all__ = ["NAME", "LABEL", "match_bn_stats_parts", "share_bn_stats", "BN_STATS_PARTS"]
