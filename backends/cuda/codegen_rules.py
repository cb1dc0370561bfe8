"""Registers the generated kernels (``backends/cuda/codegen``) as the ``codegen`` lowering.

Device ``cuda``; tags ``codegen``, ``generated`` and ``gpu`` (and ``fused``
for ``FusedElementwise``: ``Rule`` adds it from ``Op.fused``), so
``exclude=["codegen"]`` turns every generated kernel off and ``exclude=["fused"]``
the fused ones only. Two kinds:

* element-wise ops and their reductions (every op type of the expression
  table, and ``FusedElementwise``): ``codegen.launch.run``, one or a few
  kernels per node; the rule declines (with the generator's reason) a node
  it cannot plan: an op outside the table, integer storage, an operand that
  neither equals nor broadcasts to the iteration shape in a supported way;
* data movement (concat, slice, pad, their gradients, reshape, flatten,
  transpose): one generated strided copy per input
  (``codegen.movement``); a reshape of a C-ordered array is a view.

The default cuda order tries ``codegen`` before our hand-written ``cuda``
kernels (``passes/policy.py``): where both exist (ReLU, threshold and their
gradients, the bias gradient), the generated kernel moves the same bytes
with 16-byte accesses and stays capturable, and autotune may still pick the
hand-written one. Those decisions are keyed on the ``cuda`` kernels' code (its
fingerprint, ``kernel_sources``) and on the kernels the generator emits for the node, not on
the generator's code: it changes too often to re-tune every element-wise node after each edit
(the element-wise rules' variants function, ``codegen_sources.one_variant``). Importing this
module needs neither CuPy nor a GPU.
"""

from __future__ import annotations

from opgraph import ops
from opgraph.types import TensorType

from ..registry import Rule, register
from . import codegen_ln_sums, codegen_sources
from .codegen import launch, movement
from .codegen.expressions import EXPRESSIONS
from .codegen.ir import PlanError
from .codegen.plan import build, lower
from .codegen.storage import STORAGES

TAGS = frozenset({"codegen", "generated", "gpu"})

#: op type -> the input its generated kernel may write its output into
#: (an operand of the output's type whenever the op is well typed).
INPLACE = {
    **{t: 0 for t in (ops.Relu, ops.Threshold, ops.Hardtanh, ops.Hardsigmoid, ops.Hardswish, ops.Sigmoid,
                      ops.Silu, ops.Gelu, ops.Neg, ops.Dropout, ops.BiasAdd, ops.BatchNorm,
                      ops.BatchNormTraining, ops.BatchNormBackwardData, ops.BatchNormTrainingBackwardData,
                      ops.BatchNormTrainingBackwardDataFromSums)},
    **{t: 1 for t in (ops.ReluBackward, ops.ThresholdBackward, ops.HardtanhBackward, ops.HardsigmoidBackward,
                      ops.HardswishBackward, ops.SigmoidBackward, ops.SiluBackward, ops.GeluBackward,
                      ops.BatchNormRunningUpdate)},
    ops.Add: (0, 1),
}


def _types(arrays) -> tuple:
    return tuple(TensorType(a.shape, a.dtype.name) for a in arrays)


def _storage_reason(in_types, allowed=tuple(STORAGES)) -> str | None:
    bad = sorted({t.dtype for t in in_types if t.dtype not in allowed})
    if bad:
        return f"generated kernels take {', '.join(allowed)}; got {', '.join(bad)}"
    return None


def movement_check(op, in_types, device) -> str | None:
    """Copies move bits: any storage dtype, int64 (ONNX shape values) included."""
    return _storage_reason(in_types, (*STORAGES, "int64"))


def check(op, in_types, device, planner=build) -> str | None:
    """Why the generator cannot run this node, or None (the plan is built on
    the node's types: cheap, no source is emitted; ``planner``: ``plan.lower``
    where the launches themselves decide, as for a filled slot)."""
    why = _storage_reason(in_types)
    if why is None:
        try:
            planner(op, tuple(in_types), op.infer(*in_types))
        except PlanError as e:
            why = str(e)
    return why


def run_generated(ctx, op, *arrays, out=None):
    """The ``codegen`` kernel of an element-wise op or a fused program: the
    node's output (``ctx.out_type``, else the op's inferred type)."""
    out_type = ctx.out_type if ctx.out_type is not None else op.infer(*_types(arrays))
    return launch.run(ctx.xp, op, arrays, out_type, out=out)


def _movement(fn):
    """A rule kernel calling ``fn(xp, *arrays, **op.params(), layout=...)`` (the output's layout)."""
    def kernel(ctx, op, *arrays):
        layout = ctx.out_type.layout if ctx.out_type is not None else None
        return fn(ctx.xp, *arrays, **op.params(), layout=layout)
    kernel.__name__ = kernel.__qualname__ = f"codegen_{fn.__name__}"
    kernel.__doc__ = fn.__doc__
    return kernel


#: op types whose generated kernel writes its ``(K, C)`` rows into a column
#: slice of a wider buffer (``out=``, ``Rule.writes_strided_out``): batch
#: statistics homed in a zero-copy concat of statistics (``passes/share_bn_stats.py``),
#: which would otherwise be copied there, one small copy per feature map
STRIDED_OUT = frozenset({ops.BatchNormStats})
#: data-movement op type -> (kernel, ``Rule.output_view``): None for a kernel
#: whose output is always a new array (``fresh_output``), else when it is a view
#: of its input (decided from the types, as the kernel decides from the arrays)
MOVEMENT = {
    ops.Concat: (_movement(movement.concat), None),
    ops.Slice: (_movement(movement.slice_), None),
    ops.SliceBackward: (_movement(movement.slice_backward), None),
    ops.Pad: (_movement(movement.pad), None),
    ops.PadBackward: (_movement(movement.pad_backward), None),
    ops.Transpose: (_movement(movement.transpose), movement.transpose_view),  # passes/layout.py
    ops.Reshape: (_movement(movement.reshape), movement.reshape_view),
    ops.Flatten: (_movement(movement.flatten), movement.reshape_view),
}


def _data_sums_check(op, in_types, device) -> str | None:
    """The fused plan's launches on the node's types, buffers aligned (``codegen_ln_sums``)."""
    return check(op, in_types, device, planner=lower)


#: op type -> (node kernel, check) of the generated kernels that fill a slot input or only
#: allocate one (``ln-backward-sums``: ``codegen_ln_sums.py``), not :func:`run_generated`
SLOT_KERNELS = {
    ops.LayerNormBackwardDataSums: (codegen_ln_sums.data_sums_kernel, _data_sums_check),
    ops.LayerNormBackwardScaleSlot: (codegen_ln_sums.scale_slot_kernel, lambda op, types, device:
                                     _storage_reason(types)),
}


def register_rules() -> None:
    """Register every ``codegen`` rule (idempotent). All capture into CUDA
    graphs: a generated kernel's plan and scratch are made on its first
    (uncaptured) run, its shapes are launch arguments, a view is no launch."""
    for op_type, (kernel, op_check) in SLOT_KERNELS.items():
        register(Rule(op_type, "codegen", kernel, devices={"cuda"}, check=op_check, tags=TAGS,
                      variants=codegen_sources.one_variant(), fresh_output=True, capturable=True))
    for op_type in (t for t in (*EXPRESSIONS, ops.FusedElementwise) if t not in SLOT_KERNELS):
        register(Rule(op_type, "codegen", run_generated, devices={"cuda"}, check=check, tags=TAGS,
                      variants=codegen_sources.one_variant(), inplace=INPLACE.get(op_type), fresh_output=True,
                      capturable=True, writes_strided_out=op_type in STRIDED_OUT))
    for op_type, (kernel, view) in MOVEMENT.items():
        register(Rule(op_type, "codegen", kernel, devices={"cuda"}, check=movement_check, tags=TAGS,
                      fresh_output=view is None, capturable=True, **({"output_view": view} if view else {})))


register_rules()

__all__ = ["TAGS", "INPLACE", "STRIDED_OUT", "MOVEMENT", "SLOT_KERNELS", "check", "movement_check", "run_generated",
           "register_rules"]
