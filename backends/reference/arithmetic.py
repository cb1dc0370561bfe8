"""Reference (oracle) kernels of ``Div`` and ``Neg`` (ONNX ``Div``, ``Neg``).

Broadcasting is NumPy's (ONNX multidirectional broadcasting). Every kernel
takes the array module ``xp`` first and returns a fresh array.
"""

from __future__ import annotations

import numpy as np

from opgraph import ops
from opgraph.errors import ShapeError
from opgraph.types import compute_dtype

from .kernel import reference


@reference(ops.Div)
def div(xp, a, b):
    """``a / b`` with NumPy broadcasting, in a's dtype: IEEE division for floats
    (float32 arithmetic for half storage); truncation toward zero for integers
    (ONNX ``Div``; C's ``/``).

    Raises:
        ShapeError: the shapes do not broadcast.
    """
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise ShapeError(f"div: shapes {a.shape} and {b.shape} do not broadcast") from None
    if a.dtype.kind in "iu":
        q = xp.abs(a) // xp.abs(b)  # floor of the magnitudes = truncation of the quotient
        return xp.where((a < 0) != (b < 0), -q, q).astype(a.dtype, copy=False)
    dt = compute_dtype(xp, a.dtype)  # half precision divides in float32, rounds once
    return xp.true_divide(a.astype(dt, copy=False), b.astype(dt, copy=False)).astype(a.dtype, copy=False)


@reference(ops.Neg)
def neg(xp, x):
    """``-x``."""
    return xp.negative(x)


__all__ = ["div", "neg"]
