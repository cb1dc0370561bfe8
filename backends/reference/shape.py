"""Reference (oracle) kernels of axis permutation and graph constants.

``transpose`` is NumPy's ``transpose`` (ONNX ``Transpose``:
``y.shape[i] = x.shape[perm[i]]``), returned as a fresh contiguous copy, never
a view, so an executor may overwrite any buffer. ``constant`` returns a fresh
copy of the array held by a ``Constant`` op, on the kernel's array module.
"""

from __future__ import annotations

from opgraph import ops
from opgraph.errors import ParameterError

from .kernel import reference


@reference(ops.Transpose)
def transpose(xp, x, *, perm):
    """``x.transpose(perm)``, contiguous.

    Args:
        x: any shape of rank ``len(perm)``.
        perm: a permutation of ``0 .. x.ndim - 1``.

    Returns:
        shape ``tuple(x.shape[p] for p in perm)``, x's dtype.

    Raises:
        ParameterError: ``perm`` is not a permutation of x's axes.
    """
    perm = tuple(int(p) for p in perm)
    if sorted(perm) != list(range(x.ndim)):
        raise ParameterError("perm", perm, f"must be a permutation of the {x.ndim} axes of {x.shape}")
    return x.transpose(perm).copy()


@reference(ops.Constant)
def constant(xp, *, value):
    """A fresh copy of ``value`` (a NumPy array) on the array module ``xp``."""
    return xp.array(value, copy=True)


__all__ = ["transpose", "constant"]
