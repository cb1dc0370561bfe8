"""Winograd minimal-filtering convolution for 3x3 kernels, stride 1, dilation 1.

Lavin & Gray 2015, "Fast Algorithms for Convolutional Neural Networks"
(arXiv:1509.09308). ``F(m x m, 3x3)`` computes an ``m x m`` output tile from an
``a x a`` input tile (``a = m + 2``) as

    Y = A^T [ (G g G^T) (.) (B^T d B) ] A

with the paper's matrices: ``F(2x2, 3x3)`` (a = 4, 16 multiplies
instead of 36) and ``F(4x4, 3x3)`` (a = 6, 36 instead of 144). Across channels
the elementwise product becomes, per transform coordinate, one GEMM over the
channels (as in the paper), batched here over the ``a*a`` coordinates
and the groups. The formula is a cross-correlation, as SEMANTICS.md requires.

Directions:

* forward: as above; padding is explicit zero-padding, plus zero slack at the
  bottom/right so that the tiles cover the output (cropped afterwards);
* backward-data: for stride 1 the input gradient is the *full* correlation of
  ``gy`` with the spatially flipped, in/out-transposed kernel, i.e. this forward
  with padding 2 on each side, then the padding border cropped;
* backward-filter: Winograd too, ``F(3x3, m x m)``: each ``m x m`` tile of ``gy``
  plays the filter, giving ``gw = G^T [ (A gy A^T) (.) (B^T d B) ] G`` summed
  over tiles and batch (a GEMM per coordinate). These matrices follow from the
  forward ones by the transposition principle (``gw`` is the gradient of the
  bilinear form ``<Y, gy>``), which is how the paper's ``F(3x3, 2x2)``
  relates to ``F(2x2, 3x3)``.

Groups are supported (a batch axis of the GEMMs; depthwise works but gains
little). Declined by :func:`check`: kernels other than 3x3, stride != 1,
dilation != 1. Option ``tile``: 2 or 4 (default 4).

Accuracy: ``F(4x4, 3x3)`` loses about a digit to the transforms; float32 stays
well within the 1e-3 SEMANTICS.md allows (tested against the float64 reference).
"""

from __future__ import annotations

import numpy as np

from opgraph.errors import LoweringError, ParameterError

from ..reference.conv import (check_gy, conv_geometry, geometry_of, pad_spatial, result_dtype,
                             window_view)

TILES = (2, 4)
DEFAULT_TILE = 4

# (B^T, G, A^T) of F(m x m, 3x3) as printed in Lavin & Gray 2015 (m = 2 and m = 4).
_MATRICES = {
    2: (
        np.array([[1, 0, -1, 0],
                  [0, 1, 1, 0],
                  [0, -1, 1, 0],
                  [0, 1, 0, -1]], dtype=np.float64),
        np.array([[1, 0, 0],
                  [1 / 2, 1 / 2, 1 / 2],
                  [1 / 2, -1 / 2, 1 / 2],
                  [0, 0, 1]], dtype=np.float64),
        np.array([[1, 1, 1, 0],
                  [0, 1, -1, -1]], dtype=np.float64),
    ),
    4: (
        np.array([[4, 0, -5, 0, 1, 0],
                  [0, -4, -4, 1, 1, 0],
                  [0, 4, -4, -1, 1, 0],
                  [0, -2, -1, 2, 1, 0],
                  [0, 2, -1, -2, 1, 0],
                  [0, 4, 0, -5, 0, 1]], dtype=np.float64),
        np.array([[1 / 4, 0, 0],
                  [-1 / 6, -1 / 6, -1 / 6],
                  [-1 / 6, 1 / 6, -1 / 6],
                  [1 / 24, 1 / 12, 1 / 6],
                  [1 / 24, -1 / 12, 1 / 6],
                  [0, 0, 1]], dtype=np.float64),
        np.array([[1, 1, 1, 1, 1, 0],
                  [0, 1, -1, 2, -2, 0],
                  [0, 1, 1, 4, 4, 0],
                  [0, 1, -1, 8, -8, 1]], dtype=np.float64),
    ),
}


def matrices(xp, tile: int, dtype):
    """``(B^T, G, A^T)`` of ``F(tile x tile, 3x3)`` as ``xp`` arrays of ``dtype``.

    Raises:
        ParameterError: ``tile`` not in (2, 4).
    """
    if tile not in _MATRICES:
        raise ParameterError("tile", tile, f"Winograd tile must be one of {TILES}")
    return tuple(xp.asarray(m, dtype=dtype) for m in _MATRICES[tile])


def _sandwich(xp, m, t):
    """``m @ t @ m^T`` over the last two axes of ``t`` (``m`` is ``(i, r)``, ``t`` is
    ``(..., r, r)``), as two ``tensordot`` calls so BLAS sees one tall GEMM each,
    rather than millions of tiny batched matmuls."""
    u = xp.tensordot(t, m, axes=([t.ndim - 1], [1]))  # u[..., r, l] = sum_c t[..., r, c] m[l, c]
    v = xp.tensordot(u, m, axes=([t.ndim - 2], [1]))  # v[..., l, i] = sum_r u[..., r, l] m[i, r]
    return xp.swapaxes(v, -1, -2)


def _reason(g) -> str | None:
    if (g.kh, g.kw) != (3, 3):
        return f"winograd needs a 3x3 kernel, got {g.kh}x{g.kw}"
    if g.stride != (1, 1):
        return f"winograd needs stride 1, got {g.stride}"
    if g.dilation != (1, 1):
        return f"winograd needs dilation 1, got {g.dilation}"
    return None


def _require(g) -> None:
    reason = _reason(g)
    if reason is not None:
        raise LoweringError(reason)


def _input_tiles(xp, x, g, tile, bt, th, tw):
    """Transformed input tiles ``B^T d B``: ``(a*a, G, C/G, N*th*tw)``."""
    a = tile + 2
    # Slack rows/cols so th*tile outputs fit; they read zeros and are cropped later.
    extra = (th * tile - g.ho, tw * tile - g.wo)
    xg = pad_spatial(xp, x, g.padding, extra).reshape(g.n, g.groups, g.cg, th * tile + 2, tw * tile + 2)
    d = window_view(xp, xg, (a, a), (tile, tile), (1, 1))  # (N, G, Cg, th, tw, a, a)
    v = _sandwich(xp, bt, d)
    return v.transpose(5, 6, 1, 2, 0, 3, 4).reshape(a * a, g.groups, g.cg, g.n * th * tw)


def _tile_counts(g, tile):
    return -(-g.ho // tile), -(-g.wo // tile)


def conv2d_forward(xp, x, w, *, stride=1, padding=0, dilation=1, groups=1, tile=DEFAULT_TILE):
    """Winograd ``F(tile x tile, 3x3)`` convolution ``(N, C, H, W) * (O, C/G, 3, 3) -> (N, O, Ho, Wo)``
    of arrays outside a graph (validated by :func:`conv_geometry`); :func:`forward`
    runs a node on its geometry.

    Raises:
        ParameterError: bad parameters or ``tile`` not in (2, 4).
        ShapeError: bad shapes.
        LoweringError: kernel not 3x3, stride or dilation not 1.
    """
    g = conv_geometry(x.shape, w.shape, stride=stride, padding=padding, dilation=dilation, groups=groups)
    return forward(xp, x, w, g, tile=tile)


def forward(xp, x, w, g, *, tile=DEFAULT_TILE):
    """:func:`conv2d_forward` with the geometry ``g`` (``ConvGeometry``), which it trusts."""
    _require(g)
    dt = result_dtype(xp, x, w)
    bt, gm, at = matrices(xp, tile, dt)
    a, (th, tw) = tile + 2, _tile_counts(g, tile)
    v = _input_tiles(xp, x.astype(dt, copy=False), g, tile, bt, th, tw)  # (a*a, G, Cg, P)
    u = _sandwich(xp, gm, w.astype(dt, copy=False).reshape(g.groups, g.og, g.cg, 3, 3))  # (G, Og, Cg, a, a)
    u = xp.ascontiguousarray(u.transpose(3, 4, 0, 1, 2)).reshape(a * a, g.groups, g.og, g.cg)
    m = xp.matmul(u, v)  # (a*a, G, Og, P): the per-coordinate GEMMs
    m = m.reshape(a, a, g.groups, g.og, g.n, th, tw).transpose(4, 2, 3, 5, 6, 0, 1)
    y = _sandwich(xp, at, m)  # (N, G, Og, th, tw, tile, tile)
    y = y.transpose(0, 1, 2, 3, 5, 4, 6).reshape(g.n, g.o, th * tile, tw * tile)
    return xp.ascontiguousarray(y[..., :g.ho, :g.wo])


def conv2d_backward_data(xp, gy, w, *, stride=1, padding=0, dilation=1, groups=1, input_shape,
                         tile=DEFAULT_TILE):
    """Winograd input gradient: the forward on ``gy`` padded by 2 with the flipped,
    transposed kernel ``wt[c, o] = w[o, c, ::-1, ::-1]`` (per group), cropped to
    ``input_shape`` (arrays outside a graph; :func:`backward_data` runs a node).

    Raises:
        ParameterError, ShapeError: bad parameters, or gy not of the output shape.
        LoweringError: kernel not 3x3, stride or dilation not 1.
    """
    g = conv_geometry(input_shape, w.shape, stride=stride, padding=padding, dilation=dilation, groups=groups)
    check_gy(g, gy.shape)
    return backward_data(xp, gy, w, g, tile=tile)


def backward_data(xp, gy, w, g, *, tile=DEFAULT_TILE):
    """:func:`conv2d_backward_data` with the geometry ``g``, which it trusts."""
    _require(g)
    wt = w.reshape(g.groups, g.og, g.cg, 3, 3).transpose(0, 2, 1, 3, 4)[..., ::-1, ::-1]
    wt = xp.ascontiguousarray(wt).reshape(g.c, g.og, 3, 3)
    full = conv2d_forward(xp, gy, wt, padding=2, groups=g.groups, tile=tile)  # (N, C, Hp, Wp)
    (t, _), (l, _) = g.padding
    return xp.ascontiguousarray(full[..., t:t + g.h, l:l + g.w])


def conv2d_backward_filter(xp, x, gy, *, stride=1, padding=0, dilation=1, groups=1, weight_shape,
                           tile=DEFAULT_TILE):
    """Winograd weight gradient ``F(3x3, tile x tile)``: ``gw = G^T [ sum (A gy A^T) (.) (B^T d B) ] G``.

    ``gy`` is cut into ``tile x tile`` tiles (zero slack at the bottom/right), the
    matching ``(tile+2)``-square input tiles are transformed as in the forward,
    and the product is summed over batch and tiles by one GEMM per transform
    coordinate and group. Batch 0 gives zeros. Arrays outside a graph;
    :func:`backward_filter` runs a node.

    Raises:
        ParameterError, ShapeError: bad parameters, or gy not of the output shape.
        LoweringError: kernel not 3x3, stride or dilation not 1.
    """
    g = conv_geometry(x.shape, weight_shape, stride=stride, padding=padding, dilation=dilation, groups=groups)
    check_gy(g, gy.shape)
    return backward_filter(xp, x, gy, g, tile=tile)


def backward_filter(xp, x, gy, g, *, tile=DEFAULT_TILE):
    """:func:`conv2d_backward_filter` with the geometry ``g``, which it trusts."""
    _require(g)
    dt = result_dtype(xp, x, gy)
    bt, gm, at = matrices(xp, tile, dt)
    a, (th, tw) = tile + 2, _tile_counts(g, tile)
    v = _input_tiles(xp, x.astype(dt, copy=False), g, tile, bt, th, tw)  # (a*a, G, Cg, P)
    gyp = pad_spatial(xp, gy.astype(dt, copy=False), ((0, th * tile - g.ho), (0, tw * tile - g.wo)))
    z = gyp.reshape(g.n, g.groups, g.og, th, tile, tw, tile).transpose(1, 2, 0, 3, 5, 4, 6)
    z = _sandwich(xp, at.T, z)  # A gy A^T: (G, Og, N, th, tw, a, a)
    z = xp.ascontiguousarray(z.transpose(5, 6, 0, 1, 2, 3, 4)).reshape(a * a, g.groups, g.og, g.n * th * tw)
    s = xp.matmul(z, xp.swapaxes(v, -1, -2))  # (a*a, G, Og, Cg)
    s = s.reshape(a, a, g.groups, g.og, g.cg).transpose(2, 3, 4, 0, 1)
    return xp.ascontiguousarray(_sandwich(xp, gm.T, s)).reshape(g.w_shape)


def check(direction: str, op, in_types, device: str) -> str | None:
    """Decline kernels other than 3x3, stride != 1 and dilation != 1."""
    return _reason(geometry_of(direction, op, in_types))


def variants(direction: str, op, in_types, device: str) -> list[dict]:
    """One candidate per tile size: ``F(2x2, 3x3)`` and ``F(4x4, 3x3)``."""
    return [{"tile": t} for t in TILES]


def workspace(direction: str, op, in_types, options) -> int:
    """Scratch bytes: transformed input tiles, filters and products (``a*a`` per tile)."""
    g = geometry_of(direction, op, in_types)
    tile = dict(options).get("tile", DEFAULT_TILE)
    a = tile + 2
    if direction == "backward_data":  # runs the forward on gy padded by 2, channels swapped
        ho, wo, cin, cout = g.hp, g.wp, g.o, g.c
    else:
        ho, wo, cin, cout = g.ho, g.wo, g.c, g.o
    p = g.n * -(-ho // tile) * -(-wo // tile)
    itemsize = 8 if in_types[0].dtype == "float64" else 4
    return a * a * (p * (cin + cout) + cout * cin // g.groups) * itemsize


__all__ = ["conv2d_forward", "conv2d_backward_data", "conv2d_backward_filter", "forward", "backward_data",
           "backward_filter", "check", "variants",
           "workspace", "matrices", "TILES", "DEFAULT_TILE"]
