"""The ``codegen`` kernels of the layer norm's data gradient that fills its weight gradient
(``opgraph/ops/layer_norm_sums.py``, the fusion rule ``ln-backward-sums``).

``LayerNormBackwardDataSums(gy, x, weight, dw)`` runs as the data gradient's one-kernel row sweep
that also sums the weight gradient's terms per column over each block's rows, then a fixed-order
finish over the blocks into ``dw`` (``codegen.plan._filled``, ``codegen.kernels.row_sweep``).
Its rule's check (``codegen_rules._data_sums_check``) declines the node where that plan cannot
run on the node's types (rows past
``plan.ROW_SWEEP_VECTORS`` vectors a thread, a split row, ``plan.ROW_SWEEP`` off), so the fuse pass
keeps the pair apart there; where it cannot run on the arrays of one call only (an unaligned
buffer changing the vector width, a view), the kernel runs the two ops' own generated kernels
instead: the same values, never a wrong number.

``LayerNormBackwardScaleSlot``'s step only allocates. Importing this module needs neither CuPy
nor a GPU.
"""

from __future__ import annotations

from opgraph import ops
from opgraph.types import TensorType

from .codegen import launch
from .codegen.ir import PlanError


def data_sums_kernel(ctx, op, gy, x, weight, dw):
    """``LayerNormBackwardDataSums`` node: dx returned (a new array), the weight gradient written
    into ``dw`` in place (module docstring)."""
    xp = ctx.xp
    out_type = ctx.out_type if ctx.out_type is not None else TensorType(x.shape, x.dtype.name)
    try:
        return launch.run(xp, op, [gy, x, weight, dw], out_type)
    except PlanError:  # these arrays take another plan: the pair's own kernels
        scale, data = ops.LayerNormBackwardScale(**op.params()), ops.LayerNormBackwardData(**op.params())
        launch.run(xp, scale, [x, gy], TensorType(dw.shape, dw.dtype.name), out=dw)
        return launch.run(xp, data, [gy, x, weight], out_type)


def scale_slot_kernel(ctx, op, gy, x):
    """``LayerNormBackwardScaleSlot`` node: a new uninitialised ``normalized_shape`` array in the
    node's dtype, which its ``LayerNormBackwardDataSums`` reader fills; no kernel runs."""
    out_type = ctx.out_type if ctx.out_type is not None else op.infer(*(TensorType(a.shape, a.dtype.name)
                                                                         for a in (gy, x)))
    return launch.empty(xp=ctx.xp, shape=out_type.shape, dtype=out_type.dtype)


__all__ = ["data_sums_kernel", "scale_slot_kernel"]
