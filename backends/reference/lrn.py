"""Reference (oracle) local response normalisation across channels.

The AlexNet / Caffe / cuDNN / ONNX form (SEMANTICS.md, Others)::

    d[n, c, ...] = k + alpha / size * sum_{j in W(c)} x[n, j, ...]^2
    y = x * d^(-beta)

with the window ``W(c) = c - floor((size-1)/2) .. c + ceil((size-1)/2)``,
both ends included, clipped to ``0 .. C-1``. For odd sizes the window is
centred; for even sizes it reaches one channel further up than down, which is
ONNX's ``LRN`` rule (PyTorch's ``local_response_norm`` pads the other way for
even sizes: ``c - size//2 .. c + (size-1)//2``). The sum is divided by
``size`` even where the window is clipped at the channel ends (Caffe, ONNX).

Sources: Krizhevsky et al., "ImageNet Classification with Deep Convolutional
Neural Networks", NIPS 2012, section 3.3; ONNX operator ``LRN``; Caffe
``LRNLayer`` (ACROSS_CHANNELS).

The windowed sum is a zero-padded ``sliding_window_view`` over the channel
axis (exact, unlike a difference of cumulative sums). fp16 computes in fp32.
"""

from __future__ import annotations

from opgraph import ops
from opgraph.errors import ParameterError, ShapeError
from opgraph.types import compute_dtype

from .kernel import reference


def _check(x, size):
    if isinstance(size, bool) or int(size) != size or size < 1:
        raise ParameterError("size", size, "must be an int >= 1")
    if x.ndim < 2:
        raise ShapeError(f"local_response_norm: x must be (N, C, ...), got shape {x.shape}")


def _window_sum(xp, v, before, after, size):
    """``out[:, c] = sum_{j = c - before .. c + after} v[:, j]`` (clipped),
    with ``before + after + 1 == size``."""
    pad = [(0, 0)] * v.ndim
    pad[1] = (before, after)
    buf = xp.pad(v, pad)
    return xp.lib.stride_tricks.sliding_window_view(buf, size, axis=1).sum(axis=-1)


def _denominator(xp, x, size, alpha, k):
    """``d = k + alpha/size * windowed sum of x^2`` and the window extents."""
    before, after = (size - 1) // 2, size // 2  # floor and ceil of (size-1)/2
    return k + (alpha / size) * _window_sum(xp, x * x, before, after, size), before, after


@reference(ops.LocalResponseNorm)
def local_response_norm(xp, x, *, size, alpha, beta, k):
    """LRN across channels: ``y = x / (k + alpha/size * sum_window x^2)^beta``.

    Args:
        xp: array module.
        x: ``(N, C, ...)`` (NCHW for convnets); channel axis 1.
        size: window length in channels (>= 1; even sizes follow ONNX).
        alpha, beta, k: the constants of the formula (PyTorch defaults
            1e-4, 0.75, 1.0).

    Returns:
        x's shape and dtype.

    Raises:
        ParameterError: size not an int >= 1.
        ShapeError: x has fewer than 2 dimensions.
    """
    _check(x, size)
    size = int(size)
    acc = x.astype(compute_dtype(xp, x.dtype), copy=False)
    d, _, _ = _denominator(xp, acc, size, alpha, k)
    return (acc * d ** (-beta)).astype(x.dtype, copy=False)


@reference(ops.LocalResponseNormBackward)
def local_response_norm_backward(xp, x, gy, *, size, alpha, beta, k):
    """Input gradient of :func:`local_response_norm` (exact, analytic).

    With ``y_c = x_c d_c^(-beta)`` and ``dd_c/dx_j = 2 alpha/size x_j`` for
    ``j in W(c)``::

        gx_j = gy_j d_j^(-beta)
               - 2 alpha beta / size * x_j * sum_{c : j in W(c)} gy_c x_c d_c^(-beta-1)

    and ``j in W(c)`` iff ``c in j - ceil((size-1)/2) .. j + floor((size-1)/2)``:
    the transposed window, the same sliding sum with its ends swapped.

    Args:
        x: the forward input ``(N, C, ...)``; gy: the output gradient, same
            shape. Others: as :func:`local_response_norm`.

    Returns:
        gy's shape, x's dtype.

    Raises:
        ShapeError: x and gy differ in shape.
    """
    _check(x, size)
    if tuple(gy.shape) != tuple(x.shape):
        raise ShapeError(f"local_response_norm_backward: gy has shape {gy.shape}, x has {x.shape}")
    size = int(size)
    dt = compute_dtype(xp, x.dtype)
    xa, ga = x.astype(dt, copy=False), gy.astype(dt, copy=False)
    d, before, after = _denominator(xp, xa, size, alpha, k)
    t = ga * xa * d ** (-beta - 1)
    back = _window_sum(xp, t, after, before, size)
    gx = ga * d ** (-beta) - (2.0 * alpha * beta / size) * xa * back
    return gx.astype(x.dtype, copy=False)


__all__ = ["local_response_norm", "local_response_norm_backward"]
