"""Direct (reference) 2-D convolution: the oracle every other lowering is checked against.

Semantics are ``shared/design/SEMANTICS.md`` exactly: cross-correlation,

    y[n, o, i, j] = sum_{c, p, q} x[n, g*C/G + c, i*s_h + p*d_h - pad_top,
                                     j*s_w + q*d_w - pad_left] * w[o, c, p, q]

with zeros outside the input, layouts NCHW / OIHW (weights ``(O, C/G, kH, kW)``).

The sum is computed *directly*, tap by tap: for each kernel offset ``(p, q)`` the
windows' ``(p, q)`` entries (one strided slice of the padded input, read through
``sliding_window_view``) are multiplied by ``w[:, :, p, q]`` with one batched
matmul over the channels of each group. That keeps memory at O(input + output)
(no im2col buffer, unlike :mod:`opgraph.backends.algorithms.gemm`) while still running on
BLAS, so the float64 oracle stays usable at model sizes.

Two entries per direction: :func:`forward` (``backward_data``,
``backward_filter``) runs a graph node on its :class:`ConvGeometry`, read off
the op's canonical fields and the node's types by :func:`node_geometry` /
:func:`geometry_of` (nothing re-interpreted, no size computed again);
:func:`conv2d_forward` (...) takes arrays and parameters in any form outside a
graph, validating and canonicalising them once in :func:`conv_geometry`.

The helpers here (:class:`ConvGeometry`, :func:`geometry_of`, :func:`pad_spatial`,
:func:`window_view`, :func:`tap_slices`) are the shared conv geometry that the
GEMM, FFT and Winograd lowerings reuse. Every function takes the array module
``xp`` (``numpy`` or ``cupy``) first and uses only what both provide.
"""

from __future__ import annotations

from numbers import Integral

import attrs

from opgraph.errors import ParameterError, ShapeError
from opgraph.params import conv_out_size, padding2d, pair

DIRECTIONS = ("forward", "backward_data", "backward_filter")


@attrs.frozen
class ConvGeometry:
    """Sizes of one 2-D convolution (all ints, canonical parameter forms)."""

    n: int
    c: int
    h: int
    w: int
    o: int
    kh: int
    kw: int
    stride: tuple[int, int]
    padding: tuple[tuple[int, int], tuple[int, int]]
    dilation: tuple[int, int]
    groups: int
    ho: int
    wo: int

    @property
    def cg(self) -> int:
        """Input channels per group."""
        return self.c // self.groups

    @property
    def og(self) -> int:
        """Output channels per group."""
        return self.o // self.groups

    @property
    def hp(self) -> int:
        """Padded input height."""
        return self.h + self.padding[0][0] + self.padding[0][1]

    @property
    def wp(self) -> int:
        """Padded input width."""
        return self.w + self.padding[1][0] + self.padding[1][1]

    @property
    def kernel_extent(self) -> tuple[int, int]:
        """Span of the dilated kernel, ``d*(k-1)+1`` per axis."""
        return (self.dilation[0] * (self.kh - 1) + 1, self.dilation[1] * (self.kw - 1) + 1)

    @property
    def x_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.c, self.h, self.w)

    @property
    def w_shape(self) -> tuple[int, int, int, int]:
        return (self.o, self.cg, self.kh, self.kw)

    @property
    def y_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.o, self.ho, self.wo)


def conv_geometry(x_shape, w_shape, *, stride=1, padding=0, dilation=1, groups=1) -> ConvGeometry:
    """Validate a convolution and compute its sizes (SEMANTICS.md output-size rule).

    Args:
        x_shape: input shape ``(N, C, H, W)``.
        w_shape: weight shape ``(O, C/groups, kH, kW)``.
        stride, padding, dilation, groups: any form :mod:`opgraph.params` accepts
            (ints, pairs, ``((top, bottom), (left, right))``, ``'same'``, ``'valid'``).

    Raises:
        ParameterError: stride/dilation < 1, negative padding, groups < 1 or not
            dividing both channel counts.
        ShapeError: non 4-D shapes, weight channels != C/groups, or an output size
            below 1 (kernel larger than the padded input).
    """
    x_shape, w_shape = tuple(int(s) for s in x_shape), tuple(int(s) for s in w_shape)
    if len(x_shape) != 4:
        raise ShapeError(f"conv2d: input must be 4-D NCHW, got shape {x_shape}")
    if len(w_shape) != 4:
        raise ShapeError(f"conv2d: weight must be 4-D OIHW, got shape {w_shape}")
    n, c, h, w = x_shape
    o, ci, kh, kw = w_shape
    stride = pair("stride", stride, minimum=1)
    dilation = pair("dilation", dilation, minimum=1)
    padding = padding2d(padding, in_hw=(h, w), kernel=(kh, kw), stride=stride, dilation=dilation)
    if not isinstance(groups, Integral) or isinstance(groups, bool) or groups < 1:
        raise ParameterError("groups", groups, "must be an int >= 1")
    groups = int(groups)
    if c % groups or o % groups:
        raise ParameterError("groups", groups, f"must divide input channels {c} and output channels {o}")
    if ci != c // groups:
        raise ShapeError(f"conv2d: weight {w_shape} has {ci} input channels, expected C/groups = {c // groups}")
    if kh < 1 or kw < 1:
        raise ShapeError(f"conv2d: kernel size must be >= 1, got weight shape {w_shape}")
    ho = conv_out_size(h, kh, stride[0], dilation[0], padding[0])
    wo = conv_out_size(w, kw, stride[1], dilation[1], padding[1])
    if ho < 1 or wo < 1:
        raise ShapeError(f"conv2d: output size {ho}x{wo} < 1: the dilated kernel {kh}x{kw} (dilation "
                         f"{dilation}) is larger than the padded input {h}x{w} with padding {padding}")
    return ConvGeometry(n, c, h, w, o, kh, kw, stride, padding, dilation, groups, ho, wo)


def node_geometry(op, x_shape, w_shape, y_shape) -> ConvGeometry:
    """The geometry of a convolution node: the op's own ``stride``, ``padding``,
    ``dilation`` and ``groups`` (canonical since the op was built) and the
    three shapes its type inference checked; nothing is re-interpreted or
    recomputed (compare :func:`conv_geometry`, for arrays outside a graph).

    Args:
        op: a convolution op (``Conv2d``, its backward ops, ``Conv2dBiasRelu``).
        x_shape, w_shape, y_shape: input ``(N, C, H, W)``, weight
            ``(O, C/groups, kH, kW)`` and output ``(N, O, Ho, Wo)`` shapes.
    """
    (n, c, h, w), (o, _, kh, kw), (_, _, ho, wo) = x_shape, w_shape, y_shape
    return ConvGeometry(n, c, h, w, o, kh, kw, op.stride, op.padding, op.dilation, op.groups, ho, wo)


def geometry_of(direction: str, op, in_types, out_type=None) -> ConvGeometry:
    """The geometry of a conv op node (:func:`node_geometry`) from its input
    types and its output type.

    ``direction`` is ``'forward'`` (inputs x, w[, b]; the output is y),
    ``'backward_data'`` (gy, w; the output is x, ``op.input_shape``) or
    ``'backward_filter'`` (x, gy; the output is w, ``op.weight_shape``).
    ``out_type`` is the node's inferred type (``KernelContext.out_type``);
    without it a forward node asks its op (``op.infer``).

    Raises:
        ParameterError: an unknown direction.
    """
    shapes = [t.shape for t in in_types]
    if direction == "forward":
        return node_geometry(op, shapes[0], shapes[1], (out_type or op.infer(*in_types)).shape)
    if direction == "backward_data":
        return node_geometry(op, op.input_shape, shapes[1], shapes[0])
    if direction == "backward_filter":
        return node_geometry(op, shapes[0], op.weight_shape, shapes[1])
    raise ParameterError("direction", direction, f"must be one of {DIRECTIONS}")


def check_gy(geom: ConvGeometry, gy_shape) -> None:
    """Raise ShapeError unless ``gy_shape`` is the forward output shape."""
    if tuple(gy_shape) != geom.y_shape:
        raise ShapeError(f"conv2d backward: output gradient has shape {tuple(gy_shape)}, "
                         f"expected {geom.y_shape} for input {geom.x_shape} and weight {geom.w_shape}")


def pad_spatial(xp, a, padding, extra=(0, 0)):
    """Zero-pad the last two axes by ``((top, bottom), (left, right))``, plus
    ``extra = (rows, cols)`` more at the bottom/right (tiling slack)."""
    (t, b), (l, r) = padding
    b, r = b + extra[0], r + extra[1]
    if t == b == l == r == 0:
        return a
    return xp.pad(a, [(0, 0)] * (a.ndim - 2) + [(t, b), (l, r)])


def window_view(xp, a, kernel, stride, dilation):
    """Read-only view ``v[..., i, j, p, q] = a[..., i*s_h + p*d_h, j*s_w + q*d_w]``.

    ``a`` is ``(..., H, W)`` (already padded); the result is
    ``(..., Ho, Wo, kH, kW)`` with ``Ho = (H - d_h*(kH-1) - 1) // s_h + 1``.
    Uses ``xp.lib.stride_tricks.sliding_window_view`` where the array module has it
    (NumPy), else builds the same view with ``as_strided`` (older CuPy).
    """
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    eh, ew = dh * (kh - 1) + 1, dw * (kw - 1) + 1
    tricks = getattr(getattr(xp, "lib", None), "stride_tricks", None)
    swv = getattr(tricks, "sliding_window_view", None)
    if swv is not None:
        return swv(a, (eh, ew), axis=(-2, -1))[..., ::sh, ::sw, ::dh, ::dw]
    return strided_windows(xp, a, kernel, stride, dilation)


def strided_windows(xp, a, kernel, stride, dilation):
    """Same view as :func:`window_view`, built with ``as_strided`` (byte strides)."""
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    h, w = a.shape[-2:]
    ho, wo = (h - dh * (kh - 1) - 1) // sh + 1, (w - dw * (kw - 1) - 1) // sw + 1
    if ho < 1 or wo < 1:
        raise ShapeError(f"window_view: kernel {kernel} with dilation {dilation} exceeds input {h}x{w}")
    rs, cs = a.strides[-2:]
    shape = a.shape[:-2] + (ho, wo, kh, kw)
    strides = a.strides[:-2] + (rs * sh, cs * sw, rs * dh, cs * dw)
    return xp.lib.stride_tricks.as_strided(a, shape=shape, strides=strides)


def tap_slices(geom: ConvGeometry, p: int, q: int) -> tuple[slice, slice]:
    """Rows/cols of the padded input that kernel tap ``(p, q)`` reads, one per
    output position: ``p*d_h + i*s_h`` for ``i < Ho`` (likewise for columns)."""
    (sh, sw), (dh, dw) = geom.stride, geom.dilation
    r0, c0 = p * dh, q * dw
    return (slice(r0, r0 + (geom.ho - 1) * sh + 1, sh), slice(c0, c0 + (geom.wo - 1) * sw + 1, sw))


def result_dtype(xp, *arrays):
    """The dtype every conv computes and returns: NumPy promotion of the inputs."""
    return xp.result_type(*[a.dtype for a in arrays])


def _tap_major(xp, w, groups):
    """Weights ``(O, C/G, kH, kW)`` as a contiguous ``(kH, kW, G, O/G, C/G)``: one
    matrix per tap and group. Contiguous because NumPy's matmul drops to a slow
    non-BLAS loop for operands strided like ``w[:, :, p, q]``."""
    o, cg, kh, kw = w.shape
    return xp.ascontiguousarray(w.reshape(groups, o // groups, cg, kh, kw).transpose(3, 4, 0, 1, 2))


def conv2d_forward(xp, x, w, *, stride=1, padding=0, dilation=1, groups=1):
    """Direct convolution (cross-correlation), no bias, of arrays outside a
    graph (validated by :func:`conv_geometry`); :func:`forward` runs a node.

    Args:
        xp: array module (``numpy`` or ``cupy``).
        x: input ``(N, C, H, W)``.
        w: weight ``(O, C/groups, kH, kW)``.
        stride, padding, dilation, groups: as :func:`conv_geometry`.

    Returns:
        ``y`` of shape ``(N, O, Ho, Wo)`` in the promoted dtype of x and w.

    Raises:
        ParameterError, ShapeError: see :func:`conv_geometry`.

    Source: the definition in SEMANTICS.md, summed tap by tap.
    """
    g = conv_geometry(x.shape, w.shape, stride=stride, padding=padding, dilation=dilation, groups=groups)
    return forward(xp, x, w, g)


def forward(xp, x, w, g: ConvGeometry):
    """:func:`conv2d_forward` of ``x`` and ``w`` with the geometry ``g``
    (:func:`node_geometry`, or :func:`conv_geometry`), which it trusts."""
    dt = result_dtype(xp, x, w)
    G, L = g.groups, g.ho * g.wo
    xg = pad_spatial(xp, x.astype(dt, copy=False), g.padding).reshape(g.n, G, g.cg, g.hp, g.wp)
    wtaps = _tap_major(xp, w.astype(dt, copy=False), G)  # (kH, kW, G, Og, Cg)
    win = window_view(xp, xg, (g.kh, g.kw), g.stride, g.dilation)  # (N, G, Cg, Ho, Wo, kH, kW)
    y = xp.zeros((g.n, G, g.og, L), dtype=dt)
    for p in range(g.kh):
        for q in range(g.kw):
            taps = win[..., p, q].reshape(g.n, G, g.cg, L)  # the one copy per tap
            # (G, Og, Cg) @ (N, G, Cg, L) -> (N, G, Og, L): groups are a batch axis.
            y += xp.matmul(wtaps[p, q], taps)
    return y.reshape(g.y_shape)


def conv2d_backward_data(xp, gy, w, *, stride=1, padding=0, dilation=1, groups=1, input_shape):
    """Input gradient ``gx = d<y, gy>/dx`` of :func:`conv2d_forward`, of arrays
    outside a graph (:func:`backward_data` runs a node).

    Each tap scatters ``w[:, :, p, q]^T @ gy`` back onto the input rows/columns it
    read (:func:`tap_slices`); padding rows are then cropped. Rows or columns that
    no window touched (stride not tiling the input) stay 0.

    Args:
        gy: output gradient ``(N, O, Ho, Wo)``.
        w: weight ``(O, C/groups, kH, kW)``.
        input_shape: the forward input shape ``(N, C, H, W)``.

    Returns:
        ``gx`` of shape ``input_shape``.

    Raises:
        ParameterError, ShapeError: bad parameters, or gy not of the output shape.
    """
    g = conv_geometry(input_shape, w.shape, stride=stride, padding=padding, dilation=dilation, groups=groups)
    check_gy(g, gy.shape)
    return backward_data(xp, gy, w, g)


def backward_data(xp, gy, w, g: ConvGeometry):
    """:func:`conv2d_backward_data` with the geometry ``g``, which it trusts."""
    dt = result_dtype(xp, gy, w)
    G = g.groups
    gyg = gy.astype(dt, copy=False).reshape(g.n, G, g.og, g.ho * g.wo)
    wtaps = _tap_major(xp, w.astype(dt, copy=False), G)  # (kH, kW, G, Og, Cg)
    gxp = xp.zeros((g.n, G, g.cg, g.hp, g.wp), dtype=dt)
    for p in range(g.kh):
        for q in range(g.kw):
            rows, cols = tap_slices(g, p, q)
            # Within one tap the output positions read distinct input cells, so += is a plain add.
            gxp[..., rows, cols] += xp.matmul(xp.swapaxes(wtaps[p, q], -1, -2), gyg).reshape(g.n, G, g.cg, g.ho, g.wo)
    (t, _), (l, _) = g.padding
    return xp.ascontiguousarray(gxp.reshape(g.n, g.c, g.hp, g.wp)[..., t:t + g.h, l:l + g.w])


def conv2d_backward_filter(xp, x, gy, *, stride=1, padding=0, dilation=1, groups=1, weight_shape):
    """Weight gradient ``gw = d<y, gy>/dw`` of :func:`conv2d_forward`, of arrays
    outside a graph (:func:`backward_filter` runs a node).

    ``gw[o, c, p, q] = sum_{n,i,j} gy[n, o, i, j] * xpad[n, g*C/G + c, i*s_h + p*d_h, j*s_w + q*d_w]``,
    one GEMM per tap and group with the batch and output positions as the
    contracted dimension. Batch size 0 gives zeros.

    Args:
        x: input ``(N, C, H, W)``.
        gy: output gradient ``(N, O, Ho, Wo)``.
        weight_shape: ``(O, C/groups, kH, kW)``.

    Returns:
        ``gw`` of shape ``weight_shape``.

    Raises:
        ParameterError, ShapeError: bad parameters, or gy not of the output shape.
    """
    g = conv_geometry(x.shape, weight_shape, stride=stride, padding=padding, dilation=dilation, groups=groups)
    check_gy(g, gy.shape)
    return backward_filter(xp, x, gy, g)


def backward_filter(xp, x, gy, g: ConvGeometry):
    """:func:`conv2d_backward_filter` with the geometry ``g``, which it trusts."""
    dt = result_dtype(xp, x, gy)
    G, NL = g.groups, g.n * g.ho * g.wo
    xg = pad_spatial(xp, x.astype(dt, copy=False), g.padding).reshape(g.n, G, g.cg, g.hp, g.wp)
    win = window_view(xp, xg, (g.kh, g.kw), g.stride, g.dilation)  # (N, G, Cg, Ho, Wo, kH, kW)
    # (G, Og, N*L): batch and positions together form the contracted dimension.
    gyg = xp.ascontiguousarray(gy.astype(dt, copy=False).reshape(g.n, G, g.og, g.ho * g.wo)
                               .transpose(1, 2, 0, 3)).reshape(G, g.og, NL)
    gw = xp.zeros((G, g.og, g.cg, g.kh, g.kw), dtype=dt)
    for p in range(g.kh):
        for q in range(g.kw):
            taps = win[..., p, q].transpose(1, 0, 3, 4, 2).reshape(G, NL, g.cg)
            gw[..., p, q] = xp.matmul(gyg, taps)
    return gw.reshape(g.w_shape)


__all__ = ["ConvGeometry", "conv_geometry", "node_geometry", "geometry_of", "check_gy", "pad_spatial",
           "window_view", "strided_windows", "tap_slices", "result_dtype", "conv2d_forward",
           "conv2d_backward_data", "conv2d_backward_filter", "forward", "backward_data",
           "backward_filter", "DIRECTIONS"]
