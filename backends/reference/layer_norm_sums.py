"""Reference kernels of the layer norm's data gradient that fills its weight gradient
(``opgraph/ops/layer_norm_sums.py``).

``LayerNormBackwardScaleSlot(gy, x)``'s value is ``LayerNormBackwardScale(x, gy)`` (computed here: a
device step only allocates, and its ``LayerNormBackwardDataSums`` reader fills it);
``LayerNormBackwardDataSums(gy, x, weight, dw)`` returns ``LayerNormBackwardData(gy, x, weight)`` and
writes that weight gradient into ``dw`` in place, in dw's dtype. Both are :mod:`.layer_norm`'s
kernels composed, so the values are theirs bit for bit.
"""

from __future__ import annotations

from opgraph import ops

from .kernel import reference_node
from .layer_norm import layer_norm_backward_data, layer_norm_backward_scale


@reference_node(ops.LayerNormBackwardScaleSlot)
def layer_norm_backward_scale_slot_kernel(ctx, op, gy, x):
    """``LayerNormBackwardScaleSlot`` node: ``normalized_shape`` in x's dtype, the weight gradient."""
    return layer_norm_backward_scale(ctx.xp, x, gy, **op.params())


@reference_node(ops.LayerNormBackwardDataSums)
def layer_norm_backward_data_sums_kernel(ctx, op, gy, x, weight, dw):
    """``LayerNormBackwardDataSums`` node: dx returned (a new array), the weight gradient written
    into ``dw`` (the slot's value, dw's dtype kept)."""
    dw[...] = layer_norm_backward_scale(ctx.xp, x, gy, **op.params()).astype(dw.dtype, copy=False)
    return layer_norm_backward_data(ctx.xp, gy, x, weight, **op.params())


__all__ = ["layer_norm_backward_scale_slot_kernel", "layer_norm_backward_data_sums_kernel"]
