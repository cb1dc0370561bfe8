"""Correctness before timing: every lowering checked against the float64 reference.

The reference is the training graph compiled with the ``reference`` pipeline
(the NumPy/CuPy oracle for every node) in float64, run once per model and
input on the timing device (:class:`Reference`); every lowering of that model
is checked against the same values.

**Per node, not end to end.** SEMANTICS.md states its tolerances per
operation (relative error ``||out - ref|| / ||ref||``: fp32 1e-4 for exact
summation, 1e-3 for FFT/Winograd/cuDNN, TF32 5e-3, bf16/fp16 1e-2;
``passes.autotune.tolerance``). A whole model compounds rounding through
its depth and some gradients are sums with heavy cancellation: on AlexNet at
batch 2 the first convolution's weight gradient differs from the float64
value by 1e-2 in relative terms even with the exact (direct) algorithm in
fp32, so an end-to-end threshold could not tell a wrong kernel from an
ill-conditioned sum. So :func:`check_lowering` runs each step of the
lowering that the lowering decides (the convolution ops, the fused ones included (the
forward with its epilogue, backward-data with its ReLU gradient, the
generated element-wise chains), the
``Pad`` / ``PadBackward`` nodes legalize puts around
convolutions, ``Linear``, ``MatMul``, ``BiasAddBackward``, the ``pool-scan``
rule's ``MaxPool2dScan``, the ``relu-bias-sums`` rule's ``ReluBackwardSums`` and the
``ln-backward-sums`` rule's ``LayerNormBackwardDataSums``, whose
filled slots (``Op.fills``) are checked as a second result against their own values)
on the float64
reference values of its inputs, rounded to the graph's dtype and stored in
its layout, and compares its output with the reference value of that node.

**Sums that cancel.** A value that is 0 in exact arithmetic (the gradient of
the bias of a batch norm read only through a convolution and another
training-form batch norm: the batch mean removes any per-channel shift, as
in MobileNet-v2's projections) is, in float64 and in float32 alike, rounding
noise of the terms it sums, so its error relative to its own norm is
meaningless (~1). Every checked op is a sum of products of its inputs
(multilinear; ReLU of one for the fused convolution), and rounding its
inputs moves each output by about ``u * sqrt(sum of the squared terms)``:
the reference kernel applied to the squared inputs gives those sums of
squares. So a step that fails against ``||ref||`` is measured against
``max(||ref||, ||sqrt(op(x1^2, x2^2, ...))||)`` (:func:`term_scale`) instead;
for sums without cancellation the two norms are about equal (for terms of
random signs ``||ref||`` is that root-sum-of-squares), so the check is as strict.

Which reference value a lowered node has (:func:`abstract_twin`): the passes
keep node ids, so a node of the same op family as the abstract node of its
id has that node's value (legalize's padded convolution computes what the
unpadded one did; its ``PadBackward`` crop takes the backward-data node's id
and value); a fused convolution takes its convolution's id but computes the
value of the last node of the chain it absorbed (the ``Relu`` or ReLU6 that
read it, through the residual ``Add``; backward-data's ``ReluBackward``),
found by following its epilogue's steps; a ``FusedElementwise`` node (the
fuse pass's element-wise chains) takes its chain's last node's id and
value, computed, when the reference did not keep it, by the members' own
reference kernels over the unfused graph; a node the passes added
gets its value from the reference kernels applied to its inputs' values.

**Masks a fused chain recomputes.** ``bn-gradient-remat`` makes chains that
recompute an activation from its input and mask a gradient with it (a ReLU6
of a batch norm's output, recomputed from the batch norm's input ``x`` in the
backward). Fed the reference ``x`` rounded to the storage dtype, such a chain
flips the mask wherever the exact pre-activation lies within rounding of a
bound, and each flip passes or stops a whole gradient element: on bf16
MobileNet-v2 at batch 2 the sums of 0.1 % of such passes were off by 1.4 %
against the exact mask (the forward made the same flips from the same
rounded ``x``, so a run is consistent). Without the chain the mask came
from the stored activation, the reference's rounded, whose sign rounding
keeps; in float32 a single flip among 10^5 elements moves such a sum by
1e-3, ten times the exact algorithms' tolerance. So a chain with a gradient
step whose input it computes itself (:func:`recomputes_a_gradient_input`)
is held to its members' reference kernels in float64 on the rounded
operands it was fed: its own arithmetic, without the flips of its inputs'
rounding. That does not check that the chain's members compute what the
unfused graph did (a rule recomputing the wrong activation would pass
here): the fusion rule's tests do, comparing whole training steps with and
without it against float64 (``tests/passes/test_remat_bn_gradient.py``).
Pooling, ReLU and LRN run the same kernels in every column and are
covered by their own tests against the reference.

The end-to-end relative errors of the model output, of each parameter
gradient and of the state updates (new running statistics; from a real run
of the compiled graph) are reported beside it; only a non-finite value
there fails the check.
"""

from __future__ import annotations

import math
import time

import attrs

import opgraph as og
from opgraph.backends.registry import KernelContext, rules_for
from opgraph.executable import Executable
from opgraph.op import Source, abstract_of
from opgraph.ops import Add, BatchNorm, ReluBackward, ThresholdBackward, of_family
from opgraph.ops.activation import ActivationBackward
from opgraph.ops.conv_fused import activation_of, epilogue_steps
from opgraph.passes.autotune import relative_error, tolerance
from opgraph.passes.autotune_accuracy import filled_error, poisoned_copy
from opgraph.types import FLOAT_DTYPES, as_dtype, is_float, run_type, to_layout

from . import reference_store as store
from .protocol import LAYER_FAMILIES, TrainingGraph

#: Abstract ops whose steps the per-node check runs (see the module docstring).
CHECKED_OPS = frozenset({t.__name__ for f in LAYER_FAMILIES for t in of_family(f)}
                        | {"Pad", "PadBackward", "BiasAddBackward", "FusedElementwise", "MaxPool2dScan",
                           "ReluBackwardSums", "LayerNormBackwardDataSums"})
#: (lowered op, abstract op at the same node id) pairs computing the same value.
_SAME_VALUE = {("PadBackward", "Conv2dBackwardData"), ("MaxPool2dTake", "MaxPool2d"), ("MaxPool2dScan", "MaxPool2d"),
               ("ReluBackwardSums", "ReluBackward"), ("ReluBackwardSums", "ThresholdBackward"),  # at threshold 0
               ("ReluBackwardSumsSlot", "BiasAddBackward"),
               ("LayerNormBackwardDataSums", "LayerNormBackwardData"),
               ("LayerNormBackwardScaleSlot", "LayerNormBackwardScale"),
               ("BatchNormTrainingBackwardDataFromSums", "BatchNormTrainingBackwardData"),
               ("BatchNormBackwardSumsRow", "BatchNormTrainingBackwardScale"), ("BatchNormBackwardSumsRow", "BiasAddBackward")}
_REFERENCE_ALGORITHMS = ("reference", "direct")
#: End to end, a value whose reference norm is below this fraction of its group's
#: (all gradients, all state updates) is vanishing: 0 but for rounding (:func:`end_to_end`).
#: The float64 reference keeps such a value near 1e-16 of the group (MobileNet-v2: 1e-16
#: to 1e-18), while real gradients that small relative to the others do occur (1e-7).
VANISHING = 1e-12


class Reference:
    """Float64 values of a training graph on one set of feeds.

    Keeps the value of every node :func:`check_lowering` reads or compares
    (checked nodes, their inputs, the sources, the outputs) and frees the
    others as the run goes, so memory stays near the float64 size of those.
    Each kept value goes to :attr:`values` when the run frees it: on the
    device up to ``device_budget`` bytes, in host memory past them
    (:mod:`.reference_store`); the outputs stay on the device whatever the
    budget.

    Args:
        device_budget: bytes of kept values the device may hold; None:
            :func:`.reference_store.device_budget` (a share of a GPU's
            memory, no limit on the CPU).

    Attributes:
        values: abstract node id -> float64 array (a
            :class:`.reference_store.ValueStore`: read, a value is on the device).
        outputs: float64 output, parameter gradients and state updates,
            ``tg.outputs`` order.
        n_state: how many of ``outputs`` (the last ones) are state updates.
        seconds: wall time of compiling and running the reference.
    """

    def __init__(self, tg: TrainingGraph, feeds: dict, device: str, device_budget: int | None = None):
        t0 = time.perf_counter()
        exe = og.compile(tg.outputs, device=device, pipeline="reference", dtype="float64")
        self.xp, self.device = exe.xp, exe.device
        g = tg.model.graph
        keep = {v.node for v in exe.outputs}
        for st in exe.steps:
            name = abstract_of(st.op).name
            if name in CHECKED_OPS:
                keep.add(st.node)
                keep.update(g.input_ids(st.node))
            if abstract_of(st.op).family == "conv":  # what a fused convolution reads and is compared with
                keep.update(_epilogue_nodes(g, st.node))
        budget = store.device_budget(self.device) if device_budget is None else device_budget
        self.values = store.ValueStore(self.device, budget)
        slots = exe.feed(feeds)
        keep.update(slots)  # the sources, in float64
        for st in exe.steps:
            slots[st.node] = st.kernel(st.ctx, st.op.op, *[slots[a] for a in st.args])
            for f in st.free:
                value = slots.pop(f, None)
                if f in keep and value is not None:
                    self.values.put(f, value)
        outputs = {v.node for v in exe.outputs}
        for n, value in slots.items():  # never freed: the outputs (and sources no step reads)
            if n in keep:
                self.values.put(n, value, on_device=n in outputs)
        self.graph = g
        self.outputs = [self.values[v.node] for v in exe.outputs]
        self.names = tg.output_names
        self.n_state = len(tg.state)
        self.seconds = time.perf_counter() - t0


def _epilogue_nodes(graph, node: int) -> set[int]:
    """The nodes a fused convolution at ``node`` may absorb (its ``Add``, ReLU,
    ReLU6 and ``ReluBackward`` readers, and the activations reading such an
    ``Add``) and their inputs (the residual, the ReLU output a mask reads)."""
    chain = set()
    for u in graph.users(node):
        op = graph.node(u).op
        if isinstance(op, (Add, ReluBackward)) or activation_of(op):
            chain.add(u)
        if isinstance(op, Add):
            chain.update(v for v in graph.users(u) if activation_of(graph.node(v).op))
    return chain | {i for u in chain for i in graph.input_ids(u)}


@attrs.define
class CheckResult:
    """Outcome of :func:`check_lowering` (JSON form: :meth:`as_dict`)."""

    passed: bool
    nodes_checked: int
    max_rel_error: float | None
    worst_node: str | None
    failures: list[dict]
    end_to_end: dict = attrs.field(factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return attrs.asdict(self)


def _reference_kernel(op):
    rules = rules_for(type(op))
    for algo in _REFERENCE_ALGORITHMS:
        if algo in rules:
            return rules[algo].kernel
    raise KeyError(f"no reference rule for {op.name}")


def _storage(runs, st) -> str:
    """The least precise float dtype step ``st`` reads or writes: a float32 sum
    of bf16 operands (a batch norm's backward sums, fused with the chain that
    makes its gradient) keeps their rounding, 2^-9 relative for a sum of
    terms of random sign, so it is held to bf16's tolerance, not float32's."""
    dtypes = [runs[n].dtype for n in (st.node, *st.args) if is_float(runs[n].dtype)]
    return min(dtypes, key=FLOAT_DTYPES.index, default=runs[st.node].dtype)  # least precise first


def recomputes_a_gradient_input(op) -> bool:
    """Whether ``op`` is a ``FusedElementwise`` with a gradient step (an
    activation's, ReLU's or threshold's) whose input 0, the value its mask
    or derivative reads, is computed by the chain itself (module docstring)."""
    program = getattr(op, "program", None)
    if program is None:
        return False
    gradients = (ActivationBackward, ReluBackward, ThresholdBackward)
    return any(isinstance(s.op, gradients) and s.args[0] >= program.n_inputs for s in program.steps)


def abstract_twin(lowered_graph, abstract_graph, nid: int) -> int | None:
    """The abstract node whose value lowered node ``nid`` computes, or None
    for a node the passes added (see the module docstring)."""
    if not abstract_graph.nx.has_node(nid):
        return None
    view = lowered_graph.node(nid)
    low, orig = abstract_of(view.op).name, abstract_graph.node(nid).op.name
    folded = _folded_batch_norm(lowered_graph, abstract_graph, nid)
    if folded is not None:  # the convolution computes the batch norm's value (passes/fold_bn.py)
        nid = folded
        if low == orig:
            return nid
    if isinstance(view.op, Source) or low == orig or (low, orig) in _SAME_VALUE:
        return nid
    op = abstract_of(view.op)
    if op.fused and op.family == "conv":
        node = nid
        for step in epilogue_steps(op, len(view.inputs)):
            node = node if step == "bias" else _epilogue_reader(abstract_graph, node, step)
            if node is None:
                return None
        return node
    if low == "FusedElementwise" and len(op.program.outputs) == 1:  # its chain's last node, whose id it took
        return nid
    if (low, orig) == ("MaxPool2dBackwardIndices", "MaxPool2dBackward") and not op.masked:  # pool-argmax
        return nid
    if (low, orig) == ("MaxPool2dBackwardRelu", "MaxPool2dBackward") or (
            (low, orig) == ("MaxPool2dBackwardIndices", "MaxPool2dBackward") and op.masked):  # the ReluBackward absorbed
        x = abstract_graph.input_ids(nid)[0]
        masks = [u for u in abstract_graph.users(nid) if abstract_graph.node(u).op.name == "ReluBackward"
                 and abstract_graph.input_ids(u)[0] == x]
        return masks[0] if len(masks) == 1 else None
    return None


def _folded_batch_norm(lowered_graph, abstract_graph, nid: int) -> int | None:
    """The abstract ``BatchNorm`` that convolution ``nid`` absorbed by folding it
    into its weights (``passes/fold_bn.py``: the weights it reads are a
    ``Reshape`` of a ``BatchNormBackwardData``), or None."""
    if abstract_of(lowered_graph.node(nid).op).family != "conv":
        return None
    ids = lowered_graph.input_ids(nid)
    weight = lowered_graph.node(ids[1]) if len(ids) > 1 else None
    if weight is None or abstract_of(weight.op).name != "Reshape" or not lowered_graph.input_ids(weight.id):
        return None
    if abstract_of(lowered_graph.node(lowered_graph.input_ids(weight.id)[0]).op).name != "BatchNormBackwardData":
        return None
    norms = [u for u in abstract_graph.users(nid) if isinstance(abstract_graph.node(u).op, BatchNorm)]
    return norms[0] if len(norms) == 1 else None


def _epilogue_reader(graph, node: int, step: str) -> int | None:
    """The one reader of ``node`` that is the epilogue ``step`` (an ``Add``, the
    activation, or the ``ReluBackward`` masking it), or None."""
    def is_step(u):
        op = graph.node(u).op
        if step == "add":
            return isinstance(op, Add)
        if step == "drelu":
            return isinstance(op, ReluBackward) and graph.input_ids(u)[1] == node
        return activation_of(op) == step

    found = [u for u in graph.users(node) if is_step(u)]
    return found[0] if len(found) == 1 else None


def term_scale(xp, op, kctx, inputs) -> float:
    """``||sqrt(op(x1^2, x2^2, ...))||`` for a multilinear ``op`` (a sum of products
    of its inputs) on float64 ``inputs``: the norm of the root-sum-of-squares
    of the terms each output element sums, the scale of the rounding error a
    cancelling sum keeps (module docstring, "Sums that cancel")."""
    squares = _reference_kernel(op)(kctx, op, *[a * a for a in inputs])
    return float(xp.linalg.norm(xp.sqrt(xp.abs(squares)).ravel()))


def check_lowering(exe: Executable, ref: Reference) -> CheckResult:
    """Check each lowering-decided step of ``exe`` on the reference inputs
    (module docstring); tolerance per step from its algorithm, its
    ``precision`` option (fp32 when it takes none) and the graph's dtype."""
    t0 = time.perf_counter()
    g, xp = exe.graph, ref.xp
    memo: dict[int, object] = {}
    unfused: dict[int, object] = {}

    def unfused_value(nid: int):
        """Abstract node ``nid``'s value by the reference kernels of the unfused graph."""
        if nid in ref.values:
            return ref.values[nid]
        if nid not in unfused:
            view = ref.graph.node(nid)
            kctx = KernelContext(xp, ref.device, {}, run_type(view.type, "float64"))
            unfused[nid] = _reference_kernel(view.op)(kctx, view.op, *map(unfused_value, ref.graph.input_ids(nid)))
        return unfused[nid]

    def expected(nid: int):
        if nid in memo:
            return memo[nid]
        twin = abstract_twin(g, ref.graph, nid)
        have = ref.values.get(twin) if twin is not None else None
        if have is None and twin is not None and abstract_of(g.node(nid).op).name == "FusedElementwise":
            have = memo[nid] = unfused_value(twin)  # the members' own kernels, not the fused op's oracle
        if have is not None and tuple(have.shape) == g.node(nid).type.shape:
            return have
        op = abstract_of(g.node(nid).op)  # from the reference kernel on its inputs' values
        kctx = KernelContext(xp, ref.device, {}, run_type(g.node(nid).type, "float64"))
        memo[nid] = _reference_kernel(op)(kctx, op, *[expected(i) for i in g.input_ids(nid)])
        return memo[nid]

    runs = exe.types  # compile's dtype applied (run_types.py), not the graph's declared types

    def operand(nid: int):
        t = runs[nid]
        a = expected(nid)
        if is_float(t.dtype):
            a = as_dtype(xp, a, t.dtype)
        return to_layout(xp, a, t.layout)

    def filled_value(slot: int):
        """A slot's value from the operands its filler was fed (rounded to the storage dtype):
        window indices move where rounding makes a tie, so the unrounded value is no oracle."""
        view = g.node(slot)
        sop = abstract_of(view.op)
        fed = [as_dtype(xp, operand(i), "float64") if is_float(runs[i].dtype) else operand(i)
               for i in g.input_ids(slot)]
        kctx = KernelContext(xp, ref.device, {}, run_type(view.type, "float64"))
        return _reference_kernel(sop)(kctx, sop, *fed)

    failures, worst, worst_err, checked = [], None, -1.0, 0
    for st in exe.steps:
        op = abstract_of(st.op)
        if op.name not in CHECKED_OPS or op.filled_by_reader:  # a slot: its filler is checked (Op.fills)
            continue
        view = g.node(st.node)
        ins = [operand(a) for a in st.args]
        for k in op.fills:  # the step writes these: a poisoned copy, checked below like the output
            ins[k] = poisoned_copy(ins[k])
        out = st.kernel(st.ctx, st.op.op, *ins)
        if recomputes_a_gradient_input(st.op.op):  # on the operands it was fed (module docstring)
            kctx = KernelContext(xp, ref.device, {}, run_type(view.type, "float64"))
            fed = [as_dtype(xp, a, "float64") if is_float(runs[i].dtype) else a for a, i in zip(ins, st.args)]
            want = _reference_kernel(st.op.op)(kctx, st.op.op, *fed)
        else:
            want = expected(st.node)
        err = relative_error(xp, out, want)
        runs_in = runs[st.node].dtype
        tol = tolerance(st.op.algorithm, st.op.option_dict.get("precision", "fp32"), _storage(runs, st))
        if err > tol:  # measured on the terms' scale where the sum cancels (module docstring)
            op = abstract_of(st.op)
            kctx = KernelContext(xp, ref.device, {}, run_type(view.type, "float64"))
            norm = float(xp.linalg.norm(want.ravel()))
            scale = term_scale(xp, op, kctx, [expected(i) for i in g.input_ids(st.node)])
            if scale > norm:
                err = err * (norm if norm > 0 else 1.0) / scale
        got = getattr(getattr(out, "dtype", None), "name", runs_in)
        if got != runs_in:  # right values in another dtype would change every later value
            err = math.nan
        for k in op.fills:
            filled = filled_error(xp, ins[k], filled_value(st.args[k]))
            err = math.nan if math.isnan(filled) or math.isnan(err) else max(err, filled)
        checked += 1
        if math.isnan(err) or err > worst_err:
            worst, worst_err = st.name, (math.inf if math.isnan(err) else err)
        if not err <= tol:  # NaN fails
            failures.append({"node": st.name, "op": abstract_of(st.op).name,
                             "algorithm": st.op.algorithm, "rel_error": None if math.isnan(err) else err,
                             "tolerance": tol,
                             **({"dtype": f"returns {got}, the node's type is {runs_in}"}
                                if got != runs_in else {})})
        del out, ins, want  # a host-held value read back is a copy: gone before the next step reads its own
        # Values the reference does not keep, computed for this step, go with it: kept for the whole
        # check they held about 42 GB of float64 on ConvNeXt-tiny at batch 128 (the bias adds, GELUs and
        # GELU gradients of the chains bias-remat makes, which reshapes keep from any checked op) and
        # ran an 80 GB H100 out of memory. A later step reading one again recomputes it from kept
        # values (a short chain: the reference keeps every checked node and its inputs).
        memo.clear()
        unfused.clear()
    return CheckResult(passed=not failures, nodes_checked=checked,
                       max_rel_error=None if worst is None or math.isinf(worst_err) else worst_err,
                       worst_node=worst, failures=failures, seconds=time.perf_counter() - t0)


def end_to_end(xp, outputs, ref: Reference) -> dict:
    """Relative errors of a real run's outputs against the reference: the
    model output, the largest over the parameter gradients and which one,
    with state updates the largest over them (``max_state``, ``worst_state``),
    and whether every value is finite. ``outputs`` may stop before the state
    updates (a peer computing the output and the gradients only).

    A gradient (or state value) whose reference norm is below
    :data:`VANISHING` times its group's norm (all gradients, all state
    updates) is left out of the largest and counted instead
    (``vanishing_grad``, ``vanishing_state``): it is 0 in exact arithmetic
    (module docstring, "Sums that cancel"; so is the running mean of a
    bias-free convolution of a batch norm's output), both sides hold
    rounding noise, and its relative error is ~1 or more whatever the
    lowering. Non-finite values count in ``finite`` all the same."""
    errs = [relative_error(xp, o, r) for o, r in zip(outputs, ref.outputs)]
    norms = [float(xp.linalg.norm(r.ravel())) for r in ref.outputs]
    split = len(ref.outputs) - ref.n_state
    bad = [n for n, e in zip(ref.names, errs) if math.isnan(e)]
    out = {"output": None if math.isnan(errs[0]) else errs[0]}
    for key, part in (("grad", slice(1, split)), ("state", slice(split, None))):
        group = list(zip(ref.names[part], errs[part], norms[part]))
        if key == "state" and not group:
            continue
        floor = VANISHING * math.sqrt(sum(n * n for _, _, n in group))
        kept = [(name, e) for name, e, n in group if n >= floor]
        worst = max(kept, key=lambda t: math.inf if math.isnan(t[1]) else t[1], default=(None, None))
        out[f"max_{key}"] = None if worst[1] is None or math.isnan(worst[1]) else worst[1]
        out[f"worst_{key}"] = worst[0]
        out[f"vanishing_{key}"] = len(group) - len(kept)
    return {**out, "finite": not bad, "non_finite": bad}


__all__ = ["CHECKED_OPS", "relative_error", "Reference", "CheckResult", "abstract_twin",
           "recomputes_a_gradient_input", "term_scale", "check_lowering", "end_to_end"]
