"""Axis permutation and graph constants.

``Transpose`` permutes axes (``y.shape[i] = x.shape[perm[i]]``, NumPy's
``transpose``, ONNX ``Transpose``); its gradient is the inverse permutation.

``Constant`` is a source-like op (no inputs) holding a fixed array: folded
ONNX ``Constant`` nodes, BatchNorm running statistics, the ``alpha``/``beta``
of ``Gemm``. Unlike a ``param`` source it is not fed and gets no gradient.
The array is copied and made read-only, so the op stays immutable; two
constants compare equal when dtype, shape and bytes match.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import numpy as np

from ..errors import ParameterError, ShapeError
from ..op import Op
from ..types import DTYPES, TensorType
from . import _fields as F


@attrs.frozen
class Transpose(Op):
    """``x.transpose(perm)``: ``y.shape[i] = x.shape[perm[i]]``."""

    perm: tuple = F.shape("perm")
    kind: ClassVar[str] = "transpose"
    family: ClassVar[str] = "tensor"

    def __attrs_post_init__(self):
        if sorted(self.perm) != list(range(len(self.perm))):
            raise ParameterError("perm", self.perm, "must be a permutation of 0..n-1")

    def infer(self, x):
        if len(self.perm) != x.ndim:
            raise ShapeError(f"parameter perm={self.perm}: has {len(self.perm)} entries for a "
                             f"{x.ndim}-D input {x.shape}")
        return TensorType(tuple(x.shape[p] for p in self.perm), x.dtype)

    def inverse(self) -> tuple[int, ...]:
        """The permutation undoing ``perm`` (``inv[perm[i]] = i``)."""
        inv = [0] * len(self.perm)
        for i, p in enumerate(self.perm):
            inv[p] = i
        return tuple(inv)

    def vjp(self, node, gy, wanted):
        return (node.graph.apply(Transpose, {"perm": self.inverse()}, [gy]),)


def _frozen_array(value) -> np.ndarray:
    arr = np.array(value)  # always a copy, so later edits of the caller's array cannot leak in
    if arr.dtype.kind in "iu":
        arr = arr.astype(np.int64)
    if arr.dtype.name not in DTYPES:
        raise ParameterError("value", f"<array {arr.dtype}{list(arr.shape)}>",
                             f"dtype must be one of {DTYPES}")
    arr.setflags(write=False)
    return arr


def _same_array(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@attrs.frozen
class Constant(Op):
    """A fixed array (no inputs): its own dtype and shape.

    Integer arrays are stored as int64; other dtypes must be one of
    ``opgraph.types.DTYPES``.
    """

    value: np.ndarray = attrs.field(kw_only=True, converter=_frozen_array,
                                    eq=attrs.cmp_using(eq=_same_array), hash=False, repr=False)
    arity: ClassVar = (0, 0)
    kind: ClassVar[str] = "constant"
    family: ClassVar[str] = "tensor"

    def infer(self):
        return TensorType(self.value.shape, self.value.dtype.name)

    def vjp(self, node, gy, wanted):
        return ()

    def describe(self) -> str:
        v = self.value
        if v.size <= 4:
            return f"Constant({np.array2string(v, separator=', ')}: {v.dtype.name})"
        return f"Constant({v.dtype.name}[{', '.join(map(str, v.shape))}])"
