"""Reference (oracle) kernel of ``FusedElementwise``: the members' own reference kernels, in order.

Each member op runs through its registered ``reference`` rule on the arrays
of its inputs (the node's inputs and earlier members' outputs), so the oracle
of a fused node is exactly the unfused chain and knows nothing of the code
generator. Several outputs are stacked (``opgraph/ops/fused.py``) in the
statistics dtype. Returns a fresh array.
"""

from __future__ import annotations

from opgraph import ops
from opgraph.ops.batchnorm_training import stats_dtype
from opgraph.types import numpy_dtype

from ..registry import KernelContext, lookup
from .kernel import reference_node


def run_program(ctx, program, arrays) -> list:
    """Every value of ``program`` (inputs, then each member's output) computed
    from ``arrays`` by the members' reference kernels on ``ctx.xp``."""
    values = list(arrays)
    member_ctx = KernelContext(ctx.xp, ctx.device)  # out_type None: each member infers its own
    for step in program.steps:
        kernel = lookup(type(step.op), "reference").kernel
        values.append(kernel(member_ctx, step.op, *(values[a] for a in step.args)))
    return values


@reference_node(ops.FusedElementwise)
def fused_elementwise(ctx, op, *arrays):
    """The program's output (one value), or its outputs stacked along a new
    leading axis in the statistics dtype (several)."""
    values = run_program(ctx, op.program, arrays)
    outs = [values[o] for o in op.program.outputs]
    if len(outs) == 1:
        out = outs[0]
        return out.copy() if any(out is a for a in arrays) else out
    dtype = numpy_dtype(stats_dtype(outs[0].dtype.name))
    return ctx.xp.stack([o.astype(dtype, copy=False) for o in outs])


__all__ = ["fused_elementwise", "run_program"]
