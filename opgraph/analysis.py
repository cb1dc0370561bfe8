"""Static per-node analysis: parameters, forward FLOPs, activation bytes.

Nothing here runs a kernel: every number follows from the op parameters and
the inferred types, so a summary of VGG-A at batch 128 costs milliseconds.

Conventions (those of convnet-benchmarks and of
``shared/specs/imagenet_winners.json``):

* FLOPs count a multiply-add as 2 and come from each op's own
  ``Op.flops(input_types, output_type)``; a bias add is not counted by the
  convolution and linear ops, pooling and element-wise ops count 0 unless
  their op says otherwise;
* the parameters of a node are the elements of its inputs that are ``param``
  sources (``opgraph.op.Source`` with ``role == 'param'``): a convolution
  with bias owns ``O*C/G*kH*kW + O``;
* activation bytes are the bytes of the node's output buffer; the sum over
  all nodes of a model is what a framework without buffer reuse allocates
  (the Torch seed did, except for its in-place ReLUs).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import attrs

from .graph import Graph, NodeView, Value
from .op import Lowered, Source, abstract_of


@attrs.frozen
class LayerRow:
    """One node of a summary.

    Attributes:
        id: node id in the graph.
        name: node name (e.g. ``'conv1'``, ``'inception_3a/1x1'``).
        op: abstract op class name (``'Conv2d'``), also for lowered nodes.
        detail: the op with its parameters, ``Conv2d(stride=4, padding=2, ...)``.
        algorithm: the lowering of a ``Lowered`` node, else ``None``.
        shape: output shape (batch first).
        dtype: output dtype name.
        params: parameter elements read by the node (weights and biases).
        flops: forward FLOPs of the node for the whole batch (multiply-add = 2).
        out_bytes: bytes of the output buffer.
        param_bytes: bytes of the parameters counted in ``params``.
        role: ``'input'``/``'param'``/``'grad'``/``'buffer'`` for a source node,
            else ``None``. Buffers (running statistics) are not parameters.
    """

    id: int
    name: str
    op: str
    detail: str
    algorithm: str | None
    shape: tuple[int, ...]
    dtype: str
    params: int
    flops: int
    out_bytes: int
    param_bytes: int
    role: str | None = None

    @property
    def gflop(self) -> float:
        """Forward GFLOP (1e9 FLOPs) of the node for the whole batch."""
        return self.flops / 1e9

    def as_dict(self) -> dict:
        """Plain-JSON form (shape as a list, ``gflop`` added)."""
        d = attrs.asdict(self)
        d["shape"] = list(self.shape)
        d["gflop"] = self.gflop
        return d


@attrs.frozen
class Totals:
    """Sums over the rows of a summary.

    Attributes:
        layers: number of rows (op nodes, sources excluded).
        params: parameter elements (each parameter counted once, even if read
            by several nodes).
        flops: forward FLOPs for the whole batch.
        activation_bytes: sum of all output buffers (no reuse).
        param_bytes: bytes of the parameters.
        input_bytes: bytes of the graph inputs the outputs depend on.
        peak_bytes: peak of live activations when nodes run in topological
            order and each buffer is freed after its last reader (no in-place
            update, no reuse planning; sources excluded); see
            :func:`peak_live_bytes`.
    """

    layers: int
    params: int
    flops: int
    activation_bytes: int
    param_bytes: int
    input_bytes: int
    peak_bytes: int

    @property
    def gflop(self) -> float:
        return self.flops / 1e9

    def as_dict(self) -> dict:
        d = attrs.asdict(self)
        d["gflop"] = self.gflop
        return d


def _is_source(node: NodeView, role: str | None = None) -> bool:
    op = node.op
    return isinstance(op, Source) and (role is None or op.role == role)


def _param_inputs(node: NodeView) -> list[Value]:
    """Distinct ``param`` sources read by ``node``, in input order."""
    seen, out = set(), []
    for v in node.inputs:
        src = v.graph.node(v.node)
        if _is_source(src, "param") and v.node not in seen:
            seen.add(v.node)
            out.append(v)
    return out


def node_params(node: NodeView) -> int:
    """Parameter elements read by ``node``: sum of the sizes of its inputs that
    are ``param`` sources (0 for a source node itself)."""
    if _is_source(node):
        return 0
    return sum(v.type.size for v in _param_inputs(node))


def node_flops(node: NodeView) -> int:
    """Forward FLOPs of ``node`` from its op's ``flops`` rule (multiply-add = 2).

    Sources cost 0. For a ``Lowered`` node the abstract op's count is used, so
    every lowering of a layer reports the same work (the rate then compares
    algorithms fairly, as convnet-benchmarks did for FFT convolution).
    """
    if _is_source(node):
        return 0
    op = abstract_of(node.op)
    return int(op.flops(node.input_types, node.type))


def analyze_node(node: NodeView) -> LayerRow:
    """All static figures of one node as a :class:`LayerRow`."""
    op = node.op
    params = _param_inputs(node) if not _is_source(node) else []
    return LayerRow(
        id=node.id,
        name=node.name,
        op=abstract_of(op).name,
        detail=op.describe(),
        algorithm=op.algorithm if isinstance(op, Lowered) else None,
        shape=tuple(node.type.shape),
        dtype=node.type.dtype,
        params=sum(v.type.size for v in params),
        flops=node_flops(node),
        out_bytes=node.type.nbytes,
        param_bytes=sum(v.type.nbytes for v in params),
        role=op.role if isinstance(op, Source) else None,
    )


def summarize(graph: Graph, outputs: Sequence[Value] | None = None, *,
              include_sources: bool = False) -> list[LayerRow]:
    """One :class:`LayerRow` per node, in the graph's topological order.

    Args:
        graph: the graph to analyse.
        outputs: restrict to these values and their ancestors (default: all
            nodes).
        include_sources: also list inputs and parameters (0 FLOPs, 0 params;
            their own size shows in ``out_bytes``).

    Returns:
        Rows in deterministic topological order (ties broken by node id, so
        the order in which the model code added the nodes).
    """
    return [analyze_node(n) for n in graph.nodes_in_order(outputs)
            if include_sources or not _is_source(n)]


def peak_live_bytes(graph: Graph, outputs: Sequence[Value]) -> int:
    """Peak bytes of live activations over one forward run in topological order.

    A node's output is allocated when it runs and freed right after its last
    reader ran; the requested ``outputs`` live to the end. Sources (inputs,
    parameters) are excluded. No output is written in place here, so the
    memory pass (``passes/memory.py``, which lets element-wise steps write
    into inputs that die there) can only do better; without workspace and
    without in-place steps it reports the same liveness peak.
    """
    order = list(graph.nodes_in_order(outputs))
    keep = {v.node for v in outputs}
    last_use: dict[int, int] = {}
    for i, n in enumerate(order):
        for v in n.inputs:
            last_use[v.node] = i
    frees: dict[int, list[int]] = {}
    for node_id, i in last_use.items():
        if node_id not in keep:
            frees.setdefault(i, []).append(node_id)
    live = peak = 0
    size = {n.id: (0 if _is_source(n) else n.type.nbytes) for n in order}
    for i, n in enumerate(order):
        live += size[n.id]
        peak = max(peak, live)
        for node_id in frees.get(i, ()):
            live -= size[node_id]
    return peak


def totals(rows: Iterable[LayerRow], graph: Graph | None = None,
           outputs: Sequence[Value] | None = None) -> Totals:
    """Sum ``rows`` into :class:`Totals`.

    Parameters read by several nodes count once (by source id). With
    ``graph`` and ``outputs`` the input bytes and the live peak are computed
    too; otherwise they are 0.
    """
    rows = list(rows)
    params = param_bytes = input_bytes = peak = 0
    if graph is not None:
        ids = {r.id for r in rows}
        seen: set[int] = set()
        for node in graph.nodes_in_order(outputs):
            if node.id not in ids:
                continue
            for v in _param_inputs(node):
                if v.node not in seen:
                    seen.add(v.node)
                    params += v.type.size
                    param_bytes += v.type.nbytes
        scope = graph.ancestors(outputs) if outputs is not None else None
        input_bytes = sum(s.type.nbytes for s in graph.sources("input")
                          if scope is None or s.id in scope)
        if outputs is not None:
            peak = peak_live_bytes(graph, outputs)
    else:
        params = sum(r.params for r in rows)
        param_bytes = sum(r.param_bytes for r in rows)
    return Totals(
        layers=sum(1 for r in rows if r.role is None),
        params=params,
        flops=sum(r.flops for r in rows),
        activation_bytes=sum(r.out_bytes for r in rows if r.role is None),
        param_bytes=param_bytes,
        input_bytes=input_bytes,
        peak_bytes=peak,
    )


__all__ = ["LayerRow", "Totals", "node_params", "node_flops", "analyze_node",
           "summarize", "totals", "peak_live_bytes"]
