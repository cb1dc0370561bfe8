"""Reference (oracle) fully connected layer and 2-D matrix product.

``linear`` is ``torch.nn.functional.linear``: ``y = x @ w.T + b`` with ``w``
shaped ``(out_features, in_features)`` (SEMANTICS.md, Others). fp16 inputs
are multiplied in fp32 and rounded once at the end (SEMANTICS.md, Numbers).
"""

from __future__ import annotations

from opgraph.errors import ShapeError


def _acc(xp, dtype):
    return xp.float32 if dtype == xp.float16 else dtype


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
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ShapeError(f"linear: x {x.shape} and w {w.shape} must be (N, in) and (out, in)")
    if b is not None and tuple(b.shape) != (w.shape[0],):
        raise ShapeError(f"linear: b must have shape ({w.shape[0]},), got {b.shape}")
    dt = _acc(xp, x.dtype)
    y = x.astype(dt, copy=False) @ w.astype(dt, copy=False).T
    if b is not None:
        y = y + b.astype(dt, copy=False)
    return y.astype(x.dtype, copy=False)


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
    if a.ndim != 2 or b.ndim != 2:
        raise ShapeError(f"matmul: operands must be 2-D, got {a.shape} and {b.shape}")
    a2 = a.T if transpose_a else a
    b2 = b.T if transpose_b else b
    if a2.shape[1] != b2.shape[0]:
        raise ShapeError(f"matmul: inner extents differ: {a2.shape} @ {b2.shape} "
                         f"(transpose_a={transpose_a}, transpose_b={transpose_b})")
    dt = _acc(xp, a.dtype)
    return (a2.astype(dt, copy=False) @ b2.astype(dt, copy=False)).astype(a.dtype, copy=False)


__all__ = ["linear", "matmul"]
