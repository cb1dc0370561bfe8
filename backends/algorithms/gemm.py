"""im2col + GEMM convolution, forward, backward-data and backward-filter.

The Caffe lowering (Jia 2014; Chellapilla, Puri & Simard 2006, "High performance
convolutional neural networks for document processing"): unfold every receptive
field into a column, ``cols[n, g, (c, p, q), (i, j)] = xpad[n, g, c, i*s_h + p*d_h,
j*s_w + q*d_w]``, so that

* forward is ``y = W @ cols``  with ``W`` the weights as ``(G, O/G, C/G*kH*kW)``;
* backward-data is ``cols = W^T @ gy`` followed by col2im, which adds each column
  back to the input cells it was read from (one strided add per kernel tap,
  ``kH*kW`` adds, much faster than ``np.add.at``);
* backward-filter is ``gw = gy @ cols^T``, the batch folded into the contracted
  dimension so it is one GEMM per group.

Groups are a batch axis of the matmul. Every shape form of SEMANTICS.md is
supported (stride, dilation, asymmetric padding, groups, batch 0); nothing is
declined on parameters: GEMM is the catch-all lowering.

Memory: the im2col buffer holds ``C*kH*kW*Ho*Wo`` elements per image. Images are
processed in batch chunks so that it stays under ``workspace_limit`` bytes
(default 2 GiB); a single image always runs even if it alone exceeds the limit.
Index safety: BLAS (cuBLAS in particular) takes 32-bit matrix dimensions, so
:func:`check` declines a node whose GEMM for one image has a dimension of 2^31
or more, and chunks keep the folded ``chunk*Ho*Wo`` dimension below 2^31.

Written against ``xp`` (NumPy or CuPy): only pad, reshape, transpose, strided
slicing, matmul and the stride-tricks view of :func:`window_view`. The
products go through :func:`.products.matmul`: NumPy's on the CPU; on CuPy our own
cuBLAS handle (``backends/cuda/cublas_batched.py``), because ``cupy.matmul``
of these batched operands cannot be captured into a CUDA graph (CuPy's cuBLAS
handle refuses stream capture, and the grouped weights broadcast over the
images made it upload arrays of pointers on every call).

A 1x1 convolution of stride 1 without padding needs no im2col at all
(:mod:`.gemm_pointwise`): each direction is one product of the input as it is
stored.
"""

from __future__ import annotations

from opgraph.errors import LoweringError

from . import gemm_pointwise as pointwise
from .products import INT32_LIMIT, matmul
from ..reference.conv import (check_gy, conv_geometry, geometry_of, pad_spatial, result_dtype,
                             tap_slices, window_view)

DEFAULT_WORKSPACE_LIMIT = 2 * 2**30  # bytes of im2col buffer per chunk


def gemm_dims(geom) -> dict[str, int]:
    """Matrix dimensions of the per-image, per-group GEMMs of the three directions."""
    return {"O/G": geom.og, "C/G*kH*kW": geom.cg * geom.kh * geom.kw, "Ho*Wo": geom.ho * geom.wo}


def limit_reason(geom) -> str | None:
    """Why the GEMM lowering cannot run this geometry (a 32-bit dimension overflow), or None."""
    for name, dim in gemm_dims(geom).items():
        if dim > INT32_LIMIT:
            return f"gemm: matrix dimension {name} = {dim} exceeds the 32-bit BLAS limit {INT32_LIMIT}"
    return None


def _require_limits(geom) -> None:
    reason = limit_reason(geom)
    if reason is not None:
        raise LoweringError(reason)


def col_bytes_per_image(geom, itemsize: int) -> int:
    """Bytes of one image's im2col buffer, ``C*kH*kW*Ho*Wo*itemsize``."""
    return geom.c * geom.kh * geom.kw * geom.ho * geom.wo * itemsize


def batch_chunk(geom, itemsize: int, workspace_limit: int = DEFAULT_WORKSPACE_LIMIT) -> int:
    """Images per chunk: as many as fit ``workspace_limit`` bytes of im2col buffer
    (at least 1), and few enough that ``chunk*Ho*Wo`` stays a 32-bit dimension."""
    per_image = max(col_bytes_per_image(geom, itemsize), 1)
    chunk = max(int(workspace_limit) // per_image, 1)
    chunk = min(chunk, max(INT32_LIMIT // max(geom.ho * geom.wo, 1), 1))
    return max(min(chunk, geom.n), 1)


def im2col(xp, x, geom):
    """Columns of a batch: ``x (n, C, H, W)`` -> ``cols (n, G, C/G*kH*kW, Ho*Wo)`` (a copy)."""
    n, G = x.shape[0], geom.groups
    xg = pad_spatial(xp, x, geom.padding).reshape(n, G, geom.cg, geom.hp, geom.wp)
    win = window_view(xp, xg, (geom.kh, geom.kw), geom.stride, geom.dilation)  # (n,G,Cg,Ho,Wo,kH,kW)
    return win.transpose(0, 1, 2, 5, 6, 3, 4).reshape(n, G, geom.cg * geom.kh * geom.kw, geom.ho * geom.wo)


def col2im(xp, cols, geom):
    """Adjoint of :func:`im2col`: ``cols (n, G, C/G*kH*kW, Ho*Wo)`` -> ``gx (n, C, H, W)``.

    Each kernel tap's columns go back to the strided rows/columns it read
    (:func:`tap_slices`), one add per tap; the padding border is then cropped.
    """
    n, G = cols.shape[0], geom.groups
    c6 = cols.reshape(n, G, geom.cg, geom.kh, geom.kw, geom.ho, geom.wo)
    gxp = xp.zeros((n, G, geom.cg, geom.hp, geom.wp), dtype=cols.dtype)
    for p in range(geom.kh):
        for q in range(geom.kw):
            rows, cs = tap_slices(geom, p, q)
            gxp[..., rows, cs] += c6[:, :, :, p, q]
    (t, _), (l, _) = geom.padding
    return gxp.reshape(n, geom.c, geom.hp, geom.wp)[..., t:t + geom.h, l:l + geom.w]


def conv2d_forward(xp, x, w, *, stride=1, padding=0, dilation=1, groups=1,
                   workspace_limit=DEFAULT_WORKSPACE_LIMIT):
    """``y = W @ im2col(x)``: convolution ``(N, C, H, W) * (O, C/G, kH, kW) -> (N, O, Ho, Wo)``
    of arrays outside a graph (validated by :func:`conv_geometry`); :func:`forward`
    runs a node on its geometry.

    Args:
        xp: array module; x, w: input and weight; stride, padding, dilation, groups:
            any form :func:`conv_geometry` accepts; workspace_limit: bytes of im2col
            buffer per batch chunk.

    Raises:
        ParameterError, ShapeError: bad parameters or shapes.
        LoweringError: a GEMM dimension of 2^31 or more (see :func:`limit_reason`).
    """
    g = conv_geometry(x.shape, w.shape, stride=stride, padding=padding, dilation=dilation, groups=groups)
    return forward(xp, x, w, g, workspace_limit=workspace_limit)


def forward(xp, x, w, g, *, workspace_limit=DEFAULT_WORKSPACE_LIMIT):
    """:func:`conv2d_forward` with the geometry ``g`` (``ConvGeometry``), which it trusts."""
    _require_limits(g)
    dt = result_dtype(xp, x, w)
    x = x.astype(dt, copy=False)
    wm = w.astype(dt, copy=False).reshape(g.groups, g.og, g.cg * g.kh * g.kw)
    if pointwise.applies(g):
        return pointwise.forward(xp, x, wm, g)
    y = xp.empty((g.n, g.groups, g.og, g.ho * g.wo), dtype=dt)
    step = batch_chunk(g, x.dtype.itemsize, workspace_limit)
    for i in range(0, g.n, step):
        # (G, Og, K) @ (n, G, K, L) -> (n, G, Og, L)
        matmul(xp, wm, im2col(xp, x[i:i + step], g), out=y[i:i + step])
    return y.reshape(g.y_shape)


def conv2d_backward_data(xp, gy, w, *, stride=1, padding=0, dilation=1, groups=1, input_shape,
                         workspace_limit=DEFAULT_WORKSPACE_LIMIT):
    """``gx = col2im(W^T @ gy)``: input gradient of shape ``input_shape``, of
    arrays outside a graph (:func:`backward_data` runs a node).

    Args:
        gy: ``(N, O, Ho, Wo)``; w: ``(O, C/G, kH, kW)``; input_shape: ``(N, C, H, W)``.

    Raises:
        ParameterError, ShapeError: bad parameters, or gy not of the output shape.
        LoweringError: a GEMM dimension of 2^31 or more.
    """
    g = conv_geometry(input_shape, w.shape, stride=stride, padding=padding, dilation=dilation, groups=groups)
    check_gy(g, gy.shape)
    return backward_data(xp, gy, w, g, workspace_limit=workspace_limit)


def backward_data(xp, gy, w, g, *, workspace_limit=DEFAULT_WORKSPACE_LIMIT):
    """:func:`conv2d_backward_data` with the geometry ``g``, which it trusts."""
    _require_limits(g)
    dt = result_dtype(xp, gy, w)
    wm = w.astype(dt, copy=False).reshape(g.groups, g.og, g.cg * g.kh * g.kw)
    gy = gy.astype(dt, copy=False)
    if pointwise.applies(g):
        return pointwise.backward_data(xp, gy, wm, g)
    wt = xp.swapaxes(wm, 1, 2)
    gyg = gy.reshape(g.n, g.groups, g.og, g.ho * g.wo)
    gx = xp.empty(g.x_shape, dtype=dt)
    step = batch_chunk(g, gx.dtype.itemsize, workspace_limit)
    for i in range(0, g.n, step):
        gx[i:i + step] = col2im(xp, matmul(xp, wt, gyg[i:i + step]), g)  # (G,K,Og)@(n,G,Og,L)
    return gx


def conv2d_backward_filter(xp, x, gy, *, stride=1, padding=0, dilation=1, groups=1, weight_shape,
                           workspace_limit=DEFAULT_WORKSPACE_LIMIT):
    """``gw = gy @ im2col(x)^T`` summed over the batch: weight gradient of
    ``weight_shape``, of arrays outside a graph (:func:`backward_filter` runs a node).

    The chunk's images are folded into the contracted dimension (columns laid out
    ``(G, K, n*Ho*Wo)``), so each chunk is one GEMM per group. Batch 0 gives zeros.

    Args:
        x: ``(N, C, H, W)``; gy: ``(N, O, Ho, Wo)``; weight_shape: ``(O, C/G, kH, kW)``.

    Raises:
        ParameterError, ShapeError: bad parameters, or gy not of the output shape.
        LoweringError: a GEMM dimension of 2^31 or more.
    """
    g = conv_geometry(x.shape, weight_shape, stride=stride, padding=padding, dilation=dilation, groups=groups)
    check_gy(g, gy.shape)
    return backward_filter(xp, x, gy, g, workspace_limit=workspace_limit)


def backward_filter(xp, x, gy, g, *, workspace_limit=DEFAULT_WORKSPACE_LIMIT):
    """:func:`conv2d_backward_filter` with the geometry ``g``, which it trusts."""
    _require_limits(g)
    dt = result_dtype(xp, x, gy)
    x, gy = x.astype(dt, copy=False), gy.astype(dt, copy=False)
    if pointwise.applies(g):
        return pointwise.backward_filter(xp, x, gy, g).reshape(g.w_shape)
    G, K, L = g.groups, g.cg * g.kh * g.kw, g.ho * g.wo
    gw = xp.zeros((G, g.og, K), dtype=dt)
    step = batch_chunk(g, x.dtype.itemsize, workspace_limit)
    for i in range(0, g.n, step):
        xc = x[i:i + step]
        n = xc.shape[0]
        xg = pad_spatial(xp, xc, g.padding).reshape(n, G, g.cg, g.hp, g.wp)
        win = window_view(xp, xg, (g.kh, g.kw), g.stride, g.dilation)  # (n,G,Cg,Ho,Wo,kH,kW)
        cols = win.transpose(1, 2, 5, 6, 0, 3, 4).reshape(G, K, n * L)
        gyc = gy[i:i + step].reshape(n, G, g.og, L).transpose(1, 2, 0, 3).reshape(G, g.og, n * L)
        matmul(xp, gyc, xp.swapaxes(cols, 1, 2), out=gw, accumulate=True)
    return gw.reshape(g.w_shape)


def check(direction: str, op, in_types, device: str) -> str | None:
    """Decline only where a per-image GEMM dimension overflows 32 bits."""
    return limit_reason(geometry_of(direction, op, in_types))


def workspace(direction: str, op, in_types, options) -> int:
    """Scratch bytes of one call: the im2col buffer of one batch chunk (the
    backward-filter also copies the chunk's output gradient)."""
    g = geometry_of(direction, op, in_types)
    itemsize = max(4, _itemsize(in_types[0].dtype))
    if pointwise.applies(g):
        return pointwise.workspace(direction, g, in_types[0].layout, itemsize)
    step = batch_chunk(g, itemsize, dict(options).get("workspace_limit", DEFAULT_WORKSPACE_LIMIT))
    cols = step * col_bytes_per_image(g, itemsize)
    if direction == "backward_filter":
        cols += step * g.o * g.ho * g.wo * itemsize
    return cols


def _itemsize(dtype: str) -> int:
    return {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}.get(dtype, 4)


__all__ = ["conv2d_forward", "conv2d_backward_data", "conv2d_backward_filter", "forward", "backward_data",
           "backward_filter", "im2col", "col2im",
           "check", "workspace", "batch_chunk", "limit_reason", "DEFAULT_WORKSPACE_LIMIT"]
