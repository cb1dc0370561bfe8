"""Reference (oracle) element-wise kernels: ReLU, threshold, add, bias, dropout, zeros.

Every kernel takes the array module ``xp`` (numpy or cupy) first, returns a
fresh array (never a view of an input, so an executor may overwrite its
buffers) and computes in the input dtype. Rules: ``shared/design/SEMANTICS.md``
(Others).

Gradient masks use ``where`` rather than a multiplication by a 0/1 mask, so an
infinite output gradient at a blocked position gives 0, not ``inf * 0 = NaN``
(PyTorch's ``threshold_backward`` also selects).
"""

from __future__ import annotations

import numpy as np

from opgraph.errors import ShapeError


def relu(xp, x):
    """``max(x, 0)`` element-wise; NaN propagates (``maximum`` propagates NaN).

    Shapes: any; returns x's shape and dtype. Source: SEMANTICS.md (ReLU).
    """
    return xp.maximum(x, xp.zeros((), dtype=x.dtype))


def relu_backward(xp, x, gy):
    """``gy`` where ``x > 0``, else 0.

    The gradient at exactly 0 is 0 (SEMANTICS.md) and a NaN ``x`` gives 0
    (``NaN > 0`` is false), the rule fixed for the ``ReluBackward`` op.
    Shapes: x and gy alike; returns gy's dtype.
    """
    _same_shape("relu_backward", x, gy)
    return xp.where(x > 0, gy, xp.zeros((), dtype=gy.dtype))


def threshold(xp, x, *, threshold, value):
    """``torch.nn.functional.threshold``: ``x`` if ``x > threshold`` else ``value``.

    Written as ``where(x <= threshold, value, x)`` as PyTorch does, so a NaN
    input propagates (``NaN <= t`` is false); ``threshold(x, 0, 0)`` is ReLU.
    Returns x's shape and dtype.
    """
    return xp.where(x <= threshold, xp.asarray(value, dtype=x.dtype), x)


def threshold_backward(xp, x, gy, *, threshold):
    """``gy`` where ``x > threshold``, else 0 (the gradient does not depend on
    ``value``). A NaN ``x`` gives 0, as :func:`relu_backward`.
    """
    _same_shape("threshold_backward", x, gy)
    return xp.where(x > threshold, gy, xp.zeros((), dtype=gy.dtype))


def add(xp, a, b):
    """``a + b`` for two arrays of the same shape (no broadcasting).

    Raises:
        ShapeError: the shapes differ.
    """
    _same_shape("add", a, b)
    return a + b


def bias_add(xp, x, b):
    """``x + b`` with ``b`` of shape ``(C,)`` broadcast along axis 1 of
    ``x`` (``(N, C, ...)``).

    Raises:
        ShapeError: b is not ``(C,)``.
    """
    if b.ndim != 1 or x.ndim < 2 or b.shape[0] != x.shape[1]:
        raise ShapeError(f"bias_add: b must have shape ({x.shape[1] if x.ndim > 1 else '?'},) "
                         f"for x of shape {x.shape}, got {b.shape}")
    return x + b.reshape((1, -1) + (1,) * (x.ndim - 2))


def bias_add_backward(xp, gy):
    """Gradient of the bias of :func:`bias_add`: ``gy`` summed over every axis
    but 1, shape ``(C,)``; fp16 accumulates in fp32, the result has gy's
    dtype. A batch of size 0 gives zeros.
    """
    if gy.ndim < 2:
        raise ShapeError(f"bias_add_backward: gy must be at least 2-D, got shape {gy.shape}")
    acc = xp.float32 if gy.dtype == xp.float16 else gy.dtype
    axes = (0,) + tuple(range(2, gy.ndim))
    return gy.sum(axis=axes, dtype=acc).astype(gy.dtype, copy=False)


def dropout(xp, x, *, p, training, seed):
    """Inverted dropout.

    Not training (or ``p == 0``): a copy of x. Training: keep mask
    ``numpy.random.default_rng(seed).random(x.shape) >= p`` (drawn with NumPy
    on the host even for CuPy arrays, so the mask depends only on seed and
    shape, and the backward is this same function applied to ``gy``); kept
    cells are scaled by ``1 / (1 - p)``, dropped cells are 0 (an inf or NaN
    input at a dropped cell gives 0); ``p == 1`` gives zeros. ``p`` outside
    ``[0, 1]`` is checked by the op, not here.

    Source: Srivastava et al., "Dropout", JMLR 2014 (inverted scaling as in
    PyTorch). Returns x's shape and dtype.
    """
    if not training or p == 0:
        return x.copy()
    zero = xp.zeros((), dtype=x.dtype)
    if p >= 1:
        return xp.zeros_like(x)
    keep = xp.asarray(np.random.default_rng(seed).random(x.shape) >= p)
    return xp.where(keep, x * xp.asarray(1.0 / (1.0 - p), dtype=x.dtype), zero)


def zeros(xp, *, type):
    """Zeros of an ``opgraph.types.TensorType`` (its shape and dtype).

    Raises:
        TypeError: the dtype (bfloat16) has no ``xp`` counterpart.
    """
    try:
        dtype = np.dtype(type.dtype)  # CuPy takes NumPy dtypes
    except TypeError:
        raise TypeError(f"zeros: dtype {type.dtype!r} of {type} is not supported by {xp.__name__}") from None
    return xp.zeros(type.shape, dtype=dtype)


def _same_shape(what, a, b):
    if tuple(a.shape) != tuple(b.shape):
        raise ShapeError(f"{what}: shapes differ, {a.shape} and {b.shape}")


__all__ = ["relu", "relu_backward", "threshold", "threshold_backward", "add", "bias_add",
           "bias_add_backward", "dropout", "zeros"]
