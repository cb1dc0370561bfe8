"""The ``relu-bias-sums`` fusion rule: a ReLU gradient writes the bias gradient read from it.

``b = BiasAddBackward(g)`` with ``g = ReluBackward(y, gy)`` reads ``g`` once more after the
ReLU gradient wrote it, in a kernel of its own (GoogLeNet bf16 on the H200, 2026-12-04: 58 bias
gradients, 0.406 ms at 48 % of the copy bandwidth, most a few microseconds at the launch floor
of a replayed graph). ``g`` has other readers (the backward-data and backward-filter
convolutions), and a node has one output; so, as ``pool-scan`` does (``Op.fills``), the rule
makes the bias gradient a slot the ReLU gradient fills (``opgraph/ops/relu_bias_sums.py``):

* ``b`` becomes ``ReluBackwardSumsSlot(y, gy)``, whose step only allocates (same node, name,
  readers; a parameter gradient is an output, read after the step);
* ``g`` becomes ``ReluBackwardSums(y, gy, b)``: one pass that writes ``g`` and the float32 sums
  of each channel, rounded once into ``b``.

It applies when

* ``g``'s op is a ``ReluBackward``, or a ``ThresholdBackward`` with threshold 0 (of either sign:
  ``x > -0.0`` is ``x > 0``), which is the ReLU gradient of its input bit for bit (both select gy
  where ``x > 0``, else +0.0; ``backends/reference/elementwise.py``): the classifier layers of
  AlexNet, OverFeat and VGG-A, ``nn.Threshold(0, 1e-6)``, whose gradient and bias gradient ran
  1.6 and 3.0 microseconds at the launch floor on the H200 (2026-12-04), the gradient at 26-46 %
  of the copy bandwidth (not absorbed into a generated chain: the rule runs after
  ``elementwise``, so a ReLU gradient that a chain fused with its producer stays in it);
  ``b`` sums it, and ``g`` is an output or has another reader (else nothing would read the
  node that writes the sums);
* every reader of ``b`` descends from ``g`` by a path that does not pass through ``b``
  (``passes/verify.py``'s condition: none reads the sums before they are written); a graph
  that reads a bias gradient elsewhere (an optimiser step inside the graph reading it beside
  the weights) keeps that pair unfused;
* an algorithm has rules for both new ops that the policy does not exclude and that do not
  decline (the ``cuda`` rule declines values its fused path can never take: not 2-D or
  channels-last 4-D, a dtype without 16-byte lanes, channels not a multiple of the lanes;
  ``colsum_relu.declines_types``), the ReLU gradient's own first, then ``cuda``, and the
  policy forces neither node elsewhere;
* on the CPU's oracles, the policy opts in there (``include=['fused-reference']``): the sums
  in the ReLU gradient save no pass.

The rule is a default (``exclude=['relu-bias-sums']`` turns it off alone). It was opt-in until
its CUDA kernel (``backends/cuda/colsum_relu.py``), checked on the CPU's emulator, had run on a
GPU: on the H200 (2026-12-05) ``tests/gpu/test_relu_bias_sums_gpu.py`` passed, and with it and
``pool-scan`` bf16 whole-step times were equal or better on every model (GoogLeNet -4.9 %,
AlexNet -1.2 %, VGG-A -2.7 %), every per-node check passing.

Autotune checks each candidate's sums (a poisoned copy of the slot) against the float64
``BiasAddBackward(ReluBackward(y, gy))``, as it checks ``g``.
"""

from __future__ import annotations

from opgraph.graph import Graph, NodeView
from opgraph.op import abstract_of
from opgraph.ops import BiasAddBackward, ReluBackward, ReluBackwardSums, ReluBackwardSumsSlot, ThresholdBackward
from opgraph.types import run_type

from .base import PassContext
from .fuse_elementwise import OPT_IN, OPT_IN_HINT, oracle_waits
from .pattern import FusionRule, Match, Scope, lowered_slot_pair, rewrite_slot_pair, slot_match

NAME = "relu-bias-sums"
LABEL = "bias gradient(s) written by the ReLU gradient they sum"


def is_relu_gradient(op) -> bool:
    """Whether ``op`` computes ``ReluBackward`` of its two inputs exactly: a ``ReluBackward``, or a
    ``ThresholdBackward`` at threshold 0 (module docstring; any other threshold masks elsewhere)."""
    return type(op) is ReluBackward or (type(op) is ThresholdBackward and op.threshold == 0.0)


def match_relu_bias_sums(scope: Scope, view: NodeView) -> Match | None:
    """A bias gradient of a ReLU gradient (module docstring); ``data`` the ReLU gradient's id."""
    op = abstract_of(view.op)
    if type(op) is not BiasAddBackward or scope.algorithm(view.id) is None:
        return None
    (g,) = scope.graph.input_ids(view.id)
    if not is_relu_gradient(scope.op(g)) or scope.algorithm(g) is None:
        return None
    if oracle_waits(scope.ctx, scope.algorithm(g)):
        scope.note(NAME, f"on {scope.algorithm(g)} the sums in the ReLU gradient save no pass; "
                         f"{OPT_IN_HINT}", waits_for=OPT_IN)
        return None
    if not scope.is_output(g) and scope.readers(g) == [view.id]:  # the bias gradient alone reads g
        scope.note(NAME, "a ReLU gradient read by its bias gradient alone: fused, nothing would read "
                         f"the ReLU gradient that writes the sums ({scope.graph.node(g).name})")
        return None
    return slot_match(scope, NAME, LABEL, view.id, g, ('bias gradient', 'ReLU gradient'))


def _lowered_pair(graph: Graph, relu, bias, algorithms, ctx: PassContext):
    """``(slot, sums)`` lowered to the first of ``algorithms`` with rules for both that the
    policy forces neither node away from, or why not (the last algorithm's reason)."""
    # the values as they run (compile(dtype=...) applied): what the cuda rule's check reads
    y, gy, b = (run_type(v.type, ctx.dtype) for v in (*relu.inputs, bias))
    return lowered_slot_pair(graph, (ReluBackwardSumsSlot(), (y, gy), "bias gradient slot"),
                             (ReluBackwardSums(), (y, gy, b), "ReLU gradient writing its sums"),
                             [relu.id, bias.id], algorithms, ctx)


def fuse_relu_bias_sums(graph: Graph, m: Match, ctx: PassContext) -> str | None:
    """Rewrite bias gradient ``m.root`` and ReLU gradient ``m.data`` (module docstring); returns
    None when done, else why not (then nothing changed)."""
    bias, relu = graph.node(m.root), graph.node(m.data)
    y, gy = relu.inputs
    pair = _lowered_pair(graph, relu, bias, dict.fromkeys((relu.op.algorithm, "cuda")), ctx)
    return rewrite_slot_pair(graph, ctx, pair, bias, [y, gy], relu, [y, gy])


RELU_BIAS_SUMS = FusionRule(NAME, match_relu_bias_sums, fuse_relu_bias_sums)

__all__ = ["NAME", "LABEL", "is_relu_gradient", "match_relu_bias_sums", "fuse_relu_bias_sums", "RELU_BIAS_SUMS"]
