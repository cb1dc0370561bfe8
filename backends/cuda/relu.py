"""CuPy kernels of ReLU and threshold, forward and backward.

Each function mirrors its NumPy reference in ``opgraph.backends.reference.elementwise``
(same positional arrays, same keyword names as the op fields) and follows
``shared/design/SEMANTICS.md``:

* ReLU ``max(x, 0)`` with NaN propagating; its gradient is ``gy`` where
  ``x > 0``, else 0 (0 at exactly 0 and at NaN) -- a select, so an infinite
  ``gy`` at a blocked cell gives 0, not NaN;
* threshold ``x if x > threshold else value`` (``torch.nn.functional.threshold``).

The kernels keep the input's memory layout (NCHW or NHWC views). bfloat16 is
loaded and compared in float32 inside the kernel (:mod:`.storage`); an output
is an input element or a constant, copied as stored.
"""

from __future__ import annotations

import numpy as np

from opgraph.types import is_channels_last

from .storage import BF16, bits, dtype_name, elementwise_kernel, kernel_tag, same_shape, storage_preamble, unbits


def _zero(xp, a):
    return xp.zeros((), dtype=a.dtype)


def _memory_order(*arrays):
    """Views that index memory in order, and the map back to logical NCHW.

    A channels-last 4-D tensor is an NCHW-shaped view with strides
    ``(HWC, 1, WC, C)``; an element-wise kernel over such views pays a
    division per axis per element. When every operand is channels-last, the
    kernel runs over their NHWC (C-contiguous) views instead.
    """
    if all(is_channels_last(a) for a in arrays):
        return [a.transpose(0, 2, 3, 1) for a in arrays], lambda y: y.transpose(0, 3, 1, 2)
    return list(arrays), lambda y: y


# The zero is a literal, not a 0-d array argument: a broadcast operand can
# keep CuPy off its flat contiguous indexing path.
#: Bodies of the ReLU / threshold kernels. Only ``x`` (storage T) is loaded
#: (LD); an output is an input element or a constant, copied as stored -- for
#: bfloat16 its bits, ``(T)0`` / ``(G)0`` being +0.0 -- so nothing is rounded.
RELU_BODY = "y = (LD(x) > (CT)0 || LD(x) != LD(x)) ? x : (T)0"
RELU_BWD_BODY = "gx = (LD(x) > (CT)0) ? gy : (G)0"
THRESHOLD_BODY = "y = (LD(x) <= LD(t)) ? v : x"
THRESHOLD_BWD_BODY = "gx = (LD(x) > LD(t)) ? gy : z"


def relu(xp, x, *, out=None):
    """``max(x, 0)``, NaN propagating; any shape and float dtype (bfloat16
    included: compared in float32, stored bits copied), layout kept. Into
    ``out`` if given (x itself for an in-place step), which is returned."""
    dt = dtype_name(x.dtype)
    k = elementwise_kernel("relu" + kernel_tag(dt), "T x", "T y", RELU_BODY, storage_preamble(dt))
    if out is not None:
        (xm, om), _ = _memory_order(bits(xp, x), bits(xp, out))
        k(xm, om)
        return out
    (xm,), back = _memory_order(bits(xp, x))
    return unbits(back(k(xm, xp.empty_like(xm))), x.dtype)


def relu_backward(xp, x, gy, *, out=None):
    """``gy`` where ``x > 0``, else 0 (gradient 0 at exactly 0 and at NaN);
    gy's dtype (bfloat16: x compared in float32, gy's bits copied). Into
    ``out`` if given (gy itself for an in-place step), which is returned."""
    same_shape("relu_backward", x, gy)
    dt = dtype_name(x.dtype)
    k = elementwise_kernel("relu_bwd" + kernel_tag(dt), "T x, G gy", "G gx", RELU_BWD_BODY, storage_preamble(dt))
    if out is not None:
        (xm, gm, om), _ = _memory_order(bits(xp, x), bits(xp, gy), bits(xp, out))
        k(xm, gm, om)
        return out
    (xm, gm), back = _memory_order(bits(xp, x), bits(xp, gy))
    return unbits(back(k(xm, gm, xp.empty_like(gm))), gy.dtype)


def _constant(xp, value, dtype):
    """0-d array of ``value`` rounded to ``dtype``, in kernel storage (bfloat16:
    its bits, rounded on the host by ml_dtypes, nearest even). Made by a fill
    kernel (``full``), not a host-to-device copy, so that the step can be
    captured into a CUDA graph."""
    if dtype_name(dtype) == BF16:
        return xp.full((), int(np.asarray(value, dtype=dtype).view(np.uint16)), dtype=np.uint16)
    return xp.full((), np.asarray(value, dtype=dtype).item(), dtype=dtype)


def threshold(xp, x, *, threshold, value):
    """``x if x > threshold else value``; a NaN input propagates. The two
    constants are rounded to x's dtype first, as NumPy compares (bfloat16:
    compared in float32 on the rounded values)."""
    dt = dtype_name(x.dtype)
    k = elementwise_kernel("threshold" + kernel_tag(dt), "T x, T t, T v", "T y", THRESHOLD_BODY, storage_preamble(dt))
    (xm,), back = _memory_order(bits(xp, x))
    return unbits(back(k(xm, _constant(xp, threshold, x.dtype), _constant(xp, value, x.dtype),
                         xp.empty_like(xm))), x.dtype)


def threshold_backward(xp, x, gy, *, threshold):
    """``gy`` where ``x > threshold``, else 0; gy's dtype."""
    same_shape("threshold_backward", x, gy)
    dt = dtype_name(x.dtype)
    k = elementwise_kernel("threshold_bwd" + kernel_tag(dt), "T x, T t, G gy, G z", "G gx", THRESHOLD_BWD_BODY,
            storage_preamble(dt))
    (xm, gm), back = _memory_order(bits(xp, x), bits(xp, gy))
    return unbits(back(k(xm, _constant(xp, threshold, x.dtype), gm, _zero(xp, gm), xp.empty_like(gm))),
                  gy.dtype)


__all__ = ["RELU_BODY", "RELU_BWD_BODY", "THRESHOLD_BODY", "THRESHOLD_BWD_BODY", "relu", "relu_backward",
           "threshold", "threshold_backward"]
