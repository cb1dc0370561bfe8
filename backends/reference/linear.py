"""Reference (oracle) fully connected layer and 2-D matrix product.

``linear`` is ``torch.nn.functional.linear``: ``y = x @ w.T + b`` with ``w``
shaped ``(out_features, in_features)`` (SEMANTICS.md, Others). fp16 inputs
are multiplied in fp32 and rounded once at the end (SEMANTICS.md, Numbers).
"""

from __future__ import annotations

from opgraph import ops
from opgraph.errors import ShapeError
from opgraph.types import compute_dtype

from .kernel import reference


def check_linear(x_shape, w_shape, b_shape=None) -> None:
    """Raise ShapeError unless x is ``(N, in)``, w ``(out, in)`` and b, when
    given, ``(out,)`` (``torch.nn.functional.linear``)."""
    if len(x_shape) != 2 or len(w_shape) != 2 or x_shape[1] != w_shape[1]:
        raise ShapeError(f"linear: x {tuple(x_shape)} and w {tuple(w_shape)} must be (N, in) and (out, in)")
    if b_shape is not None and tuple(b_shape) != (w_shape[0],):
        raise ShapeError(f"linear: b must have shape ({w_shape[0]},), got {tuple(b_shape)}")


def matmul_dims(a_shape, b_shape, transpose_a: bool, transpose_b: bool) -> tuple[int, int, int]:
    """``(M, K, P)`` of ``op(a) @ op(b)``, ``op`` a transpose where asked.

    Raises:
        ShapeError: not 2-D, or the inner extents differ.
    """
    if len(a_shape) != 2 or len(b_shape) != 2:
        raise ShapeError(f"matmul: operands must be 2-D, got {tuple(a_shape)} and {tuple(b_shape)}")
    m, k = (a_shape[1], a_shape[0]) if transpose_a else tuple(a_shape)
    kb, p = (b_shape[1], b_shape[0]) if transpose_b else tuple(b_shape)
    if k != kb:
        raise ShapeError(f"matmul: inner extents differ: op(a) is ({m}, {k}), op(b) is ({kb}, {p}) "
                         f"(transpose_a={transpose_a}, transpose_b={transpose_b})")
    return m, k, p


@reference(ops.Linear)
def linear(xp, x, w, b=None):
    """``x @ w.T + b``.

    Args:
        x: ``(N, in_features)``; w: ``(out_features, in_features)``;
        b: ``(out_features,)`` or None.

    Returns:
        ``(N, out_features)`` in x's dtype; with ``in_features == 0`` the
        product is 0 and the result is the bias broadcast over the batch.

    Raises:
        ShapeError: the shapes do not fit.
    """
    check_linear(x.shape, w.shape, None if b is None else b.shape)
    dt = compute_dtype(xp, x.dtype)
    y = x.astype(dt, copy=False) @ w.astype(dt, copy=False).T
    if b is not None:
        y = y + b.astype(dt, copy=False)
    return y.astype(x.dtype, copy=False)


@reference(ops.MatMul)
def matmul(xp, a, b, *, transpose_a, transpose_b):
    """``op(a) @ op(b)`` for 2-D arrays, ``op`` a transpose where asked.

    Args:
        a: ``(M, K)`` or ``(K, M)`` if transpose_a; b: ``(K, P)`` or
            ``(P, K)`` if transpose_b.

    Returns:
        ``(M, P)`` in a's dtype (zeros when ``K == 0``).

    Raises:
        ShapeError: not 2-D, or the inner extents differ.
    """
    matmul_dims(a.shape, b.shape, transpose_a, transpose_b)
    a2 = a.T if transpose_a else a
    b2 = b.T if transpose_b else b
    dt = compute_dtype(xp, a.dtype)
    return (a2.astype(dt, copy=False) @ b2.astype(dt, copy=False)).astype(a.dtype, copy=False)


__all__ = ["check_linear", "matmul_dims", "linear", "matmul"]
