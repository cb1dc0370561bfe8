"""A fused chain of memory-bound ops: one node, one generated kernel.

``FusedElementwise(program)`` runs a small DAG of abstract ops (element-wise
ops over equal or broadcast shapes, channel vectors, and per-channel or
per-plane reductions that consume them) as one node. The fusion pass makes
these nodes (``passes/pattern.py``); the ``codegen`` rule compiles the
program into one CUDA kernel (two or three launches where a reduction feeds
element-wise work: the phases of ``backends/cuda/codegen``); the reference
rule runs the member ops' own reference kernels in order, so the oracle
stays independent of the generator.

A :class:`Program` numbers its values: ``0 .. n_inputs - 1`` are the node's
inputs in order, ``n_inputs + k`` is the output of step ``k``. Each
:class:`FusedStep` holds a member op (a frozen, hashable abstract op) and the
value numbers of its inputs, in the op's input order. ``outputs`` names the
value(s) the node returns:

* one value: the node's output is that value, its type as the member infers it;
* several values (reductions of one shape, e.g. the two per-channel sums of a
  batch-norm backward): the node returns them stacked along a new leading
  axis, ``(K, *shape)``, in the statistics dtype (float32 for half storage,
  as ``BatchNormStats``): the graph's nodes have one output each.

Numbers: the generated kernel keeps every intermediate in fp32 (fp64 for
float64 storage) and rounds once per output; the reference rounds each member's
result to the storage dtype. Both agree within SEMANTICS.md's tolerances
(bf16/fp16 1e-2), and exactly where every member is a select or a copy.

Build one from graph nodes with :func:`fuse` (the API the fusion pass calls)
and put it in the graph with ``Graph.rewrite``; the members other than the
output keep their nodes until the pass removes those nothing else reads::

    op, inputs = fuse(graph, [stats.node, bn.node, act.node])   # BN statistics, apply, ReLU
    graph.rewrite(act.node, op, inputs)

Fused nodes are made after ``grad`` and have no gradient rule. Which chains
the ``codegen`` rule accepts (its decline reasons otherwise):
``backends/cuda/codegen_rules.py``.
"""

from __future__ import annotations

from typing import ClassVar, Sequence

import attrs

from ..errors import NotDifferentiableError, OpgraphError, ShapeError
from ..op import Lowered, Op, Source, check_arity
from ..types import TensorType
from .batchnorm_training import stats_dtype


@attrs.frozen
class FusedStep:
    """One member of a program: ``op`` applied to the values numbered ``args``."""

    op: Op
    args: tuple = attrs.field(converter=lambda a: tuple(int(v) for v in a))


def _steps(value) -> tuple:
    return tuple(s if isinstance(s, FusedStep) else FusedStep(*s) for s in value)


@attrs.frozen
class Program:
    """A hashable DAG of member ops (module docstring for the numbering).

    Raises:
        OpgraphError: a step reads a value not yet defined, a member is not
            an abstract op (a source, a lowered or a fused op), or an output
            number is out of range.
    """

    n_inputs: int = attrs.field(converter=int)
    steps: tuple = attrs.field(converter=_steps)
    outputs: tuple = attrs.field(converter=lambda o: (int(o),) if isinstance(o, int) else tuple(int(v) for v in o))

    def __attrs_post_init__(self):
        if self.n_inputs < 1 or not self.steps:
            raise OpgraphError(f"a fused program needs inputs and steps, got {self.n_inputs} inputs, "
                               f"{len(self.steps)} steps")
        for k, step in enumerate(self.steps):
            # a fused chain is spliced in, never nested; another fused op (the fuse pass's
            # BatchNormTrainingBackwardDataFromSums) is one op: a one-step program of it is
            # how the generator plans a single op (backends/cuda/codegen/plan.py)
            if isinstance(step.op, (Source, Lowered, FusedElementwise)):
                what = "already fused" if isinstance(step.op, FusedElementwise) else "a source or a lowered op"
                raise OpgraphError(f"fused step {k}: {step.op.name} is {what}, not an abstract member op")
            bad = [a for a in step.args if not 0 <= a < self.n_inputs + k]
            if bad:
                raise OpgraphError(f"fused step {k} ({step.op.name}) reads value {bad[0]}, which is not "
                                   f"defined before it (inputs 0..{self.n_inputs - 1}, steps before {k})")
        total = self.n_inputs + len(self.steps)
        if not self.outputs or any(not 0 <= o < total for o in self.outputs):
            raise OpgraphError(f"fused program outputs {self.outputs}: must be value numbers < {total}")

    def value_types(self, input_types: Sequence[TensorType]) -> list[TensorType]:
        """The type of every value (inputs, then each step's output, by its op's ``infer``).

        Raises:
            ShapeError: a member rejects its inputs (the message names the step).
        """
        if len(input_types) != self.n_inputs:
            raise ShapeError(f"fused program takes {self.n_inputs} inputs, got {len(input_types)}")
        types = list(input_types)
        for k, step in enumerate(self.steps):
            args = tuple(types[a] for a in step.args)
            try:
                check_arity(step.op, args)
                types.append(step.op.infer(*args))
            except ShapeError as e:
                raise ShapeError(f"fused step {k} ({step.op.name}): {e}") from None
        return types

    def output_type(self, input_types: Sequence[TensorType]) -> TensorType:
        """The node's output type: the one output's, or the stack of several
        (module docstring). Raises ShapeError for outputs that cannot stack."""
        types = self.value_types(input_types)
        outs = [types[o] for o in self.outputs]
        if len(outs) == 1:
            return outs[0]
        if len({(t.shape, t.dtype) for t in outs}) != 1:
            raise ShapeError(f"fused outputs {', '.join(map(str, outs))} cannot stack: shapes and dtypes differ")
        return TensorType((len(outs), *outs[0].shape), stats_dtype(outs[0].dtype))

    def describe(self) -> str:
        """``Relu(BatchNormTraining(%0, %1, %2, %3))``: the members as nested calls."""
        def text(v: int) -> str:
            if v < self.n_inputs:
                return f"%{v}"
            step = self.steps[v - self.n_inputs]
            head = step.op.describe()
            head = head[:-2] if head.endswith("()") else head
            return f"{head}({', '.join(text(a) for a in step.args)})"
        return "; ".join(text(o) for o in self.outputs)


@attrs.frozen
class FusedElementwise(Op):
    """A fused memory-bound chain (module docstring): inputs -> the program's output."""

    program: Program
    arity: ClassVar = (1, None)
    fused: ClassVar[bool] = True
    kind: ClassVar[str] = "fused"
    family: ClassVar[str] = "fused"

    def infer(self, *types):
        return self.program.output_type(types)

    def flops(self, types, out) -> int:
        values = self.program.value_types(types)
        n = self.program.n_inputs
        return sum(s.op.flops(tuple(values[a] for a in s.args), values[n + k])
                   for k, s in enumerate(self.program.steps))

    def vjp(self, node, gy, wanted):
        raise NotDifferentiableError(f"node {node.name} (FusedElementwise): fused nodes are made after "
                                     f"grad and have no gradient rule; differentiate the unfused graph")

    def describe(self) -> str:
        return f"FusedElementwise({self.program.describe()})"

    @property
    def members(self) -> tuple[str, ...]:
        """The member op names in program order (``('BatchNormTraining', 'Relu')``)."""
        return tuple(s.op.name for s in self.program.steps)


def fuse(graph, nodes: Sequence[int], outputs: int | Sequence[int] | None = None):
    """The fused op of graph nodes ``nodes`` and the values it reads.

    Args:
        graph: an ``opgraph.Graph``.
        nodes: node ids of the members (abstract ops), any order: they are
            taken in the graph's topological order.
        outputs: the member node(s) whose value the fused node returns; by
            default the one member no other member reads (an error when
            there are several: pass them, and they are stacked).

    Returns:
        ``(op, inputs)``: a :class:`FusedElementwise` and the graph values it
        reads (every value a member reads that no member computes, in order
        of first use). ``graph.rewrite(outputs_node, op, inputs)`` then makes
        the output node compute the chain; the other members lose their
        readers (the fusion pass removes them, or keeps those read elsewhere).

    Raises:
        OpgraphError: no nodes, a node id not in ``nodes`` as output, a member
            that is a source or already lowered, or no single default output.
    """
    members = [n for n in graph.topological() if n in set(nodes)]
    if not members or len(members) != len(set(nodes)):
        raise OpgraphError(f"fuse: nodes {sorted(set(nodes))} are not all nodes of graph {graph.name!r}")
    inside = set(members)
    if outputs is None:
        sinks = [n for n in members if not inside & set(graph.users(n))]
        if len(sinks) != 1:
            names = ", ".join(graph.node(n).name for n in sinks)
            raise OpgraphError(f"fuse: {len(sinks)} members are read by no other member ({names}); "
                               f"name the output(s)")
        outputs = sinks
    outs = [outputs] if isinstance(outputs, int) else list(outputs)
    if not set(outs) <= inside:
        raise OpgraphError(f"fuse: outputs {outs} must be members {members}")
    numbers: dict[int, int] = {}
    inputs: list = []
    for n in members:
        for u in graph.input_ids(n):
            if u not in inside and u not in numbers:
                numbers[u] = len(inputs)
                inputs.append(graph.value(u))
    steps = []
    for n in members:
        view = graph.node(n)
        steps.append(FusedStep(view.op, [numbers[u] for u in graph.input_ids(n)]))
        numbers[n] = len(inputs) + len(steps) - 1
    program = Program(len(inputs), tuple(steps), tuple(numbers[o] for o in outs))
    return FusedElementwise(program), inputs


__all__ = ["FusedStep", "Program", "FusedElementwise", "fuse"]
