"""A layer norm's data gradient that also writes its weight gradient (Ba et al., "Layer
Normalization", 2016; the formulas: ``layer_norm.py`` and ``backends/cuda/codegen/layer_norm.py``).

``LayerNormBackwardScale(x, gy) = sum(gy * xhat)`` over the leading axes needs each row's
statistics, which ``LayerNormBackwardData(gy, x, weight)`` computes in the same rows while the
row is on chip (``kernels.row_sweep``); computed apart it reads x for the statistics, then x and
gy again (ConvNeXt-tiny bf16 on the H100: 23 steps, 1.07 ms at 47 % of the copy bandwidth). A
node has one output, so, as ``relu_bias_sums.py`` does (``Op.fills``), the fuse pass's
``ln-backward-sums`` rule (``passes/fuse_ln_backward_sums.py``) writes instead

* ``dw = LayerNormBackwardScaleSlot(gy, x)``: the weight gradient's buffer, ``normalized_shape``
  in x's dtype; its step only allocates (``Op.filled_by_reader``); its value is
  ``LayerNormBackwardScale(x, gy)`` (note the order: gy first, as the filler reads them);
* ``dx = LayerNormBackwardDataSums(gy, x, weight, dw)``: ``LayerNormBackwardData(gy, x, weight)``,
  and it fills ``dw`` with the weight gradient (float32 sums of half storage rounded once, as
  ``LayerNormBackwardScale``). Both take the pair's ``normalized_shape`` and ``eps``.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from ..errors import ShapeError
from .layer_norm import (LayerNormBackwardData, LayerNormBackwardScale, _LayerNormFamily, data_gradient_vjp,
                         scale_vjp)


@attrs.frozen
class LayerNormBackwardScaleSlot(_LayerNormFamily):
    """The buffer of ``LayerNormBackwardScale(x, gy)``: (gy, x) of x's shape -> ``normalized_shape``
    in x's dtype. Its step only allocates; the one :class:`LayerNormBackwardDataSums` reading it
    fills it. Its value, for the reference kernels and the checks, is that weight gradient.

    Raises:
        ShapeError: x not ending with ``normalized_shape``, gy of another shape, not floating
        point, or mixed dtypes (``LayerNormBackwardScale``'s checks).
    """

    arity: ClassVar = (2, 2)
    fused: ClassVar[bool] = True
    filled_by_reader: ClassVar[bool] = True
    kind: ClassVar[str] = "layer_norm_backward_scale_slot"

    def infer(self, gy, x):
        return LayerNormBackwardScale(**self.params()).infer(x, gy)

    def bytes_moved(self, types, out) -> int:
        """Nothing: the step allocates."""
        return 0

    def vjp(self, node, v, wanted):
        gy, x = node.inputs
        d_x, d_gy = scale_vjp(self, node.graph, x, gy, v, wanted[::-1])
        return (d_gy, d_x)


@attrs.frozen
class LayerNormBackwardDataSums(_LayerNormFamily):
    """``LayerNormBackwardData(gy, x, weight)``: (gy, x, weight, dw) -> x's shape, that also fills
    ``dw`` (input 3, a :class:`LayerNormBackwardScaleSlot` of the same gy and x, the same
    parameters) with ``LayerNormBackwardScale(x, gy)``.

    Raises:
        ShapeError: the data gradient's shape errors, or dw not ``normalized_shape`` in x's dtype.
    """

    arity: ClassVar = (4, 4)
    fused: ClassVar[bool] = True
    fills: ClassVar = (3,)
    kind: ClassVar[str] = "layer_norm_backward_data_sums"

    def infer(self, gy, x, weight, dw):
        out = LayerNormBackwardData(**self.params()).infer(gy, x, weight)
        want = LayerNormBackwardScale(**self.params()).infer(x, gy)
        if (dw.shape, dw.dtype) != (want.shape, want.dtype):
            raise ShapeError(f"{self.name}: dw {dw.shape} {dw.dtype} must be {want.shape} {want.dtype}")
        return out

    def filled_slot(self, position: int):
        """Input 3: the weight gradient's slot, reading gy and x (inputs 0 and 1)."""
        return LayerNormBackwardScaleSlot(**self.params()), (0, 1)

    def flops(self, types, out) -> int:
        """The data gradient's and the weight gradient's, as the two ops count them."""
        gy, x, weight, dw = types
        return (LayerNormBackwardData(**self.params()).flops((gy, x, weight), out)
                + LayerNormBackwardScale(**self.params()).flops((x, gy), dw))

    def bytes_moved(self, types, out) -> int:
        """gy, x and weight read, dx and dw written."""
        gy, x, weight, dw = types
        return gy.nbytes + x.nbytes + weight.nbytes + out.nbytes + dw.nbytes

    def vjp(self, node, v, wanted):
        return (*data_gradient_vjp(self, node.graph, node.inputs[:3], v, wanted[:3]), None)


__all__ = ["LayerNormBackwardScaleSlot", "LayerNormBackwardDataSums"]
