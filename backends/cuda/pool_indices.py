"""CuPy kernels of max pooling that saves each window's winner as a 1-byte index.

The oracle and the motivation: ``reference/pool_indices.py``. Two kernels,
built on :mod:`.pool`'s (same thread layout, geometry arguments, index
width, ``specialize`` variant, bfloat16 through its bits with the
``LD``/``ST`` macros, float16 computed in float32):

* :func:`max_pool2d_with_indices`: one thread per output cell scans its
  window as ``MaxPool2d``'s kernel does (first in-bounds cell, then a
  strictly greater value or the first NaN replaces it: SEMANTICS.md's
  first-maximum rule, padding never winning) and stores the window's maximum
  and its winner's row-major window index ``(h - h0) * kw + (w - w0)`` as a
  uint8: reads x once, writes y and idx once;
* :func:`max_pool2d_backward_indices`: one thread per input cell gathers
  ``gy`` of every window covering it whose saved index names it (no atomics,
  deterministic, overlapping windows summed in float32): reads idx and gy,
  writes gx, once each; x is not read.

NCHW and NHWC (a channels-last view) run without a transpose; outputs come
back in the input's layout (idx in x's, gx in idx's).
"""

from __future__ import annotations

from ..reference.pool import PoolGeometry
from ..reference.pool_indices import backward_shape, check_window
from .pool import _MAX, _WINDOWS, _computable, _finish, _geo, _out, _prepare, _run, _storage
from .storage import bits, in_layout, logical, physical

#: Forward: the maximum as ``MaxPool2d``, its winner's window index as a byte.
_MAX_IDX = _MAX.replace("STORE", "idx[t] = (unsigned char)((win / W - h0) * kw + (win % W - w0));")

#: Backward: (a, b) is the input cell; in window (oh, ow) it sits at row
#: a + pt - oh * sh, column b + pl - ow * sw.
_IDX_BWD = _WINDOWS + """
    for (IDX oh = oh0; oh <= oh1; ++oh)
        for (IDX ow = ow0; ow <= ow1; ++ow) {
            const IDX o = oc + oh * oh_ + ow * ow_;
            if ((IDX)idx[o] == (hp - oh * sh) * kw + (wp - ow * sw)) acc += LD(gy[o]);
        }
    ST(gx[xc + a * xh + b * xw], acc);
"""


def max_pool2d_with_indices(xp, x, g: PoolGeometry, specialize: bool = False):
    """``(y, idx)``: max pooling of ``(N, C, H, W)`` x (x's dtype and layout)
    and each window's winner, uint8 ``(N, C, oh, ow)`` in x's layout.

    Raises:
        ParameterError: a window of more than 256 cells. ShapeError: x not 4-D.
    """
    check_window(g)
    buf, cl, dtype = _prepare(xp, x, "max_pool2d_with_indices")
    n, c = x.shape[:2]
    y = _out(xp, buf, n, c, g.out, cl)
    idx = _out(xp, buf, n, c, g.out, cl, xp.uint8)
    if y.size:
        _run("maxpool_idx", "raw T x", [buf.ravel()], "raw T y, raw uint8 idx", [y.ravel(), idx.ravel()],
             _MAX_IDX, _geo(c, g, cl, g.out), size=y.size, arrays=(buf, y), storage=_storage(dtype),
             specialize=specialize)
    return _finish(xp, y, cl, dtype), logical(idx, cl)


def max_pool2d_backward_indices(xp, idx, gy, g: PoolGeometry, input_shape, specialize: bool = False):
    """Input gradient of max pooling from the saved winners: ``input_shape``
    in gy's dtype, idx's layout.

    Raises:
        ShapeError: idx and gy differ in shape or are not the pooled shape.
    """
    shape = backward_shape(idx, gy, g, input_shape)
    ib, cl = physical(xp, idx)  # copied only when neither NCHW- nor NHWC-dense
    gb = _computable(xp, in_layout(xp, bits(xp, gy), cl))
    gx = _out(xp, gb, shape[0], shape[1], shape[2:], cl)
    if gx.size:
        _run("maxpool_idx_bwd", "raw T gy, raw uint8 idx", [gb.ravel(), ib.ravel()], "raw T gx", [gx.ravel()],
             _IDX_BWD, _geo(shape[1], g, cl, shape[2:]), size=gx.size, arrays=(gb, gx),
             storage=_storage(gy.dtype), specialize=specialize)
    return _finish(xp, gx, cl, gy.dtype)


__all__ = ["max_pool2d_with_indices", "max_pool2d_backward_indices"]
