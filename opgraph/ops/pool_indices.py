"""Max pooling through saved winners: the argmax, the take and the gather (abstract).

Without them a max-pool gradient finds every window's winner again, scanning
``x`` a second time (``MaxPool2dBackward(x, gy)``). The fuse pass's
``pool-argmax`` rule (``passes/fuse_pool_argmax.py``) rewrites a pooling and
its gradient into

* ``idx = MaxPool2dArgmax(x)``: each window's winner as its row-major index
  ``p * kw + q`` inside the window, one ``uint8`` per output element (the
  scan, once per step);
* ``y = MaxPool2dTake(x, idx)``: ``x`` read at each window's winner (equal to
  ``MaxPool2d(x)``);
* ``gx = MaxPool2dBackwardIndices(idx, gy)``: each window's ``gy`` added at
  its winner (equal to ``MaxPool2dBackward(x, gy)``; ``x`` is not read).

The winner is ``MaxPool2dBackward``'s (SEMANTICS.md, Pooling): the first NaN
of the window if it holds one, else its first maximum in row-major order,
padding cells never winning. With ``relu`` the argmax also marks, by adding
:data:`MASKED` (128), every window whose winner is not ``> 0`` (0, negative,
NaN): the gather with ``masked`` routes nothing from those windows, which is
``ReluBackward(x, MaxPool2dBackward(x, gy))`` when ``x`` is a ReLU's output
(``MaxPool2dBackwardRelu``'s rule: the mask of the winner is the window's
maximum ``> 0``). A window therefore has at most 128 cells.

An index naming no input cell of its window (a padding cell, or past the
window; no argmax writes one) reads ``-inf`` in the take and receives nothing
in the gather, so no index reads outside ``x``. For the indices an argmax
writes, ``MaxPool2dTake(x, idx; masked)`` and ``MaxPool2dBackwardIndices(idx,
gy; masked)`` are each other's adjoints (in ``x`` and ``gy``), so second
derivatives go through them; the argmax is piecewise constant.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from ..errors import ParameterError, ShapeError
from ..op import require_ndim
from ..types import INDEX_DTYPES, TensorType
from . import _fields as F
from .pool import MaxPool2dBackward, _PoolOp

#: added to a window's index by ``MaxPool2dArgmax(relu=True)`` when its winner is not > 0
MASKED = 128
#: the most cells a window may have (its index, below :data:`MASKED`, fits 7 bits)
MAX_CELLS = MASKED
#: the dtype of the saved indices
INDEX_DTYPE = INDEX_DTYPES[0]


def window_params(op) -> dict:
    """The pooling window's fields of any pooling op (no flags, no shapes)."""
    return {name: getattr(op, name) for name in ("kernel_size", "stride", "padding", "ceil_mode")}


@attrs.frozen
class _SavedWinnersOp(_PoolOp):
    """A pooling op over saved window indices: its window has at most :data:`MAX_CELLS` cells."""

    fused: ClassVar[bool] = True

    def __attrs_post_init__(self):
        super().__attrs_post_init__()
        cells = self.kernel_size[0] * self.kernel_size[1]
        if cells > MAX_CELLS:
            raise ParameterError("kernel_size", self.kernel_size,
                                 f"has {cells} cells; a saved window index holds at most {MAX_CELLS}")


def _check_idx(op, idx: TensorType, pooled: tuple) -> None:
    if idx.dtype != INDEX_DTYPE:
        raise ShapeError(f"{op.kind}: the window indices are {idx.dtype}, not {INDEX_DTYPE}")
    if idx.shape != pooled:
        raise ShapeError(f"{op.kind}: window indices of shape {idx.shape} != pooled shape {pooled}")


@attrs.frozen
class MaxPool2dArgmax(_SavedWinnersOp):
    """Each window's winner: x (N, C, H, W) -> uint8 (N, C, Ho, Wo), plus
    :data:`MASKED` where ``relu`` and the winner is not > 0 (module docstring).

    Raises:
        ParameterError: a window of more than 128 cells. ShapeError: x not 4-D.
    """

    relu: bool = F.flag("relu")
    kind: ClassVar[str] = "max_pool2d_argmax"

    def infer(self, x):
        require_ndim(self, "input", x, 4)
        return TensorType(self.output_shape(x.shape), INDEX_DTYPE, x.layout)

    def vjp(self, node, gy, wanted):
        return (None,)  # piecewise constant


@attrs.frozen
class MaxPool2dTake(_SavedWinnersOp):
    """``x`` at each window's saved winner: (x, idx) -> pooled shape in x's
    dtype; with ``masked``, 0 where the index is marked. ``MaxPool2d(x)`` when
    ``idx`` is ``MaxPool2dArgmax(x)``.

    Raises:
        ShapeError: idx not uint8 of the pooled shape.
    """

    masked: bool = F.flag("masked")
    arity: ClassVar = (2, 2)
    kind: ClassVar[str] = "max_pool2d_take"

    def infer(self, x, idx):
        require_ndim(self, "input", x, 4)
        pooled = self.output_shape(x.shape)
        _check_idx(self, idx, pooled)
        return x.with_shape(pooled)

    def bytes_moved(self, types, out) -> int:
        """idx and one element of x per output element read, the output written."""
        x, idx = types
        return idx.nbytes + out.size * x.itemsize + out.nbytes

    def vjp(self, node, gy, wanted):
        x, idx = node.inputs
        if not wanted[0]:
            return (None, None)
        back = node.graph.apply(MaxPool2dBackwardIndices,
                                dict(window_params(self), masked=self.masked, input_shape=x.shape), [idx, gy])
        return (back, None)


@attrs.frozen
class MaxPool2dArgmaxSlot(_SavedWinnersOp):
    """The buffer of ``MaxPool2dArgmax(x; relu)``: uint8 of the pooled shape, in
    x's layout. Its step only allocates; the one :class:`MaxPool2dScan` reading
    it writes the winners, and its other readers (the gathers) run after that
    scan. Its value, for the reference kernels and the checks, is the argmax's.

    Raises:
        ParameterError: a window of more than 128 cells. ShapeError: x not 4-D.
    """

    relu: bool = F.flag("relu")
    filled_by_reader: ClassVar[bool] = True
    kind: ClassVar[str] = "max_pool2d_argmax_slot"

    def infer(self, x):
        require_ndim(self, "input", x, 4)
        return TensorType(self.output_shape(x.shape), INDEX_DTYPE, x.layout)

    def bytes_moved(self, types, out) -> int:
        """Nothing: the step allocates."""
        return 0

    def vjp(self, node, gy, wanted):
        return (None,)  # piecewise constant


@attrs.frozen
class MaxPool2dScan(_SavedWinnersOp):
    """Max pooling that saves its winners in the same scan: (x, slot) -> the
    pooled shape in x's dtype, equal to ``MaxPool2d(x)``, and it writes
    ``MaxPool2dArgmax(x; relu)`` into ``slot`` (input 1, a
    :class:`MaxPool2dArgmaxSlot` of the same window and ``relu``). One kernel
    in place of the argmax and the take (``passes/fuse_pool_scan.py``): x is
    read once, not twice.

    Raises:
        ShapeError: slot not uint8 of the pooled shape, or x not 4-D.
    """

    relu: bool = F.flag("relu")
    arity: ClassVar = (2, 2)
    fills: ClassVar = (1,)
    kind: ClassVar[str] = "max_pool2d_scan"

    def infer(self, x, slot):
        require_ndim(self, "input", x, 4)
        pooled = self.output_shape(x.shape)
        _check_idx(self, slot, pooled)
        return x.with_shape(pooled)

    def filled_slot(self, position: int):
        """Input 1: the argmax slot of this window and ``relu``, reading x (input 0)."""
        return MaxPool2dArgmaxSlot(**window_params(self), relu=self.relu), (0,)

    def bytes_moved(self, types, out) -> int:
        """x read once, the pooled value and the winners written."""
        x, slot = types
        return x.nbytes + out.nbytes + slot.nbytes

    def vjp(self, node, gy, wanted):
        # MaxPool2d's, which scans x again: a gather of the slot would be read before the scan
        # fills it whenever gy does not descend from this node (passes/verify.py refuses that)
        if not wanted[0]:
            return (None, None)
        return (node.graph.apply(MaxPool2dBackward, window_params(self), [node.inputs[0], gy]), None)


@attrs.frozen
class MaxPool2dBackwardIndices(_SavedWinnersOp):
    """Each window's ``gy`` added at its saved winner: (idx, gy) -> ``input_shape``
    in gy's dtype (overlapping windows summed in float32 for half storage);
    with ``masked``, marked windows route nothing.

    Raises:
        ShapeError: idx and gy not both the pooled shape of ``input_shape``,
        or idx not uint8.
    """

    masked: bool = F.flag("masked")
    input_shape: tuple = F.shape("input_shape")
    arity: ClassVar = (2, 2)
    kind: ClassVar[str] = "max_pool2d_backward_indices"

    def __attrs_post_init__(self):
        super().__attrs_post_init__()
        if len(self.input_shape) != 4:
            raise ParameterError("input_shape", self.input_shape, "must be NCHW (4 entries)")

    def infer(self, idx, gy):
        self._check_gy(self.input_shape, gy)
        _check_idx(self, idx, gy.shape)
        return TensorType(self.input_shape, gy.dtype, gy.layout)

    def vjp(self, node, v, wanted):
        idx, _ = node.inputs
        if not wanted[1]:
            return (None, None)
        x_like = node.graph.apply(MaxPool2dTake, dict(window_params(self), masked=self.masked), [v, idx])
        return (None, x_like)


__all__ = ["MASKED", "MAX_CELLS", "INDEX_DTYPE", "window_params", "MaxPool2dArgmax", "MaxPool2dTake",
           "MaxPool2dArgmaxSlot", "MaxPool2dScan", "MaxPool2dBackwardIndices"]
