"""The GEMM convolution of a 1x1 kernel without padding: no im2col.

Such a convolution (ResNet's bottleneck ends, MobileNet's and EfficientNet's
expansions and projections, DenseNet's bottlenecks) reads every input pixel
once, so im2col is the identity and its buffer is a copy of x for nothing.
Each direction is one product of the arrays as they are stored:

* x stored NCHW: ``x.reshape(N, G, C/G, H*W)`` is a view, so ``y = W @ x``
  batched over images and groups (backward-data ``gx = W^T @ gy``;
  backward-filter folds the images into the contracted dimension, one copy of
  each operand);
* x stored NHWC (:func:`opgraph.types.storage_order`) and one group: the
  buffer is the ``(N*H*W, C)`` matrix of pixels, so ``y = x W^T``, ``gx = gy W``
  and ``gw = gy^T x`` are plain GEMMs on the buffers, with no copy at all for a
  packed one (a strided view, such as a channel slice of a concat buffer, is
  copied packed first), and the result is returned NHWC, the layout its readers
  were planned for.

Why not im2col's path with the trivial window: on the H200 (2026-12-02, fp32
ResNet-50 NHWC) every 1x1 GEMM forward and backward-filter step the tuner
picked (23) failed its trial capture into a CUDA graph with "the current
stream is capturing, so H2D transfers are disallowed", while the GEMM
backward-data steps (no window view, no im2col copy) captured; this path
runs the products alone. Same products, same accumulation (fp32 for fp32 and
half storage, :mod:`.products`).

At stride s the kernel reads every s-th pixel, ``x[:, :, ::s, ::s]`` (``Ho =
(H-1)//s + 1`` rows of them), so the forward and the backward-filter are the
stride-1 products of that subsampled view (packed once), and the
backward-data scatters the stride-1 result into zeros at the same pixels.
ResNet-50's downsampling shortcuts are such convolutions; on the H200
(2026-12-02, fp32) their backward-filter through im2col was the last step of
the replay that failed capture ("H2D transfers are disallowed").
"""

from __future__ import annotations

import attrs

from opgraph.types import storage_order

from .products import INT32_LIMIT, matmul


def applies(g) -> bool:
    """Whether geometry ``g`` is a 1x1 kernel without padding, at any stride
    (dilation is moot for one tap), on a non-empty batch (batch 0 keeps the
    general path's explicit zeros)."""
    return g.n > 0 and g.kh == g.kw == 1 and all(tuple(p) == (0, 0) for p in g.padding)


def _strided(g) -> bool:
    return tuple(g.stride) != (1, 1)


def _dense(g):
    """The stride-1 geometry of the pixels a strided 1x1 kernel reads (module doc)."""
    return attrs.evolve(g, h=g.ho, w=g.wo, stride=(1, 1))


def _read_pixels(x, g):
    """``x[:, :, ::sh, ::sw]``: the ``(N, C, Ho, Wo)`` view of what the kernel reads."""
    return x[:, :, ::g.stride[0], ::g.stride[1]]


def _pixels(xp, a):
    """The ``(N*H*W, C)`` matrix of a channels-last ``(N, C, H, W)`` array: a view
    of a packed one, a packed copy of a strided one (a channel slice of an NHWC
    concat buffer)."""
    n, c, h, w = a.shape
    return xp.ascontiguousarray(a.transpose(0, 2, 3, 1)).reshape(n * h * w, c)


def _as_nchw_view(m, n, h, w):
    """The ``(N, C, H, W)``-shaped view of an ``(N*H*W, C)`` pixel matrix (NHWC storage)."""
    return m.reshape(n, h, w, m.shape[1]).transpose(0, 3, 1, 2)


def _one_gemm(g, *arrays) -> bool:
    """The NHWC case: one group, every operand channels-last, and the pixel
    count a 32-bit GEMM dimension."""
    return g.groups == 1 and g.n * g.h * g.w <= INT32_LIMIT and all(storage_order(a) == "NHWC" for a in arrays)


def forward(xp, x, wm, g):
    """``y (N, O, Ho, Wo)`` from ``x (N, C, H, W)`` and the weights as ``wm (G, O/G, C/G)``."""
    if _strided(g):
        return forward(xp, _read_pixels(x, g), wm, _dense(g))  # packed by the product's path
    if _one_gemm(g, x):
        return _as_nchw_view(matmul(xp, _pixels(xp, x), wm[0].T), g.n, g.h, g.w)
    y = xp.empty((g.n, g.groups, g.og, g.h * g.w), dtype=x.dtype)
    matmul(xp, wm, x.reshape(g.n, g.groups, g.cg, g.h * g.w), out=y)  # (G,Og,Cg) @ (N,G,Cg,L)
    return y.reshape(g.y_shape)


def backward_data(xp, gy, wm, g):
    """``gx (N, C, H, W)`` from ``gy (N, O, Ho, Wo)`` and ``wm (G, O/G, C/G)``."""
    if _strided(g):
        read = backward_data(xp, gy, wm, _dense(g))  # the gradient at the pixels read, 0 elsewhere
        if storage_order(read) == "NHWC":
            gx = xp.zeros((g.n, g.h, g.w, g.c), dtype=read.dtype).transpose(0, 3, 1, 2)
        else:
            gx = xp.zeros(g.x_shape, dtype=read.dtype)
        _read_pixels(gx, g)[...] = read
        return gx
    if _one_gemm(g, gy):
        return _as_nchw_view(matmul(xp, _pixels(xp, gy), wm[0]), g.n, g.h, g.w)
    gx = matmul(xp, xp.swapaxes(wm, 1, 2), gy.reshape(g.n, g.groups, g.og, g.h * g.w))  # (N,G,Cg,L)
    return gx.reshape(g.x_shape)


def backward_filter(xp, x, gy, g):
    """``gw (G, O/G, C/G)`` from ``x (N, C, H, W)`` and ``gy (N, O, H, W)``: the
    images folded into the contracted dimension."""
    if _strided(g):
        return backward_filter(xp, _read_pixels(x, g), gy, _dense(g))
    if _one_gemm(g, x, gy):
        return matmul(xp, _pixels(xp, gy).T, _pixels(xp, x))[None]  # (O, N*L) @ (N*L, C)
    G, L = g.groups, g.h * g.w
    a = xp.ascontiguousarray(gy.reshape(g.n, G, g.og, L).transpose(1, 2, 0, 3)).reshape(G, g.og, g.n * L)
    b = xp.ascontiguousarray(x.reshape(g.n, G, g.cg, L).transpose(1, 0, 3, 2)).reshape(G, g.n * L, g.cg)
    return matmul(xp, a, b)


def workspace(direction: str, g, layout: str | None, itemsize: int) -> int:
    """Scratch bytes of one call: none for NHWC with one group (views of the
    buffers); a copy of each operand for backward-filter otherwise. The packing
    copy of a strided view is not counted: the types do not say which operand
    will arrive as a zero-copy view. At a stride, add the packed pixels read
    (forward, backward-filter) or the gradient at them (backward-data)."""
    read = g.n * g.c * g.ho * g.wo * itemsize if _strided(g) else 0
    g = _dense(g) if _strided(g) else g
    if layout == "NHWC" and g.groups == 1:
        return read
    if direction == "backward_filter":
        return read + (g.c + g.o) * g.n * g.h * g.w * itemsize
    return read


__all__ = ["applies", "forward", "backward_data", "backward_filter", "workspace"]
