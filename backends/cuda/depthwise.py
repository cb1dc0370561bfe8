"""Backward-data of a depthwise convolution on channels-last tensors: one CUDA thread per element of dx.

A depthwise convolution (``groups`` = input channels = output channels, one
filter per channel: MobileNet-v2's and EfficientNet-B0's 3x3 and 5x5 layers)
does ``kH * kW`` multiply-adds per element it reads, so its backward-data is
memory-bound. cuDNN's depthwise backward-data ran MobileNet-v2's stride-2
3x3 layer (batch 128, 96 channels, 112 x 112) at 1.5 TFLOP/s on the H200 in
bf16: 0.48 ms for 308 MB of dx and 77 MB of gy, about 6x the time one pass
over them takes at the copy bandwidth (docs/performance.md, tenth session;
PyTorch's benchmark mode gets the same cuDNN kernels). This kernel is an
autotune candidate beside cuDNN's engines (the ``cuda`` rule of
``Conv2dBackwardData``), so it runs only where it is correct and faster.

For dx ``(N, C, H, W)`` and gy ``(N, C, Ho, Wo)``, both channels-last, and w
``(C, 1, kH, kW)``::

    dx[n, c, i, j] = sum over kh, kw of gy[n, c, oh, ow] * w[c, 0, kh, kw]
    where oh = (i + pad_top - kh * dilation_h) / stride_h, ow likewise,
    for the taps where both divisions are exact and in range

(the transpose of the forward's gather; Dumoulin & Visin, "A guide to
convolution arithmetic for deep learning", 2016, section 4). Thread ``t``
computes element ``t`` of dx in its physical (NHWC) order, so a warp reads
and writes consecutive channels; the sum is in the compute type (float32 for
half storage), rounded once on the store. Any stride, dilation and
padding, asymmetric included.
"""

from __future__ import annotations

from opgraph.errors import ShapeError
from opgraph.types import is_float

from .pool import _INT32_LIMIT, _computable, _finish, _run, _storage
from .storage import bits

_GEO = ("C", "H", "W", "HO", "WO", "KH", "KW", "SH", "SW", "PT", "PL", "DH", "DW")

_BODY = r"""
    const IDX c = i % C;
    IDX r = i / C;
    const IDX j = r % W;
    r /= W;
    const IDX h = r % H;
    const IDX n = r / H;
    CT acc = (CT)0;
    for (IDX kh = 0; kh < KH; ++kh) {
        const IDX ty = h + PT - kh * DH;
        if (ty < 0 || ty % SH != 0) continue;
        const IDX oh = ty / SH;
        if (oh >= HO) continue;
        for (IDX kw = 0; kw < KW; ++kw) {
            const IDX tx = j + PL - kw * DW;
            if (tx < 0 || tx % SW != 0) continue;
            const IDX ow = tx / SW;
            if (ow >= WO) continue;
            acc += LD(gy[((n * HO + oh) * WO + ow) * C + c]) * LD(w[(c * KH + kh) * KW + kw]);
        }
    }
    ST(dx[i], acc);
"""


def declines(gy_shape, w_shape, groups: int, input_shape, gy_layout: str | None, padding=((0, 0), (0, 0)),
             dilation=(1, 1)) -> str | None:
    """Why the ``cuda`` rule does not take this node, or None: it takes
    channels-last depthwise convolutions of multiplier 1 (the kernel itself
    takes any layout, copying others to channels-last first)."""
    c = input_shape[1]
    if not (groups == c == w_shape[0] == gy_shape[1] and w_shape[1] == 1):
        return (f"not a depthwise convolution of multiplier 1 (groups={groups}, input channels {c}, "
                f"weight {tuple(w_shape)})")
    if gy_layout != "NHWC":
        return f"the depthwise kernel takes channels-last (NHWC) tensors, the output gradient is {gy_layout}"
    reach = [(k - 1) * d + p[0] + n for k, d, p, n in zip(w_shape[2:], dilation, padding, input_shape[2:])]
    if max(reach) >= _INT32_LIMIT:  # the tap arithmetic h + PT - kh * DH, whatever the tensors' sizes
        return f"padding {tuple(padding)} and dilation {tuple(dilation)} reach beyond 32-bit tap arithmetic"
    return None


def conv2d_backward_data(xp, gy, w, *, stride, padding, dilation, groups, input_shape):
    """``dL/dx`` of a depthwise convolution (module docstring): gy ``(N, C, Ho,
    Wo)`` channels-last, w ``(C, 1, kH, kW)`` -> ``input_shape`` ``(N, C, H, W)``,
    channels-last, in gy's dtype. ``padding`` is ``((top, bottom), (left, right))``.

    Raises:
        ShapeError: not a depthwise convolution of multiplier 1, a geometry
            beyond 32-bit tap arithmetic, or operands of different dtypes.
    """
    why = declines(gy.shape, w.shape, groups, input_shape, "NHWC", padding, dilation)
    if why:
        raise ShapeError(f"depthwise conv2d_backward_data: {why}")
    # the NHWC buffer: gy's own memory when channels-last (also where the layout is
    # ambiguous: a batch of 0, one channel, a 1 x 1 plane), else a copy
    buf = xp.ascontiguousarray(bits(xp, gy).transpose(0, 2, 3, 1))
    if w.dtype != gy.dtype:
        raise ShapeError(f"depthwise conv2d_backward_data: weight {w.dtype} and output gradient {gy.dtype} differ")
    n, c, h, wd = (int(v) for v in input_shape)
    buf = _computable(xp, buf)  # float16 computed from a float32 copy, as the pooling kernels do
    dx = xp.empty((n, h, wd, c), dtype=buf.dtype)
    if dx.size:
        (pt, _), (pl, _) = padding
        kh, kw = w.shape[2:]
        # the filter taps of channel c at c * kH * kW + kh * kW + kw: OIHW and OHWI orders
        # agree when each filter has one input channel
        wbuf = _computable(xp, xp.ascontiguousarray(bits(xp, w)).reshape(-1))
        geo = (c, h, wd, gy.shape[2], gy.shape[3], kh, kw, *stride, pt, pl, *dilation)
        _run("depthwise_dgrad", "raw T gy, raw T w", [buf.ravel(), wbuf], "raw T dx",
             [dx.ravel()], _BODY, geo, size=dx.size, arrays=(dx, buf), storage=_storage(gy.dtype),
             geometry_names=_GEO)
    return _finish(xp, dx, True, gy.dtype)


def conv2d_backward_data_kernel(ctx, op, gy, w):
    """The ``cuda`` rule's kernel of ``Conv2dBackwardData`` (:func:`conv2d_backward_data`)."""
    return conv2d_backward_data(ctx.xp, gy, w, **op.conv_params(), input_shape=op.input_shape)


def check(op, in_types, device) -> str | None:
    """Why the rule declines a node (:func:`declines`), or None."""
    gy, w = in_types
    if not is_float(gy.dtype):
        return f"the depthwise kernel takes floating dtypes, got {gy.dtype}"
    if w.dtype != gy.dtype:
        return f"the depthwise kernel takes one dtype: weight {w.dtype}, output gradient {gy.dtype}"
    return declines(gy.shape, w.shape, op.groups, op.input_shape, gy.layout, op.padding, op.dilation)


__all__ = ["declines", "conv2d_backward_data", "conv2d_backward_data_kernel", "check"]
