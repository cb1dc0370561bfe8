"""Frequency-domain convolution with real FFTs, forward, backward-data and backward-filter.

Mathieu, Henaff & LeCun 2014 ("Fast training of convolutional networks through
FFTs", arXiv:1312.5851) and Vasilache et al. 2015 (fbfft, arXiv:1412.7580): by the
convolution theorem each direction becomes one product per frequency, summed over
a channel dimension, between real 2-D FFTs of zero-padded planes:

* forward: ``y = IFFT( sum_c X[n,c] * conj(W[o,c]) )`` -- cross-correlation, hence
  the conjugate (``corr(x, w) <-> X * conj(W)`` for real ``w``);
* backward-data: ``gxpad = IFFT( sum_o GY[n,o] * W[o,c] )`` -- a true (full)
  convolution of the output gradient with the kernel;
* backward-filter: ``gw = IFFT( sum_n X[n,c] * conj(GY[n,o]) )`` -- correlation of
  the input with the output gradient, the batch being the summed dimension.

All transforms have size ``next_fast_len(padded input)`` per axis (2-3-5 smooth,
``scipy.fft.next_fast_len``), which is enough: every index a *valid* correlation
or the kept part of the full convolution reads stays below the padded input size,
so circular wrap-around never reaches a kept output.

Choices (``check`` declines none of these):

* padding: the input is zero-padded explicitly inside the kernel (any asymmetric
  padding works);
* dilation: the kernel is dilated with zeros (``wd[::d] = w``) and transformed;
  the FFT cost does not grow with dilation;
* stride > 1: the stride-1 result is computed and subsampled (forward), the
  gradient is upsampled with zeros (backward). Correct for every stride, at
  roughly ``s_h*s_w`` times the useful work: the autotuner is expected to prefer
  another lowering there, as cuDNN's FFT engines (stride 1 only) suggest.

The per-frequency channel sums are batched complex matmuls (frequencies are a
batch axis, groups another), so BLAS / cuBLAS does the reduction.

Accuracy: float32 inputs are transformed in single precision (NumPy >= 2 and CuPy
keep complex64); relative error vs the float64 reference is ~1e-6, within the
1e-3 SEMANTICS.md allows for FFT. Written against ``xp`` (``xp.fft.rfft2/irfft2``).
"""

from __future__ import annotations

import math

import scipy.fft

from .products import matmul
from ..reference.conv import check_gy, conv_geometry, geometry_of, pad_spatial, result_dtype

FFT_SIZE_LIMIT = 2**31 - 1  # elements of one 2-D transform plane (32-bit plan sizes)


def fft_shape(geom) -> tuple[int, int]:
    """Transform size per axis: the next 2-3-5 smooth length >= the padded input."""
    return (scipy.fft.next_fast_len(geom.hp, real=True), scipy.fft.next_fast_len(geom.wp, real=True))


def _freq_matmul(xp, a, b):
    """``out[..., m, p, f] = sum_k a[..., m, k, f] * b[..., k, p, f]``.

    Frequencies ``f`` move to the front as a batch axis of one complex matmul
    (:func:`.products.matmul`: on CuPy our own cuBLAS handle, which a CUDA
    graph can capture). The operands are made contiguous first: NumPy's matmul
    falls back to a non-BLAS loop for arbitrarily strided operands.
    """
    a = xp.ascontiguousarray(xp.moveaxis(a, -1, 0))
    b = xp.ascontiguousarray(xp.moveaxis(b, -1, 0))
    batch = a.shape[:-2]
    if b.shape[:-2] != batch:
        raise ValueError(f"fft products: batch axes {a.shape[:-2]} and {b.shape[:-2]} differ")
    # frequencies x groups as one strided batch: one cuBLAS call on CuPy (products.matmul)
    k = math.prod(batch)
    out = matmul(xp, a.reshape(k, *a.shape[-2:]), b.reshape(k, *b.shape[-2:]))
    return xp.moveaxis(out.reshape(*batch, *out.shape[-2:]), 0, -1)


def _dilate(xp, w, dilation):
    """Kernel ``(..., kH, kW)`` with ``d-1`` zeros between taps: ``(..., d*(k-1)+1, ...)``."""
    dh, dw = dilation
    if dh == dw == 1:
        return w
    kh, kw = w.shape[-2:]
    out = xp.zeros(w.shape[:-2] + (dh * (kh - 1) + 1, dw * (kw - 1) + 1), dtype=w.dtype)
    out[..., ::dh, ::dw] = w
    return out


def _upsample(xp, gy, geom):
    """Output gradient with ``s-1`` zeros between entries: ``(..., (Ho-1)*s+1, (Wo-1)*s+1)``."""
    sh, sw = geom.stride
    if sh == sw == 1:
        return gy
    out = xp.zeros(gy.shape[:-2] + ((geom.ho - 1) * sh + 1, (geom.wo - 1) * sw + 1), dtype=gy.dtype)
    out[..., ::sh, ::sw] = gy
    return out


def conv2d_forward(xp, x, w, *, stride=1, padding=0, dilation=1, groups=1):
    """FFT convolution (cross-correlation) ``(N, C, H, W) * (O, C/G, kH, kW) -> (N, O, Ho, Wo)``
    of arrays outside a graph (validated by :func:`conv_geometry`); :func:`forward`
    runs a node on its geometry.

    Raises:
        ParameterError, ShapeError: bad parameters or shapes (see :func:`conv_geometry`).
    """
    g = conv_geometry(x.shape, w.shape, stride=stride, padding=padding, dilation=dilation, groups=groups)
    return forward(xp, x, w, g)


def forward(xp, x, w, g):
    """:func:`conv2d_forward` with the geometry ``g`` (``ConvGeometry``), which it trusts."""
    dt = result_dtype(xp, x, w)
    s = fft_shape(g)
    G = g.groups
    xf = xp.fft.rfft2(pad_spatial(xp, x.astype(dt, copy=False), g.padding), s=s)
    wf = xp.fft.rfft2(_dilate(xp, w.astype(dt, copy=False), g.dilation), s=s)
    F = xf.shape[-2] * xf.shape[-1]
    a = xf.reshape(g.n, G, g.cg, F).transpose(1, 0, 2, 3)  # (G, N, Cg, F)
    b = xp.conj(wf).reshape(G, g.og, g.cg, F).transpose(0, 2, 1, 3)  # (G, Cg, Og, F)
    yf = _freq_matmul(xp, a, b).transpose(1, 0, 2, 3).reshape(g.n, g.o, *xf.shape[-2:])
    eh, ew = g.kernel_extent
    y = xp.fft.irfft2(yf, s=s)[..., :g.hp - eh + 1:g.stride[0], :g.wp - ew + 1:g.stride[1]]
    return xp.ascontiguousarray(y).astype(dt, copy=False)


def conv2d_backward_data(xp, gy, w, *, stride=1, padding=0, dilation=1, groups=1, input_shape):
    """FFT input gradient: full convolution of the zero-upsampled ``gy`` with the
    dilated kernel, then the padding border cropped; shape ``input_shape``
    (arrays outside a graph; :func:`backward_data` runs a node).

    Raises:
        ParameterError, ShapeError: bad parameters, or gy not of the output shape.
    """
    g = conv_geometry(input_shape, w.shape, stride=stride, padding=padding, dilation=dilation, groups=groups)
    check_gy(g, gy.shape)
    return backward_data(xp, gy, w, g)


def backward_data(xp, gy, w, g):
    """:func:`conv2d_backward_data` with the geometry ``g``, which it trusts."""
    dt = result_dtype(xp, gy, w)
    s = fft_shape(g)
    G = g.groups
    gf = xp.fft.rfft2(_upsample(xp, gy.astype(dt, copy=False), g), s=s)
    wf = xp.fft.rfft2(_dilate(xp, w.astype(dt, copy=False), g.dilation), s=s)
    F = gf.shape[-2] * gf.shape[-1]
    a = gf.reshape(g.n, G, g.og, F).transpose(1, 0, 2, 3)  # (G, N, Og, F)
    b = wf.reshape(G, g.og, g.cg, F)  # (G, Og, Cg, F)
    xf = _freq_matmul(xp, a, b).transpose(1, 0, 2, 3).reshape(g.n, g.c, *gf.shape[-2:])
    # The full convolution has (Ho-1)*s + d*(k-1) + 1 <= Hp rows; rows past it are 0.
    (t, _), (l, _) = g.padding
    gx = xp.fft.irfft2(xf, s=s)[..., t:t + g.h, l:l + g.w]
    return xp.ascontiguousarray(gx).astype(dt, copy=False)


def conv2d_backward_filter(xp, x, gy, *, stride=1, padding=0, dilation=1, groups=1, weight_shape):
    """FFT weight gradient: correlation of the padded input with the zero-upsampled
    ``gy`` summed over the batch, read at the dilated taps; shape ``weight_shape``.
    Batch 0 gives zeros. Arrays outside a graph; :func:`backward_filter` runs a node.

    Raises:
        ParameterError, ShapeError: bad parameters, or gy not of the output shape.
    """
    g = conv_geometry(x.shape, weight_shape, stride=stride, padding=padding, dilation=dilation, groups=groups)
    check_gy(g, gy.shape)
    return backward_filter(xp, x, gy, g)


def backward_filter(xp, x, gy, g):
    """:func:`conv2d_backward_filter` with the geometry ``g``, which it trusts."""
    dt = result_dtype(xp, x, gy)
    s = fft_shape(g)
    G = g.groups
    xf = xp.fft.rfft2(pad_spatial(xp, x.astype(dt, copy=False), g.padding), s=s)
    gf = xp.fft.rfft2(_upsample(xp, gy.astype(dt, copy=False), g), s=s)
    F = xf.shape[-2] * xf.shape[-1]
    a = xp.conj(gf).reshape(g.n, G, g.og, F).transpose(1, 2, 0, 3)  # (G, Og, N, F)
    b = xf.reshape(g.n, G, g.cg, F).transpose(1, 0, 2, 3)  # (G, N, Cg, F)
    wf = _freq_matmul(xp, a, b).reshape(g.o, g.cg, *xf.shape[-2:])
    eh, ew = g.kernel_extent
    gw = xp.fft.irfft2(wf, s=s)[..., :eh:g.dilation[0], :ew:g.dilation[1]]
    # a copy, always: a 1x1 kernel's crop is already contiguous, and a view would keep
    # the whole inverse transform (O*C/G*Hf*Wf values) alive for a weight-sized result
    return gw.astype(dt, copy=True)


def check(direction: str, op, in_types, device: str) -> str | None:
    """Decline only a transform plane too large for 32-bit FFT plan sizes; every
    stride, dilation, padding and group form is computed (see the module docstring)."""
    g = geometry_of(direction, op, in_types)
    lh, lw = fft_shape(g)
    if lh * lw > FFT_SIZE_LIMIT:
        return f"fft: transform plane {lh}x{lw} exceeds {FFT_SIZE_LIMIT} elements"
    return None


def workspace(direction: str, op, in_types, options) -> int:
    """Scratch bytes: the complex spectra of the input, weight and output (each
    also copied once for the per-frequency matmul)."""
    g = geometry_of(direction, op, in_types)
    lh, lw = fft_shape(g)
    itemsize = 8 if in_types[0].dtype == "float64" else 4
    planes = g.n * g.c + g.o * g.cg + g.n * g.o
    return 2 * planes * lh * (lw // 2 + 1) * 2 * itemsize


__all__ = ["conv2d_forward", "conv2d_backward_data", "conv2d_backward_filter", "forward", "backward_data",
           "backward_filter", "check", "workspace", "fft_shape"]
