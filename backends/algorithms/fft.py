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

Workspace and the ``fft-chunked`` rule: the spectra of every plane are held at
once, ``N C + O C/G + N O`` of them; OverFeat's conv5 backward-data at batch 128
needs 2.4 GB, which the memory-aware autotune choice (``peak_tolerance``) traded
for a slower cuDNN engine (docs/results-h200.md, sixteenth session). With the
option ``chunks = k`` the channels that are not summed over (the output channels
forward and backward-filter, the input channels backward-data) are done ``k``
runs at a time: the operand transformed whole (x, or gy backward-data) once, then
per run the weights' and the result's spectra of those channels only, so the
spectra fall to ``whole + (O C/G + result) / k`` (:func:`workspace` counts the copies the
transforms and products make of each). The transforms are the same
ones, the products the same sums split into ``k`` matmuls; the rule
``fft-chunked`` (tags ``fft``, ``fast``) offers ``k`` = 2, 4, 8 on nodes whose
weight and result spectra reach :data:`CHUNKED_FROM`, so the cached decisions of
every smaller node keep their key (``passes/autotune_contenders.py``).

Accuracy: float32 inputs are transformed in single precision (NumPy >= 2 and CuPy
keep complex64); relative error vs the float64 reference is ~1e-6, within the
1e-3 SEMANTICS.md allows for FFT. Written against ``xp``; the transforms are
``scipy.fft``'s on NumPy (single precision kept on every NumPy version, fewer temporaries than
``numpy.fft``'s float64 loops) and ``cupy.fft``'s on CuPy.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import scipy.fft

from opgraph.errors import ParameterError

from .products import matmul
from ..reference.conv import check_gy, conv_geometry, geometry_of, pad_spatial, result_dtype

FFT_SIZE_LIMIT = 2**31 - 1  # elements of one 2-D transform plane (32-bit plan sizes)


def _fft(xp):
    """The transforms for ``xp``: ``scipy.fft`` for NumPy arrays (``numpy.fft`` returns
    complex128 for float32 on NumPy 1.x and keeps float64 temporaries on 2.x, several times the
    spectra :func:`workspace` declares), else ``xp.fft`` (CuPy's cuFFT)."""
    return scipy.fft if xp is np else xp.fft


def fft_shape(geom) -> tuple[int, int]:
    """Transform size per axis: the next 2-3-5 smooth length >= the padded input."""
    return (scipy.fft.next_fast_len(geom.hp, real=True), scipy.fft.next_fast_len(geom.wp, real=True))


def _by_frequency(xp, a):
    """``a[..., m, k, f]`` as the contiguous frequency-major operand ``(F, ..., m, k)`` of
    :func:`_products` (a copy: NumPy's matmul falls back to a non-BLAS loop for arbitrarily
    strided operands); made once for an operand every chunk reads."""
    return xp.ascontiguousarray(xp.moveaxis(a, -1, 0))


def _products(xp, af, bf):
    """``out[..., m, p, f] = sum_k a[..., m, k, f] * b[..., k, p, f]`` from the frequency-major
    operands of :func:`_by_frequency`; a view with the frequencies last again.

    Frequencies and the other batch axes (groups) are one batch of one complex matmul
    (:func:`.products.matmul`: on CuPy our own cuBLAS handle, which a CUDA graph can capture).
    """
    batch = af.shape[:-2]
    if bf.shape[:-2] != batch:
        raise ValueError(f"fft products: batch axes {af.shape[:-2]} and {bf.shape[:-2]} differ")
    k = math.prod(batch)
    out = matmul(xp, af.reshape(k, *af.shape[-2:]), bf.reshape(k, *bf.shape[-2:]))
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


def _runs(indices, step: int | None = None) -> list[slice]:
    """Sorted ``indices`` as maximal runs of a constant step, found greedily from the left:
    ``step`` itself where given, else each run's first difference."""
    out, i = [], 0
    while i < len(indices):
        start = int(indices[i])
        if i + 1 == len(indices):
            out.append(slice(start, start + 1))
            break
        gap = int(indices[i + 1]) - start
        if step is not None and gap != step:
            out.append(slice(start, start + 1))
            i += 1
            continue
        j = i + 1
        while j + 1 < len(indices) and int(indices[j + 1]) - int(indices[j]) == gap:
            j += 1
        out.append(slice(start, int(indices[j]) + 1, gap))
        i = j + 1
    return out


def _progressions(indices, period: int = 1) -> list[slice]:
    """Sorted ``indices`` as a few slices of constant step, so that zeroing them takes a few
    slice assignments and no host-to-device copy of an index array on the GPU. Greedy runs
    (:func:`_runs`), or where fewer, with ``period`` > 1 (the stride: the cells a stride
    skips repeat with its period, e.g. rows 1 and 2 of every 3 for k=1, s=3), the trailing
    contiguous run and then one run of step ``period`` per phase: a slice per skipped phase,
    not one per period. Never more slices than the greedy runs."""
    indices = np.asarray(indices, dtype=np.int64)
    plain = _runs(indices)
    if period <= 1 or len(plain) <= 2:
        return plain
    j = len(indices) - 1  # the trailing run of consecutive cells (past the last window)
    while j > 0 and indices[j] - indices[j - 1] == 1:
        j -= 1
    rest = indices[:j]
    phased = [s for c in range(period) for s in _runs(rest[rest % period == c], period)]
    phased.append(slice(int(indices[j]), int(indices[-1]) + 1, 1))
    return phased if len(phased) < len(plain) else plain


def _untouched(size, out, k, s, d, begin) -> np.ndarray:
    """Indices ``r`` in ``[0, size)`` of one axis that no window reads (no ``i < out``,
    ``p < k`` with ``r = i*s + p*d - begin``): their input gradient is exactly 0
    (SEMANTICS.md), where the transforms leave rounding noise."""
    touched = np.zeros(size, bool)
    taps = (np.arange(out)[:, None] * s + np.arange(k)[None, :] * d - begin).ravel()
    touched[taps[(taps >= 0) & (taps < size)]] = True
    return np.flatnonzero(~touched)


def conv2d_forward(xp, x, w, *, stride=1, padding=0, dilation=1, groups=1, chunks=1):
    """FFT convolution (cross-correlation) ``(N, C, H, W) * (O, C/G, kH, kW) -> (N, O, Ho, Wo)``
    of arrays outside a graph (validated by :func:`conv_geometry`); :func:`forward`
    runs a node on its geometry.

    Raises:
        ParameterError, ShapeError: bad parameters or shapes (see :func:`conv_geometry`).
    """
    g = conv_geometry(x.shape, w.shape, stride=stride, padding=padding, dilation=dilation, groups=groups)
    return forward(xp, x, w, g, chunks)


def pieces(size: int, chunks) -> list[tuple[int, int]]:
    """``[(start, stop), ...]``: ``size`` channels in runs of ``ceil(size / chunks)`` (the last
    shorter; so ``pieces(10, 8)`` is 5 runs of 2), one run for ``chunks = 1`` or no channels.

    Raises:
        ParameterError: ``chunks`` not an int >= 1 (the ``fft-chunked`` rule's option)."""
    if isinstance(chunks, bool) or not isinstance(chunks, numbers.Integral) or chunks < 1:
        raise ParameterError("chunks", chunks, "must be an int >= 1 (channels are transformed in that many runs)")
    if size <= 0:
        return [(0, size)]
    step = -(-size // min(int(chunks), size))
    return [(i, min(i + step, size)) for i in range(0, size, step)]


def forward(xp, x, w, g, chunks=1):
    """:func:`conv2d_forward` with the geometry ``g`` (``ConvGeometry``), which it trusts;
    ``chunks`` (the ``fft-chunked`` rule's option) transforms the weights and the output
    ``ceil(O/G / chunks)`` channels of each group at a time (module docstring)."""
    dt = result_dtype(xp, x, w)
    s = fft_shape(g)
    G = g.groups
    xf = _fft(xp).rfft2(pad_spatial(xp, x.astype(dt, copy=False), g.padding), s=s)
    planes, F = xf.shape[-2:], xf.shape[-2] * xf.shape[-1]
    af = _by_frequency(xp, xf.reshape(g.n, G, g.cg, F).transpose(1, 0, 2, 3))  # (F, G, N, Cg)
    del xf  # each chunk's arrays are dropped as soon as used: the workspace counts one chunk
    wg = _dilate(xp, w.astype(dt, copy=False), g.dilation)
    wg = wg.reshape(G, g.og, *wg.shape[1:])
    eh, ew = g.kernel_extent
    y = xp.empty((g.n, G, g.og, g.ho, g.wo), dtype=dt)
    for o0, o1 in pieces(g.og, chunks):
        wf = _fft(xp).rfft2(wg[:, o0:o1], s=s)  # (G, ok, Cg, Fh, Fw)
        bf = _by_frequency(xp, wf.reshape(G, o1 - o0, g.cg, F).transpose(0, 2, 1, 3))  # (F, G, Cg, ok)
        del wf
        xp.conjugate(bf, out=bf)  # cross-correlation: X * conj(W)
        product = _products(xp, af, bf)  # (G, N, ok, F)
        del bf
        yf = product.transpose(1, 0, 2, 3).reshape(g.n, G, o1 - o0, *planes)
        del product
        y[:, :, o0:o1] = _fft(xp).irfft2(yf, s=s)[..., :g.hp - eh + 1:g.stride[0], :g.wp - ew + 1:g.stride[1]]
        del yf
    return y.reshape(g.n, g.o, g.ho, g.wo)


def conv2d_backward_data(xp, gy, w, *, stride=1, padding=0, dilation=1, groups=1, input_shape, chunks=1):
    """FFT input gradient: full convolution of the zero-upsampled ``gy`` with the
    dilated kernel, then the padding border cropped; shape ``input_shape``
    (arrays outside a graph; :func:`backward_data` runs a node).

    Raises:
        ParameterError, ShapeError: bad parameters, or gy not of the output shape.
    """
    g = conv_geometry(input_shape, w.shape, stride=stride, padding=padding, dilation=dilation, groups=groups)
    check_gy(g, gy.shape)
    return backward_data(xp, gy, w, g, chunks)


def backward_data(xp, gy, w, g, chunks=1):
    """:func:`conv2d_backward_data` with the geometry ``g``, which it trusts; ``chunks``
    transforms the weights and the input gradient ``ceil(C/G / chunks)`` channels of each
    group at a time (module docstring)."""
    dt = result_dtype(xp, gy, w)
    s = fft_shape(g)
    G = g.groups
    gf = _fft(xp).rfft2(_upsample(xp, gy.astype(dt, copy=False), g), s=s)
    planes, F = gf.shape[-2:], gf.shape[-2] * gf.shape[-1]
    af = _by_frequency(xp, gf.reshape(g.n, G, g.og, F).transpose(1, 0, 2, 3))  # (F, G, N, Og)
    del gf  # each chunk's arrays are dropped as soon as used: the workspace counts one chunk
    wg = _dilate(xp, w.astype(dt, copy=False), g.dilation)
    wg = wg.reshape(G, g.og, *wg.shape[1:])
    # The full convolution has (Ho-1)*s + d*(k-1) + 1 <= Hp rows; rows past it, and the rows
    # between windows a stride skips, are 0 up to rounding: set exactly (_untouched).
    (t, _), (l, _) = g.padding
    gx = xp.empty((g.n, G, g.cg, g.h, g.w), dtype=dt)
    for c0, c1 in pieces(g.cg, chunks):
        wf = _fft(xp).rfft2(wg[:, :, c0:c1], s=s)  # (G, Og, ck, Fh, Fw)
        bf = _by_frequency(xp, wf.reshape(G, g.og, c1 - c0, F))  # (F, G, Og, ck)
        del wf
        product = _products(xp, af, bf)  # (G, N, ck, F)
        del bf
        xf = product.transpose(1, 0, 2, 3).reshape(g.n, G, c1 - c0, *planes)
        del product
        gx[:, :, c0:c1] = _fft(xp).irfft2(xf, s=s)[..., t:t + g.h, l:l + g.w]
        del xf
    rows = _untouched(g.h, g.ho, g.kh, g.stride[0], g.dilation[0], t)
    cols = _untouched(g.w, g.wo, g.kw, g.stride[1], g.dilation[1], l)
    for sl in _progressions(rows, g.stride[0]):
        gx[..., sl, :] = 0
    for sl in _progressions(cols, g.stride[1]):
        gx[..., sl] = 0
    return gx.reshape(g.n, g.c, g.h, g.w)


def conv2d_backward_filter(xp, x, gy, *, stride=1, padding=0, dilation=1, groups=1, weight_shape, chunks=1):
    """FFT weight gradient: correlation of the padded input with the zero-upsampled
    ``gy`` summed over the batch, read at the dilated taps; shape ``weight_shape``.
    Batch 0 gives zeros. Arrays outside a graph; :func:`backward_filter` runs a node.

    Raises:
        ParameterError, ShapeError: bad parameters, or gy not of the output shape.
    """
    g = conv_geometry(x.shape, weight_shape, stride=stride, padding=padding, dilation=dilation, groups=groups)
    check_gy(g, gy.shape)
    return backward_filter(xp, x, gy, g, chunks)


def backward_filter(xp, x, gy, g, chunks=1):
    """:func:`conv2d_backward_filter` with the geometry ``g``, which it trusts; ``chunks``
    transforms the output gradient and the weight gradient ``ceil(O/G / chunks)`` channels of
    each group at a time (module docstring)."""
    dt = result_dtype(xp, x, gy)
    s = fft_shape(g)
    G = g.groups
    xf = _fft(xp).rfft2(pad_spatial(xp, x.astype(dt, copy=False), g.padding), s=s)
    planes, F = xf.shape[-2:], xf.shape[-2] * xf.shape[-1]
    bf = _by_frequency(xp, xf.reshape(g.n, G, g.cg, F).transpose(1, 0, 2, 3))  # (F, G, N, Cg)
    del xf  # each chunk's arrays are dropped as soon as used: the workspace counts one chunk
    up = _upsample(xp, gy.astype(dt, copy=False), g)
    up = up.reshape(g.n, G, g.og, *up.shape[2:])
    eh, ew = g.kernel_extent
    # written piece by piece into a fresh array: a 1x1 kernel's crop of the inverse transform is
    # contiguous, and a view would keep the whole transform (O*C/G*Hf*Wf values) alive
    gw = xp.empty((G, g.og, g.cg, g.kh, g.kw), dtype=dt)
    for o0, o1 in pieces(g.og, chunks):
        gf = _fft(xp).rfft2(up[:, :, o0:o1], s=s)  # (N, G, ok, Fh, Fw)
        af = _by_frequency(xp, gf.reshape(g.n, G, o1 - o0, F).transpose(1, 2, 0, 3))  # (F, G, ok, N)
        del gf
        xp.conjugate(af, out=af)  # correlation: X * conj(GY)
        product = _products(xp, af, bf)  # (G, ok, Cg, F)
        del af
        wf = product.reshape(G, o1 - o0, g.cg, *planes)
        del product
        gw[:, o0:o1] = _fft(xp).irfft2(wf, s=s)[..., :eh:g.dilation[0], :ew:g.dilation[1]]
        del wf
    return gw.reshape(g.o, g.cg, g.kh, g.kw)


def check(direction: str, op, in_types, device: str) -> str | None:
    """Decline only a transform plane too large for 32-bit FFT plan sizes; every
    stride, dilation, padding and group form is computed (see the module docstring)."""
    g = geometry_of(direction, op, in_types)
    lh, lw = fft_shape(g)
    if lh * lw > FFT_SIZE_LIMIT:
        return f"fft: transform plane {lh}x{lw} exceeds {FFT_SIZE_LIMIT} elements"
    return None


#: The ``fft-chunked`` rule applies where the spectra chunking can split (the weights' and the
#: result's, as :func:`workspace` counts them for one run) reach this many bytes: below it they
#: are small beside a step's activations at the batch sizes benchmarked, and every node the rule
#: applies to has a new autotune cache key (2 GiB: 2-25 convolution nodes per built-in model at
#: its benchmark batch).
CHUNKED_FROM = 2**31
#: The chunk counts the ``fft-chunked`` rule offers the autotuner (those up to the
#: number of channels chunked; module docstring).
CHUNKS = (2, 4, 8)


def _chunked_channels(direction: str, g) -> int:
    """Channels per group that ``direction`` transforms ``chunks`` runs at a time: the output
    channels (forward, backward-filter), the input channels (backward-data)."""
    return g.cg if direction == "backward_data" else g.og


def _spectra(direction: str, g, dtype: str) -> tuple[int, int, int]:
    """``(whole, chunkable, plane_bytes)``: the planes transformed whole (x, or gy for
    backward-data), the planes that go one run at a time (the weights' and the result's), and
    the bytes of one complex plane of a ``dtype`` input (complex128 for float64, else
    complex64)."""
    lh, lw = fft_shape(g)
    whole = g.n * g.o if direction == "backward_data" else g.n * g.c
    result = g.n * g.groups * _chunked_channels(direction, g)
    itemsize = 8 if dtype == "float64" else 4
    return whole, g.o * g.cg + result, lh * (lw // 2 + 1) * 2 * itemsize


#: Copies counted per plane in :func:`workspace`, an upper bound of what NumPy's FFTs hold at
#: once (measured with tracemalloc: ``tests/backends/test_conv_algorithms.py``): the operand
#: transformed whole is padded (a real copy), transformed (the last axis, then a copy along the
#: other) and made frequency-major; a run's weights or result are transformed the same way, or
#: multiplied and reshaped, and inverse-transformed through a copy.
WHOLE_COPIES, RUN_COPIES = 4, 3


def workspace(direction: str, op, in_types, options) -> int:
    """Scratch bytes, an upper bound: :data:`WHOLE_COPIES` of the spectra of the operand
    transformed whole (x, or gy for backward-data) and :data:`RUN_COPIES` of one run's weight
    and result spectra (``options['chunks']`` runs, default 1: all channels at once)."""
    g = geometry_of(direction, op, in_types)
    size = _chunked_channels(direction, g)
    piece = max(b - a for a, b in pieces(size, dict(options).get("chunks", 1)))
    whole, chunkable, plane = _spectra(direction, g, in_types[0].dtype)
    return (WHOLE_COPIES * whole + RUN_COPIES * chunkable * piece // max(size, 1)) * plane


def check_chunked(direction: str, op, in_types, device: str) -> str | None:
    """The ``fft-chunked`` rule: :func:`check`'s plane limit, and only where there are channels
    to chunk (at least 2 per group) and the spectra chunking can shed (the weights' and the
    result's) take at least :data:`CHUNKED_FROM` bytes."""
    why = check(direction, op, in_types, device)
    if why is not None:
        return why
    g = geometry_of(direction, op, in_types)
    if _chunked_channels(direction, g) < 2:
        return f"fft-chunked: one {'input' if direction == 'backward_data' else 'output'} channel per group"
    _, chunkable, plane = _spectra(direction, g, in_types[0].dtype)
    shed = RUN_COPIES * chunkable * plane  # what workspace() counts for them, all in one run
    if shed < CHUNKED_FROM:
        return (f"fft-chunked: the weight and result spectra chunking would split take {shed / 2**20:.0f} MiB, "
                f"under the {CHUNKED_FROM // 2**20} MiB where it starts to matter")
    return None


def chunk_variants(direction: str, op, in_types, device: str) -> list[dict]:
    """One candidate per chunk count of :data:`CHUNKS` up to the channels chunked."""
    size = _chunked_channels(direction, geometry_of(direction, op, in_types))
    return [{"chunks": k} for k in CHUNKS if k <= size]


__all__ = ["conv2d_forward", "conv2d_backward_data", "conv2d_backward_filter", "forward", "backward_data",
           "backward_filter", "check", "check_chunked", "chunk_variants", "workspace", "fft_shape", "pieces",
           "CHUNKED_FROM", "CHUNKS", "WHOLE_COPIES", "RUN_COPIES"]
