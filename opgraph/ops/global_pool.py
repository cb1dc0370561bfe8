"""Global average pooling: the mean of every (H, W) plane.

``GlobalAvgPool2d``: (N, C, H, W) -> (N, C, 1, 1), ONNX ``GlobalAveragePool``
(Lin et al., "Network in Network", 2014, sec. 3.2). It equals ``AvgPool2d``
with a kernel the size of the input, but keeps no kernel size, so a graph
stays valid when the spatial size is known only at import. Its gradient
``GlobalAvgPool2dBackward`` spreads ``gy / (H*W)`` over the plane; the two are
each other's adjoints, so second derivatives work.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from ..errors import ShapeError
from ..op import Op, require_ndim
from ..types import TensorType
from . import _fields as F


@attrs.frozen
class GlobalAvgPool2d(Op):
    """Mean over each (H, W) plane: (N, C, H, W) -> (N, C, 1, 1)."""

    kind: ClassVar[str] = "global_avg_pool2d"
    family: ClassVar[str] = "global_pool"

    def infer(self, x):
        require_ndim(self, "input", x, 4)
        if x.shape[2] * x.shape[3] == 0:
            raise ShapeError(f"input {x.shape} has an empty (H, W) plane: nothing to average")
        return x.with_shape((*x.shape[:2], 1, 1))

    def vjp(self, node, gy, wanted):
        return (node.graph.apply(GlobalAvgPool2dBackward, {"input_shape": node.inputs[0].shape}, [gy]),)


@attrs.frozen
class GlobalAvgPool2dBackward(Op):
    """dL/dx of ``GlobalAvgPool2d``: gy (N, C, 1, 1) spread as ``gy / (H*W)`` over ``input_shape``."""

    input_shape: tuple = F.shape("input_shape")
    kind: ClassVar[str] = "global_avg_pool2d_backward"
    family: ClassVar[str] = "global_pool"

    def infer(self, gy):
        if len(self.input_shape) != 4:
            raise ShapeError(f"parameter input_shape={self.input_shape}: must be NCHW (4 entries)")
        want = (*self.input_shape[:2], 1, 1)
        if gy.shape != want:
            raise ShapeError(f"output gradient shape {gy.shape} != pooled shape {want}")
        return TensorType(self.input_shape, gy.dtype)

    def vjp(self, node, v, wanted):
        return (node.graph.apply(GlobalAvgPool2d, {}, [v]),)
