"""Reference kernels of the ReLU gradient that writes its per-channel sums (``opgraph/ops/relu_bias_sums.py``).

``ReluBackwardSumsSlot(y, gy)``'s value is ``BiasAddBackward(ReluBackward(y, gy))`` (computed here:
a device step only allocates, and its ``ReluBackwardSums`` reader fills it);
``ReluBackwardSums(y, gy, sums)`` returns ``ReluBackward(y, gy)`` and writes those same sums into
``sums`` in place, in sums' dtype; like ``ReluBackward`` it may write the gradient into gy's
buffer (``out=``, an in-place step: ``Rule.inplace``), never into the slot. Both are
:mod:`.elementwise`'s kernels composed, so the values are theirs bit for bit (float32 sums of half
storage rounded once: SEMANTICS.md).
"""

from __future__ import annotations

from opgraph import ops

from .elementwise import bias_add_backward, relu_backward
from .kernel import reference_node


@reference_node(ops.ReluBackwardSumsSlot)
def relu_backward_sums_slot_kernel(ctx, op, y, gy):
    """``ReluBackwardSumsSlot`` node: ``(C,)`` in gy's dtype, the channel sums of the ReLU gradient."""
    return bias_add_backward(ctx.xp, relu_backward(ctx.xp, y, gy))


@reference_node(ops.ReluBackwardSums, inplace=1)  # into gy, as ReluBackward; never the (C,) slot
def relu_backward_sums_kernel(ctx, op, y, gy, sums, *, out=None):
    """``ReluBackwardSums`` node: ``ReluBackward(y, gy)`` returned (a new array, or ``out``: gy
    itself for an in-place step), its channel sums written into ``sums`` (the slot's value, sums'
    dtype kept). The sums are taken of the gradient as written, so gy overwritten changes nothing."""
    g = relu_backward(ctx.xp, y, gy, out=out)
    sums[...] = bias_add_backward(ctx.xp, g).astype(sums.dtype, copy=False)
    return g


__all__ = ["relu_backward_sums_slot_kernel", "relu_backward_sums_kernel"]
