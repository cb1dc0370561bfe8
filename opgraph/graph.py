"""The graph: integer node ids in a ``networkx.MultiDiGraph``.

A node holds its op, its name and its inferred output type as node
attributes; its inputs are the in-edges, keyed by input position (parallel
edges allowed, so ``add(x, x)`` works). Op objects are never node keys: two
identical convolutions stay two nodes.

``Value`` is the user-facing handle of a node's (single) output; builders
take and return values. ``NodeView`` is a read-only view used by passes.
"""

from __future__ import annotations

import contextlib
import itertools
import numbers
from typing import Iterable, Iterator, Sequence

import attrs
import networkx as nx
import numpy as np

from .errors import OpgraphError, ParameterError, ShapeError
from .op import Op, Source, check_arity
from .types import DTYPES, LAYOUTS, TensorType, numpy_dtype


@attrs.frozen(repr=False)
class Value:
    """The output of node ``node`` in ``graph``."""

    graph: "Graph" = attrs.field(eq=False, hash=False)
    node: int
    _graph_id: int = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self):
        object.__setattr__(self, "_graph_id", id(self.graph))

    @property
    def type(self) -> TensorType:
        return self.graph.node(self.node).type

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype

    @property
    def name(self) -> str:
        return self.graph.node(self.node).name

    @property
    def op(self) -> Op:
        return self.graph.node(self.node).op

    def __repr__(self) -> str:
        return f"<Value %{self.node} {self.name}: {self.type}>"


@attrs.frozen(repr=False)
class NodeView:
    """Read-only view of one node for passes and reports."""

    graph: "Graph" = attrs.field(eq=False, hash=False)
    id: int

    @property
    def _data(self) -> dict:
        return self.graph.nx.nodes[self.id]

    @property
    def op(self) -> Op:
        return self._data["op"]

    @property
    def name(self) -> str:
        return self._data["name"]

    @property
    def type(self) -> TensorType:
        return self._data["type"]

    @property
    def inputs(self) -> list[Value]:
        return [Value(self.graph, u) for u in self.graph.input_ids(self.id)]

    @property
    def input_types(self) -> tuple[TensorType, ...]:
        return tuple(v.type for v in self.inputs)

    @property
    def output(self) -> Value:
        return Value(self.graph, self.id)

    def __repr__(self) -> str:
        return f"<Node %{self.id} {self.name} = {self.op.describe()}>"


class Graph:
    """A dataflow graph of ops. Build it with ``input``/``param`` and builders.

    Attributes:
        param_values: name -> array given to ``param(..., value=)`` or
            ``buffer(..., value=)``, used when a run does not feed that source.
        grad_inputs: output node id -> node id of the ``grad`` source that
            ``opgraph.grad`` created for its cotangent.
        inplace_plan: the memory pass's in-place decisions
            (``opgraph.executable.InplacePlan``) that the executor follows,
            or None. A rewrite (:meth:`replace_op`, :meth:`rewrite`,
            :meth:`set_layout`, :meth:`absorb`) drops it: it was made for the
            graph as it was.
    """

    def __init__(self, name: str = "graph"):
        self.name = name
        self.nx = nx.MultiDiGraph()
        self._ids = itertools.count()
        self._by_name: dict[str, int] = {}
        self._scope: list[str] = []
        self.param_values: dict[str, object] = {}
        self.grad_inputs: dict[int, int] = {}
        self.inplace_plan = None

    # ---- construction -------------------------------------------------
    def input(self, name: str, shape: Sequence[int] | int, dtype: str = "float32") -> Value:
        """Add a graph input (fed at run time by ``name``). ``shape``: a
        sequence of dimensions, or one int for a 1-D shape (``torch.empty(5)``);
        the same holds for :meth:`param` and :meth:`buffer`.

        Raises:
            ShapeError: a negative or non-integer dimension, or an unknown dtype.
        """
        return self.add_node(Source(_source_type(name, shape, dtype), "input"), [], name=name)

    def param(self, name: str, shape: Sequence[int], dtype: str = "float32", value=None) -> Value:
        """Add a trainable parameter; ``value`` (array) is its default feed.

        Raises:
            ShapeError: ``value`` has another shape than ``shape``.
        """
        return self._state_source("param", name, _source_type(name, shape, dtype), value)

    def buffer(self, name: str, shape: Sequence[int], dtype: str = "float32", value=None) -> Value:
        """Add a buffer: state fed by name like a parameter, never trained or
        differentiated (BatchNorm running statistics; PyTorch's ``register_buffer``).
        Parameter counts (``opgraph.analysis``) leave buffers out, and ``grad``
        refuses one in ``wrt``.

        Args:
            value: its default feed: an array of ``shape``, or a number filling
                it (``1.0`` for a running variance); None: it must be fed.

        Raises:
            ShapeError: ``value`` is an array of another shape.
            ParameterError: ``value`` is a single thing that is not a real
                number (a string, a complex number), naming the buffer.
        """
        t = _source_type(name, shape, dtype)
        if value is not None and np.ndim(value) == 0:
            # np.full would raise a bare "could not convert string to float" for 'a', and drop
            # the imaginary part of 1j with only a warning
            if np.asarray(value).dtype.kind not in "biuf":
                raise ParameterError("value", value, f"must be a real number filling the buffer or an array "
                                     f"of shape {t.shape}", f"{name} (buffer {t})")
            value = np.full(t.shape, value, dtype=numpy_dtype(t.dtype))
        return self._state_source("buffer", name, t, value)

    def _state_source(self, role: str, name: str, t: TensorType, value) -> Value:
        """Add a ``param`` or ``buffer`` source of type ``t`` whose default
        feed is ``value`` (None: none); ShapeError if ``value``'s shape is not ``t``'s."""
        if value is not None and tuple(getattr(value, "shape", ())) != t.shape:
            raise ShapeError(f"{role} value shape {getattr(value, 'shape', None)} != {t.shape}", name)
        v = self.add_node(Source(t, role), [], name=name)
        if value is not None:
            self.param_values[v.name] = value
        return v

    def apply(self, op_cls: type, params: dict, inputs: Sequence[Value], name: str | None = None) -> Value:
        """Construct ``op_cls(**params)`` and add it as a node over ``inputs``.

        Errors from the op's validators and shape rule are re-raised naming
        the node, e.g. ``node conv1 (Conv2d): parameter stride=0: ...``.
        """
        name = self._fresh_name(name, getattr(op_cls, "kind", op_cls.__name__.lower()))
        try:
            op = op_cls(**params)
        except ParameterError as e:
            raise e.with_node(f"{name} ({op_cls.__name__})") from None
        return self._add(op, inputs, name)

    def add_node(self, op: Op, inputs: Sequence[Value], name: str | None = None) -> Value:
        """Add a node running ``op`` on ``inputs``; its type is inferred now.

        Raises:
            ShapeError: the op rejects the input types (message names the node).
            OpgraphError: an input belongs to another graph.
        """
        return self._add(op, inputs, self._fresh_name(name, op.kind))

    def _add(self, op: Op, inputs: Sequence[Value], name: str) -> Value:
        for v in inputs:
            if not isinstance(v, Value) or v.graph is not self:
                raise OpgraphError(f"node {name}: input {v!r} is not a value of graph {self.name!r}")
        types = tuple(v.type for v in inputs)
        try:
            check_arity(op, types)
            out_type = op.infer(*types)
        except ShapeError as e:
            raise e.with_node(f"{name} ({op.name})") from None
        node = next(self._ids)
        self.nx.add_node(node, op=op, name=name, type=out_type)
        for pos, v in enumerate(inputs):
            self.nx.add_edge(v.node, node, key=pos)
        self._by_name[name] = node
        return Value(self, node)

    def _fresh_name(self, name: str | None, kind: str) -> str:
        """``name`` (scoped) if given and free; else ``kind``, ``kind_2``, ...

        Raises:
            OpgraphError: an explicit name is already taken.
        """
        base = "".join(self._scope) + (name or kind)
        if name is not None and base in self._by_name:
            raise OpgraphError(f"a node named {base!r} already exists in graph {self.name!r}")
        return self.unique_name(base)

    def unique_name(self, base: str) -> str:
        """``base`` if no node has that name, else the first free ``base_2``,
        ``base_3``, ...: for nodes a pass makes (``<part>/batch-stats``), whose
        natural name a user's node may already hold."""
        if base not in self._by_name:
            return base
        return next(f"{base}_{k}" for k in itertools.count(2) if f"{base}_{k}" not in self._by_name)

    @contextlib.contextmanager
    def scope(self, prefix: str):
        """Prefix the names of nodes added inside the block with ``prefix/``."""
        self._scope.append(prefix.rstrip("/") + "/")
        try:
            yield
        finally:
            self._scope.pop()

    # ---- queries ---------------------------------------------------------
    def node(self, node: int) -> NodeView:
        if node not in self.nx:
            raise KeyError(f"graph {self.name!r} has no node %{node}")
        return NodeView(self, node)

    def __getitem__(self, name: str) -> Value:
        """The value of the node called ``name``."""
        try:
            return Value(self, self._by_name[name])
        except KeyError:
            raise KeyError(f"graph {self.name!r} has no node named {name!r}") from None

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def __len__(self) -> int:
        return self.nx.number_of_nodes()

    def input_ids(self, node: int) -> list[int]:
        """Input node ids of ``node`` in input-position order."""
        edges = sorted(self.nx.in_edges(node, keys=True), key=lambda e: e[2])
        return [u for u, _, _ in edges]

    def users(self, node: int) -> list[int]:
        """Nodes that read ``node``'s output (each listed once)."""
        return sorted(set(self.nx.successors(node)))

    def topological(self, nodes: Iterable[int] | None = None) -> list[int]:
        """Node ids in a deterministic topological order (ties by id)."""
        g = self.nx if nodes is None else self.nx.subgraph(nodes)
        return list(nx.lexicographical_topological_sort(g))

    def nodes_in_order(self, outputs: Sequence[Value] | None = None) -> Iterator[NodeView]:
        """Views in topological order; only ancestors of ``outputs`` if given."""
        ids = None if outputs is None else self.ancestors(outputs)
        for n in self.topological(ids):
            yield NodeView(self, n)

    def ancestors(self, outputs: Sequence[Value]) -> set[int]:
        """Ids of ``outputs`` and every node they depend on (one traversal for all)."""
        keep = {v.node for v in outputs}
        todo = list(keep)
        while todo:
            for u in self.nx.predecessors(todo.pop()):
                if u not in keep:
                    keep.add(u)
                    todo.append(u)
        return keep

    def sources(self, role: str | None = None) -> list[NodeView]:
        """Source nodes (inputs, params, grad placeholders), by id order."""
        out = [NodeView(self, n) for n, op in self.nx.nodes(data="op") if isinstance(op, Source)]
        return [v for v in sorted(out, key=lambda v: v.id) if role is None or v.op.role == role]

    # ---- rewriting (used by passes on their own copy) -------------------
    def copy(self) -> "Graph":
        """A copy sharing ops (immutable) but not structure; values of the old
        graph map to the new one by node id (``new.value(old_value.node)``)."""
        g = Graph.__new__(Graph)
        g.name = self.name
        g.nx = self.nx.copy()
        g._ids = itertools.count(max(self.nx.nodes, default=-1) + 1)
        g._by_name = dict(self._by_name)
        g._scope = []
        g.param_values = dict(self.param_values)
        g.grad_inputs = dict(self.grad_inputs)
        g.inplace_plan = self.inplace_plan  # immutable
        return g

    def value(self, node: int) -> Value:
        self.node(node)
        return Value(self, node)

    def replace_op(self, node: int, op: Op) -> None:
        """Swap the op of ``node``; the new op must infer the same shape and
        dtype. The value keeps its layout (a storage decision of the layout
        pass that a rewrite such as fusion or autotuning does not revisit).

        Raises:
            ShapeError: the new op takes another input count, rejects the
                inputs, or gives another output shape or dtype (naming the node).
        """
        view = self.node(node)
        try:
            check_arity(op, tuple(view.input_types))
            new_type = op.infer(*view.input_types)
        except ShapeError as e:
            raise e.with_node(f"{view.name} ({op.name})") from None
        if (new_type.shape, new_type.dtype) != (view.type.shape, view.type.dtype):
            raise ShapeError(f"replacing {view.op.name} by {op.name} changes the output "
                             f"{view.type} -> {new_type}", view.name)
        self.nx.nodes[node]["op"] = op
        self.nx.nodes[node]["type"] = _keep_layout(new_type, view.type)
        self.inplace_plan = None

    def rewrite(self, node: int, op: Op, inputs: Sequence[Value]) -> None:
        """Give ``node`` a new op and new inputs at once, keeping its id (so its
        readers and an output at this id need no change): a rewrite such as
        the legalize pass's, whose new op would not fit the old inputs nor the
        old op the new ones. ``op`` on ``inputs`` must give the node's shape
        and dtype (its readers were typed against them); the value keeps its
        layout (see :meth:`replace_op`). Nothing changes when this raises.

        Raises:
            ShapeError: ``op`` takes another input count, rejects the inputs,
                or gives another output shape or dtype (naming the node).
            OpgraphError: an input that is not a value of this graph, or one
                computed from ``node`` (a cycle).
        """
        view = self.node(node)
        for v in inputs:
            if not isinstance(v, Value) or v.graph is not self:
                raise OpgraphError(f"node {view.name}: input {v!r} is not a value of graph {self.name!r}")
            if v.node == node or nx.has_path(self.nx, node, v.node):
                raise OpgraphError(f"node {view.name}: reading {self.node(v.node).name} would make a cycle")
        types = tuple(self.node(v.node).type for v in inputs)
        try:
            check_arity(op, types)
            new_type = op.infer(*types)
        except ShapeError as e:
            raise e.with_node(f"{view.name} ({op.name})") from None
        if (new_type.shape, new_type.dtype) != (view.type.shape, view.type.dtype):
            raise ShapeError(f"rewiring changes the output {view.type} -> {new_type} ({op.name} on the "
                             "new inputs)", view.name)
        for u, v, k in list(self.nx.in_edges(node, keys=True)):
            self.nx.remove_edge(u, v, key=k)
        for pos, val in enumerate(inputs):
            self.nx.add_edge(val.node, node, key=pos)
        self.nx.nodes[node]["op"] = op
        self.nx.nodes[node]["type"] = _keep_layout(new_type, view.type)
        self.inplace_plan = None

    def set_layout(self, node: int, layout: str) -> None:
        """Store the 4-D value of ``node`` in ``layout`` (``'NCHW'`` or
        ``'NHWC'``): the layout pass's decision (``TensorType.layout``); the
        logical shape is unchanged.

        Raises:
            ParameterError: another layout, or a value that is not 4-D.
        """
        view = self.node(node)
        if layout not in LAYOUTS:
            raise ParameterError("layout", layout, "must be 'NCHW' or 'NHWC'").with_node(view.name)
        if view.type.ndim != 4:
            raise ParameterError("layout", layout, f"only 4-D values have one, {view.type} is "
                                 f"{view.type.ndim}-D").with_node(view.name)
        if view.type.layout != layout:
            self.nx.nodes[node]["type"] = attrs.evolve(view.type, layout=layout)
            self.inplace_plan = None

    def absorb(self, node: int, into: int) -> None:
        """Make every reader of ``node`` read ``into`` instead, then delete
        ``node`` (a fusion: ``into`` now computes what ``node`` did, or
        ``node`` is a member of a fused chain that nothing reads any more).

        Raises:
            ShapeError: the two nodes' types differ and ``node`` has readers.
        """
        a, b = self.node(node), self.node(into)
        if a.type.shape != b.type.shape and self.users(node):
            raise ShapeError(f"cannot replace {a.name} {a.type} by {b.name} {b.type}", a.name)
        for _, user, key in list(self.nx.out_edges(node, keys=True)):
            self.nx.add_edge(into, user, key=key)
        for out, gin in list(self.grad_inputs.items()):
            if out == node:
                self.grad_inputs[into] = self.grad_inputs.pop(out)
        self._by_name.pop(a.name, None)
        self.nx.remove_node(node)
        self.inplace_plan = None

    # ---- text ------------------------------------------------------------
    def dump(self, outputs: Sequence[Value] | None = None) -> str:
        """One line per node: ``%id name = Op(params)(inputs) -> type``."""
        lines = []
        for v in self.nodes_in_order(outputs):
            args = ", ".join(f"%{u}" for u in self.input_ids(v.id))
            lines.append(f"%{v.id} {v.name} = {v.op.describe()}({args}) -> {v.type}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Graph {self.name!r}: {len(self)} nodes>"


def _source_type(name: str, shape, dtype) -> TensorType:
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        shape = (int(shape),)  # as torch.empty(5) and layer_norm(x, 5): one int is a 1-D shape
    try:
        t = TensorType(shape, dtype)
    except (TypeError, ValueError) as e:
        raise ShapeError(str(e), name) from None
    if t.dtype not in DTYPES:  # an index dtype: made by ops only
        raise ShapeError(f"dtype {dtype!r} is not one of {DTYPES}", name)
    return t


def _keep_layout(new: TensorType, old: TensorType) -> TensorType:
    """``new`` stored as ``old`` was (layouts describe 4-D values only)."""
    return attrs.evolve(new, layout=old.layout if new.ndim == old.ndim == 4 else new.layout)


def graph_of(*values) -> Graph:
    """The one graph that all non-None ``values`` belong to.

    Raises:
        OpgraphError: values of different graphs, no value at all, or something
            that is not a graph value (e.g. a node name).
    """
    for v in values:
        if v is not None and not isinstance(v, Value):
            hint = f" (look it up with graph[{v!r}])" if isinstance(v, str) else ""
            raise OpgraphError(f"expected graph values (opgraph.Value), got {type(v).__name__} {v!r}{hint}")
    graphs = {id(v.graph): v.graph for v in values if v is not None}
    if len(graphs) != 1:
        raise OpgraphError("the values given must all belong to one graph "
                           f"(got values of {len(graphs)} graphs)")
    return next(iter(graphs.values()))
