"""The convnet-benchmarks protocol on a compiled training graph: phases, warm-up, timed loops.

The seed (``torch7/imagenet_winners/benchmark.lua``; spec
``imagenet_winners.json`` ``benchmark_protocol``) times one model as:

* random input on the device; the model output itself passed back as the
  output gradient (no loss, no softmax);
* 10 warm-up iterations of forward + backward;
* three loops, each of ``repeat`` calls and each followed by a device
  synchronisation: ``updateOutput`` (forward), ``updateGradInput``
  (backward-data) and ``accGradParameters`` (backward-filter); the first
  convolution computes no gradient with respect to the image.

The single-convolution suite L1-L5 follows the layer-wise benchmark instead:
there the one convolution's input gradient is timed too (the layer-wise
tables and the fbfft paper report fprop, bprop and accGrad per layer), so
its training graph also asks for the gradient of the image
(``training_graph(model, input_grad=True)``).

Here the training graph is ``opgraph.grad(output, params,
grad_outputs=[output])`` (:func:`training_graph`): the cotangent of the output
*is* the output value, and ``wrt`` holds the parameters only, so the first
convolution gets no ``Conv2dBackwardData`` node at all. A model with
training-form batch norm also computes its new running statistics
(``Model.state_updates``), as a PyTorch training step updates them in its
forward pass; they are outputs of the training graph too. After compiling
it, every scheduled step belongs to exactly one phase (:func:`classify`):

* **forward**: the ancestors of the model output and of the state updates;
* **backward-filter**: the nodes computing parameter gradients from output
  gradients and forward values (:func:`classify` gives the exact rule): in
  the models ``Conv2dBackwardFilter`` (and the ``Pad`` the legalize pass may
  put before it), the ``MatMul`` giving a ``Linear`` weight gradient and
  ``BiasAddBackward``;
* **backward-data**: every other backward node: ``Conv2dBackwardData`` (and
  its ``PadBackward`` crop), the ``MatMul`` giving a ``Linear`` input
  gradient, ReLU / threshold / pooling / LRN backward, ``Reshape``, and the
  ``Add`` of two activation gradients (GoogLeNet's branches). A parameter
  read by several nodes would have its partial gradients summed by an
  ``Add`` in backward-filter.

Phases are timed in separate loops over the same live values (:class:`PhaseRunner`);
the steps run without freeing buffers, as the seed's modules kept theirs, so
a phase can be re-run any number of times. Per layer, the steps of one
convolution or linear layer in one phase (e.g. ``conv2`` backward-filter:
its ``Conv2dBackwardFilter`` and its bias's ``BiasAddBackward``) are timed
alone in a loop too (:meth:`PhaseRunner.time_layers`).

With ``--cuda-graph`` each phase is also replayed as CUDA graphs
(:meth:`PhaseRunner.time_graphed_phases`, :mod:`opgraph.graph_replay`):
the same steps, captured once per phase in phase order, each phase's graphs
launched in its own timed loop on a non-default stream.
"""

from __future__ import annotations

import math
import re
from typing import Mapping

import attrs
import networkx as nx
import numpy as np

import opgraph as og
from opgraph.analysis import node_flops
from opgraph.executable import Executable, Step, run_step
from opgraph.graph import Value
from opgraph.op import abstract_of
from opgraph.ops import of_family
from opgraph.types import numpy_dtype

from .models import Model
from .timer import Timer, Timing

PHASES = ("forward", "backward_data", "backward_filter")
#: Op families whose forward op makes a "layer" of the per-layer view, and
#: whose steps are a layer's main step in each phase (:func:`main_step`).
LAYER_FAMILIES = ("conv", "linear")
#: Abstract ops that make a "layer": the forward ops of :data:`LAYER_FAMILIES`
#: (``Conv2d``, ``Linear``; a fused op is made later, from one of them).
LAYER_OPS = tuple(t.__name__ for f in LAYER_FAMILIES for t in of_family(f, "fwd") if not t.fused)
#: Nodes the legalize pass adds around a convolution: ``<conv>/pad``, ``<dgrad>/unpadded``.
_LEGALIZE_SUFFIX = re.compile(r"/(pad|unpadded)(_\d+)?$")


@attrs.frozen
class TrainingGraph:
    """A model with its backward graph, ready to compile.

    Attributes:
        model: the benchmark model.
        grads: one gradient value per parameter (``model.params`` order).
        input_grad: the gradient with respect to the image, or None (the
            ImageNet models: the seed computes none).
        layers: conv/linear layer name -> abstract op name, forward order.
        layer_flops: layer name -> forward FLOPs of that layer (multiply-add = 2).
        data_grad_layers: the layers whose input gradient the backward graph
            computes (all but a first convolution reading the image, unless
            ``input_grad``).
        state: the model's state updates (``Model.state_updates``: new
            running statistics), computed in the forward phase.
    """

    model: Model
    grads: tuple[Value, ...]
    input_grad: Value | None
    layers: Mapping[str, str]
    layer_flops: Mapping[str, int]
    data_grad_layers: frozenset = frozenset()
    state: tuple[Value, ...] = ()

    @property
    def outputs(self) -> list[Value]:
        """``[model output, *parameter gradients[, input gradient], *state]``, the values compiled."""
        extra = [self.input_grad] if self.input_grad is not None else []
        return [self.model.output, *self.grads, *extra, *self.state]

    @property
    def output_names(self) -> list[str]:
        """Names of :attr:`outputs`: the output's, the parameters', the image's
        (for its gradient) and the buffers' the state updates replace."""
        extra = [self.model.input.name] if self.input_grad is not None else []
        return [self.model.output.name, *(p.name for p in self.model.params), *extra,
                *list(self.model.state_updates)[:len(self.state)]]


def applied_layout(layout: str, device: str) -> str:
    """The layout a run asked for ``layout`` computes in on ``device``: NHWC
    applies on cuda only (passes/layout.py keeps NCHW elsewhere, as the CPU
    kernels are written for it), so a CPU run is ``'NCHW'`` whatever was asked."""
    return "NHWC" if layout == "NHWC" and device == "cuda" else "NCHW"


def training_graph(model: Model, input_grad: bool = False) -> TrainingGraph:
    """Add the seed's backward graph to ``model`` (see the module docstring).

    ``grad`` is given the output itself as its cotangent and asked for the
    parameters only, so nothing is computed for the image input, unless
    ``input_grad`` (the single-layer suite L1-L5: the layer-wise benchmark
    timed the input gradient of each layer too).
    """
    wrt = list(model.params) + ([model.input] if input_grad else [])
    grads = og.grad(model.output, wrt, grad_outputs=[model.output])
    g = model.graph
    depends = {v.node for v in wrt}
    for v in wrt:
        depends |= nx.descendants(g.nx, v.node)
    layers, flops, data = {}, {}, set()
    params = {p.node for p in model.params}
    for node in g.nodes_in_order([model.output]):
        name = abstract_of(node.op).name
        if name in LAYER_OPS or _matmul_layer(g, node, params):
            layers[node.name] = name
            flops[node.name] = node_flops(node)
            # the data operand: the first that is not a parameter (a MatMul may take its weight first)
            operand = next((i for i in g.input_ids(node.id) if i not in params), None)
            if operand in depends:
                data.add(node.name)
    n = len(model.params)
    return TrainingGraph(model, tuple(grads[:n]), grads[n] if input_grad else None, layers, flops,
                         frozenset(data), tuple(model.state_updates.values()))


def _matmul_layer(graph, node, params: set[int]) -> bool:
    """A forward ``MatMul`` with a parameter operand: a linear layer written as a matrix
    product (ONNX exporters write ``nn.Linear`` on a 4-D value so: ConvNeXt's MLPs, 8.4 of
    its 9 forward GFLOP), a layer of the per-layer view and of the FLOP counts as
    ``Linear`` is."""
    return abstract_of(node.op).name == "MatMul" and any(i in params for i in graph.input_ids(node.id))


def random_feeds(model: Model, seed: int = 0) -> dict[str, np.ndarray]:
    """Random host arrays for the model's input and every parameter, by name,
    and the initial value of every buffer the model output reads.

    The input is standard normal (the seed's ``torch.randn``); weights are
    He-normal (std ``sqrt(2 / fan_in)``, He et al. 2015) so activations keep
    unit scale through the depth of VGG, biases are zero, and the scale of a
    normalisation (a 1-D parameter a batch or layer norm reads as its
    ``weight``) is one, as ``torch.nn.BatchNorm2d`` initialises it (zeros
    there would zero the whole network). Buffers (running statistics,
    ``Graph.buffer``) that the output or the state updates read get their
    declared default, else ones where a batch norm reads them as a variance
    and zeros otherwise (``torch.nn.BatchNorm2d``'s initial running
    statistics): see :func:`buffer_feeds`. Deterministic in ``seed``.
    """
    rng = np.random.default_rng(seed)
    dtype = numpy_dtype(model.dtype)

    def normal(shape, std=1.0):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(dtype, copy=False)

    feeds = {model.input.name: normal(model.input.type.shape)}
    g = model.graph
    for p in model.params:
        shape = p.type.shape
        if len(shape) == 1:
            fill = np.ones if _read_as(g, p.node, _reads_scale) else np.zeros
            feeds[p.name] = fill(shape, dtype)
        else:
            fan_in = math.prod(shape[1:])
            feeds[p.name] = normal(shape, math.sqrt(2.0 / max(fan_in, 1)))
    feeds.update(buffer_feeds(g, model.forward_outputs))
    return feeds


def _read_as(graph, source: int, role) -> bool:
    """Whether some node reads ``source`` at a position where ``role(op, position)`` holds."""
    return any(role(abstract_of(graph.node(user).op), i)
               for user in graph.users(source)
               for i, u in enumerate(graph.input_ids(user)) if u == source)


def _reads_scale(op, position: int) -> bool:
    """Whether ``op`` reads its input ``position`` as a normalisation's scale (weight)."""
    return (op.name, position) in {("BatchNorm", 1), ("BatchNormTraining", 2), ("LayerNorm", 1)}


def _reads_variance(op, position: int) -> bool:
    """Whether ``op`` reads its input ``position`` as a running variance."""
    if op.name == "BatchNorm":
        return position == 4
    return op.name == "BatchNormRunningUpdate" and op.statistic == "var" and position == 1


def buffer_feeds(graph, outputs) -> dict[str, np.ndarray]:
    """The initial value of every buffer source ``outputs`` depend on, by name: the
    value declared with ``Graph.buffer(..., value=)``, else ones for a buffer
    read as a variance (input 4 of ``BatchNorm``, the running variance of a
    ``BatchNormRunningUpdate``) and zeros otherwise, in the buffer's dtype."""
    scope = graph.ancestors(outputs)
    feeds = {}
    for src in graph.sources("buffer"):
        if src.id not in scope:
            continue
        if src.name in graph.param_values:
            feeds[src.name] = np.asarray(graph.param_values[src.name])
            continue
        fill = np.ones if _read_as(graph, src.id, _reads_variance) else np.zeros
        feeds[src.name] = fill(src.type.shape, numpy_dtype(src.type.dtype))
    return feeds


def layer_of(step_name: str) -> str:
    """The forward node a step belongs to, from its name: ``'conv2'`` for
    ``'conv2'``, ``'conv2/pad'``, ``'conv2.grad/conv2d_backward_data'`` and
    ``'conv2.grad/conv2d_backward_data/unpadded'`` (``grad`` names backward
    nodes ``<node>.grad/...``; the legalize pass adds ``/pad`` and ``/unpadded``)."""
    base = step_name.split(".grad/", 1)[0]
    return _LEGALIZE_SUFFIX.sub("", base)


#: Ops that compute a parameter gradient from an output gradient (seeds of backward-filter).
FILTER_OPS = frozenset({"Conv2dBackwardFilter", "BiasAddBackward"})
#: Ops that only move or sum gradients: a node read only by these (in backward-filter)
#: is a partial parameter gradient (a weight used twice, a reshaped weight gradient).
PASS_THROUGH_OPS = frozenset({"Add", "Reshape", "Flatten", "SumTo"})


def classify(exe: Executable, n_params: int, n_state: int = 0) -> dict[int, str]:
    """Phase of every scheduled step's node (see the module docstring).

    ``exe`` must compute ``TrainingGraph.outputs``: the output, then
    ``n_params`` parameter gradients (then possibly the input gradient),
    then ``n_state`` state updates (forward values).
    Backward-filter is the smallest set holding the parameter-gradient
    outputs and the :data:`FILTER_OPS` nodes, closed under adding a node
    whose readers are all in it and that either reads no backward node
    outside it (a ``Pad`` of a forward value before a weight gradient) or is
    read only by :data:`PASS_THROUGH_OPS` (a partial weight gradient). An
    activation's gradient (ReLU, pooling, data gradients) reads other
    backward nodes and feeds weight-gradient ops directly, so it stays in
    backward-data, even where, as below the first layer, only weight
    gradients read it.
    A slot (``Op.filled_by_reader``: the bias gradient a ``ReluBackwardSums``
    fills) is in its filler's phase, whatever reads it.
    """
    g = exe.graph
    forward = g.ancestors(exe.outputs[:1] + exe.outputs[len(exe.outputs) - n_state:])
    order = [st.node for st in exe.steps]
    backward = [n for n in order if n not in forward]
    bset = set(backward)
    name = {st.node: abstract_of(st.op).name for st in exe.steps}
    readers = {n: [u for u in g.users(n) if u in bset] for n in backward}
    grad_nodes = {v.node for v in exe.outputs[1:1 + n_params]}
    filt = {n for n in backward if n in grad_nodes or name[n] in FILTER_OPS}
    changed = True
    while changed:
        changed = False
        for n in reversed(backward):
            rs = readers[n]
            if n in filt or not rs or not all(r in filt for r in rs):
                continue
            inputs_in = all(i in filt for i in g.input_ids(n) if i in bset)
            partial = all(name[r] in PASS_THROUGH_OPS for r in rs)
            if inputs_in or partial:
                filt.add(n)
                changed = True
    phase = {n: "forward" if n in forward else "backward_filter" if n in filt else "backward_data"
             for n in order}
    # a slot's step (Op.filled_by_reader) allocates what its filler writes: in another phase, each
    # run of the slot's phase would give the filled value a fresh, unwritten buffer
    for st in exe.steps:
        for k in abstract_of(st.op).fills:
            slot = g.input_ids(st.node)[k]
            if slot in phase:
                phase[slot] = phase[st.node]
    return phase


@attrs.frozen
class Schedule:
    """The compiled steps grouped for timing (buffers are never freed).

    Attributes:
        steps: every step, in schedule order.
        phases: phase -> its steps in schedule order.
        layers: layer name -> phase -> the steps of that layer in that phase
            (conv/linear layers only; a phase a layer lacks is absent).
    """

    steps: tuple[Step, ...]
    phases: Mapping[str, tuple[Step, ...]]
    layers: Mapping[str, Mapping[str, tuple[Step, ...]]]


def schedule(exe: Executable, tg: TrainingGraph) -> Schedule:
    """Group ``exe``'s steps by phase and by layer (see :class:`Schedule`)."""
    phase = classify(exe, len(tg.grads), len(tg.state))
    steps = tuple(attrs.evolve(st, free=()) for st in exe.steps)
    phases = {p: tuple(st for st in steps if phase[st.node] == p) for p in PHASES}
    layers: dict[str, dict[str, list[Step]]] = {name: {} for name in tg.layers}
    for st in steps:
        layer = layer_of(st.name)
        if layer in layers:
            layers[layer].setdefault(phase[st.node], []).append(st)
    return Schedule(steps, phases,
                    {k: {p: tuple(v[p]) for p in PHASES if p in v} for k, v in layers.items()})


def main_step(steps) -> Step | None:
    """The conv/linear/matmul step among a layer's steps in one phase (not its
    pad or bias), or None."""
    for st in steps:
        if st.op.family in LAYER_FAMILIES:
            return st
    return None


class PhaseRunner:
    """Runs and times the phases of one compiled training graph.

    Args:
        sched: the grouped steps (:func:`schedule`).
        slots: source values by node id (``Executable.feed``); the runner
            fills in every other node's value.
        timer: the clock (:mod:`.timer`).
    """

    def __init__(self, sched: Schedule, slots: dict, timer: Timer):
        self.sched, self.slots, self.timer = sched, slots, timer
        self.replays: dict = {}  # phase -> GraphReplay, once graph_phases has run

    def run(self, steps) -> None:
        """Run ``steps`` in order on the live values."""
        slots = self.slots
        for st in steps:
            slots[st.node] = run_step(st, slots)

    def graph_phases(self, stream) -> dict:
        """Phase -> its steps as a :class:`~opgraph.graph_replay.GraphReplay`
        (phases without steps left out), built in phase order so that a later
        phase captures the arrays an earlier one writes. Call inside ``with
        stream:`` (a non-default stream), after the eager timings: the replays
        rebind ``slots`` to the arrays they captured, which live in the
        replays' private pools, so the runner keeps the replays (``replays``)
        for as long as it lives.

        Raises:
            RuntimeError: the replays were built already (a second build would
                capture arrays of the first one's pools).
        """
        from opgraph.graph_replay import GraphReplay

        if self.replays:
            raise RuntimeError("this runner's phases are already captured; use a new PhaseRunner")
        self._fill()
        self.graph_stream = stream
        for p in PHASES:
            if self.sched.phases[p]:
                self.replays[p] = GraphReplay(self.sched.phases[p], self.slots, run_step, stream)
        return self.replays

    def replay_all(self) -> None:
        """One replay of every phase, in phase order, on the capture stream,
        then a synchronisation (:meth:`graph_phases` first)."""
        with self.graph_stream:
            for replay in self.replays.values():
                replay()
            self.graph_stream.synchronize()

    def time_graphed_phases(self, repeat: int, warmup: int) -> tuple[dict, dict]:
        """Each phase replayed as CUDA graphs (:meth:`graph_phases`): ``warmup``
        untimed replays of all phases, then each phase timed in its own loop
        of ``repeat`` calls, on a new non-default stream. The replays stay
        open (:meth:`replay_all`, :meth:`close_replays`).

        Returns:
            ``(timings, summary)``: phase -> Timing (None for a phase without
            steps), and phase -> the replay's summary (graphs, captured and
            eager steps with the reason of each eager one, private pool bytes).
        """
        from opgraph.graph_replay import capture_stream, release_cached

        self.timer.synchronize()  # the eager work on the default stream is done
        release_cached()  # room for the private pools: the default pool's cache is not theirs
        stream = capture_stream()
        with stream:
            replays = self.graph_phases(stream)
            release_cached()  # the eager arrays the replays rebound are cached, unused
            for _ in range(warmup):
                self.replay_all()
            out = {p: (Timing(self.timer.measure(replays[p], label=p + " (CUDA graph)", repeat=repeat))
                       if p in replays else None) for p in PHASES}
        return out, {p: r.summary() for p, r in replays.items()}

    def close_replays(self) -> None:
        """Drop the graphs and the pools' unused blocks now (``slots`` stays valid
        while the runner lives: the replays keep their pools)."""
        for replay in self.replays.values():
            replay.close()

    def warmup(self, n: int) -> None:
        """``n`` untimed iterations of forward + backward (the seed's dry runs),
        then a synchronisation."""
        if n < 0:
            raise ValueError(f"warmup={n}: must be >= 0")
        for _ in range(n):
            self.run(self.sched.steps)
        self.timer.synchronize()

    def _fill(self) -> None:
        """One untimed iteration if some value a phase reads is missing
        (``warmup(0)``): each phase runs on the values of the others."""
        if not all(st.node in self.slots for st in self.sched.steps):
            self.run(self.sched.steps)
            self.timer.synchronize()

    def time_phases(self, repeat: int) -> dict[str, Timing | None]:
        """Each phase timed in its own loop of ``repeat`` calls; None for a phase
        without steps (e.g. backward-data of a single-layer model)."""
        self._fill()
        out: dict[str, Timing | None] = {}
        for p in PHASES:
            steps = self.sched.phases[p]
            out[p] = Timing(self.timer.measure(lambda s=steps: self.run(s), label=p, repeat=repeat)) \
                if steps else None
        return out

    def time_layers(self, repeat: int) -> dict[str, dict[str, Timing]]:
        """Each conv/linear layer's steps of each phase timed alone in a loop."""
        self._fill()
        out: dict[str, dict[str, Timing]] = {}
        for layer, by_phase in self.sched.layers.items():
            out[layer] = {p: Timing(self.timer.measure(lambda s=steps: self.run(s),
                                                       label=f"{layer}/{p}", repeat=repeat))
                          for p, steps in by_phase.items()}
        return out


__all__ = ["applied_layout", "PHASES", "LAYER_FAMILIES", "LAYER_OPS", "FILTER_OPS", "PASS_THROUGH_OPS", "TrainingGraph",
           "training_graph", "random_feeds", "buffer_feeds", "layer_of", "classify", "Schedule", "schedule",
           "main_step", "run_step", "PhaseRunner"]
