"""Forward of a depthwise convolution of stride 1 on channels-last tensors: the
backward-data kernel's generated gather (:mod:`.depthwise`) with the taps mirrored.

A depthwise convolution (``groups`` = input channels = output channels, one
filter per channel) does ``kH * kW`` multiply-adds per element it reads, so
it is memory-bound. On ConvNeXt-tiny's 7x7 ones (bf16, an H100,
``docs/results/h100-2026-12-06b``) the engines cuDNN 9.19 built for the
``cudnn`` lowering's graph (the convolution, then its bias: 5 engines) ran
at 1.1-1.2 % of the copy bandwidth (128 x 96 x 56 x 56: 4.17 ms a layer; the
18 layers 30.25 ms of the 56.2 ms the profiled steps summed to), where the
backward-data gather of the same layers took 0.245 ms a layer. PyTorch's
call on the same cuDNN, without the bias, ran the 18 in 2.32 ms, so cuDNN
has a fast kernel the biased graph does not reach; ``scripts/depthwise_bench.py``
times every engine both ways beside this kernel.

A stride-1 convolution is the transpose of another stride-1 convolution with
the kernel mirrored and the padding ``k - 1 - p`` (Dumoulin & Visin, "A guide
to convolution arithmetic for deep learning", 2016, section 4.4; with
dilation d the kernel's effective size is ``(k - 1) * d + 1``, section 5.1,
so the padding ``(k - 1) * d - p``): with
``w'[c, kh, kw] = w[c, KH - 1 - kh, KW - 1 - kw]``::

    y[n, c, i, j] = b[c] + sum over kh, kw of x[n, c, i - PT + kh * DH, j - PL + kw * DW] * w[c, kh, kw]
                  = b[c] + sum over kh, kw of x[n, c, i + PT' - kh * DH, j + PL' - kw * DW] * w'[c, kh, kw]

with ``PT' = (KH - 1) * DH - PT`` (and PL' likewise; negative where the
padding reaches past the kernel, which the gather allows: its taps are
bounds-checked), the taps outside x contributing nothing, as zero padding
does. That is the backward-data gather with ``SH = SW = 1``, x in gy's place
and the output in dx's, so the same generated code computes it: 16 bytes of
channels of a strip of output pixels per thread, each input word of a kernel
row loaded once and added into every pixel of the strip it feeds, float32 sums (float64
for float64) rounded once on the store, the bias the sums start from. A
strided forward is not a gather of that form (its transpose is the strided
backward-data), so the rule declines it and cuDNN's engines take it.

The ``cuda`` rule of ``Conv2d`` offers this kernel to the autotuner beside
cuDNN's engines (its variants: :func:`.depthwise.variants`), so it runs only
where it is correct and faster; tag ``depthwise-fprop``
(``exclude=['depthwise-fprop']`` turns it alone off).
"""

from __future__ import annotations

from opgraph.errors import ShapeError
from opgraph.params import conv_out_size

from ..reference.conv import conv_geometry
from .depthwise import _INT32_LIMIT, PIXELS, declines, gather, operand_dtypes, variants as _gather_variants
from .kernel_sources import fingerprinted

#: the kernels' revision, part of the autotune cache key (:func:`variants`)
REVISION = 1


def _mirrored_padding(w_shape, padding, dilation) -> tuple:
    """``((PT', 0), (PL', 0))``: the gather's top and left padding (module docstring)."""
    return tuple(((k - 1) * d - p[0], 0) for k, p, d in zip(w_shape[2:], padding, dilation))


def forward_shape(x_shape, w_shape, padding, dilation) -> tuple:
    """The stride-1 output ``(N, C, Ho, Wo)`` of input ``x_shape`` ``(N, C, H, W)``, filter ``w_shape``
    ``(C, 1, kH, kW)``, ``padding`` ``((top, bottom), (left, right))`` and ``dilation`` ``(dh, dw)``."""
    return (x_shape[0], w_shape[0],
            *(conv_out_size(n, k, 1, d, p) for n, k, p, d in zip(x_shape[2:], w_shape[2:], padding, dilation)))


def declines_forward(x_shape, w_shape, groups: int, x_layout: str | None, stride, padding, dilation) -> str | None:
    """Why the ``cuda`` rule of ``Conv2d`` does not take this node, or None: it takes
    channels-last depthwise convolutions of multiplier 1 and stride 1. Shapes as
    :func:`forward_shape`; ``x_layout`` the input's declared layout (``'NHWC'``)."""
    if tuple(stride) != (1, 1):
        return f"stride {tuple(stride)}: the depthwise forward kernel takes stride 1 (cuDNN's engines the others)"
    # the padded input's extent bounds every row and column index the kernel forms (32-bit ints)
    if max(n + p0 + p1 + (k - 1) * d for n, k, (p0, p1), d in zip(x_shape[2:], w_shape[2:], padding, dilation)) \
            >= _INT32_LIMIT:
        return f"padding {tuple(padding)} and dilation {tuple(dilation)} reach beyond 32-bit tap arithmetic"
    # the gather's output in dx's place, with x's channel count (what the message names as input channels)
    out = (x_shape[0], x_shape[1], *forward_shape(x_shape, w_shape, padding, dilation)[2:])
    return declines(x_shape, w_shape, groups, out, x_layout, _mirrored_padding(w_shape, padding, dilation), dilation,
                    role="input")


def variants(op, in_types, device):
    """The autotune variants: the backward-data gather's (strip width, row tiles),
    with this rule's :data:`REVISION` and both modules' code in the cache key."""
    return _gather_variants(op, in_types, device)


variants.revision = REVISION
variants.fingerprint = fingerprinted(__name__, "opgraph.backends.cuda.depthwise")


def conv2d(xp, x, w, b=None, *, stride, padding, dilation, groups, pixels=PIXELS, rows=1):
    """A depthwise convolution of stride 1 (module docstring): x ``(N, C, H, W)``
    (channels-last, or copied to it), w ``(C, 1, kH, kW)``, b ``(C,)`` or None ->
    ``(N, C, Ho, Wo)``, channels-last, in x's dtype. ``padding`` is ``((top,
    bottom), (left, right))``; ``pixels`` and ``rows`` as
    :func:`.depthwise.conv2d_backward_data` (the same result whatever they are).

    Raises:
        ShapeError: a stride other than 1, not a depthwise convolution of
            multiplier 1, a geometry beyond 32-bit tap arithmetic, a bias not
            of shape ``(C,)``, a window larger than the padded input
            (:func:`.reference.conv.conv_geometry`'s check), or operands of
            different dtypes.
    """
    why = declines_forward(x.shape, w.shape, groups, "NHWC", stride, padding, dilation)
    if why:
        raise ShapeError(f"depthwise conv2d: {why}")
    if b is not None and tuple(b.shape) != (x.shape[1],):
        raise ShapeError(f"depthwise conv2d: bias shape {tuple(b.shape)} != (channels,) = ({x.shape[1]},)")
    geo = conv_geometry(x.shape, w.shape, padding=padding, dilation=dilation, groups=groups)
    out_shape = (geo.n, geo.o, geo.ho, geo.wo)
    dtypes = [f"input {x.dtype}", f"weight {w.dtype}", *([f"bias {b.dtype}"] if b is not None else [])]
    if len({x.dtype, w.dtype, *([b.dtype] if b is not None else [])}) > 1:
        raise ShapeError(f"depthwise conv2d: {', '.join(dtypes[:-1])} and {dtypes[-1]} differ")
    top_left = tuple(p for p, _ in _mirrored_padding(w.shape, padding, dilation))
    return gather(xp, x, w, b, out_shape=out_shape, stride=(1, 1),
                  top_left=top_left, dilation=dilation, pixels=pixels, rows=rows, flip=True)


def conv2d_kernel(ctx, op, x, w, b=None):
    """The ``cuda`` rule's kernel of ``Conv2d`` (:func:`conv2d`; the :func:`variants`
    options ``pixels`` and ``rows``)."""
    return conv2d(ctx.xp, x, w, b, **op.conv_params(), pixels=int(ctx.options.get("pixels", PIXELS)),
                  rows=int(ctx.options.get("rows", 1)))


def check(op, in_types, device) -> str | None:
    """Why the rule declines a node (:func:`.depthwise.operand_dtypes`,
    :func:`declines_forward`), or None."""
    x, w, *b = in_types
    why = operand_dtypes(input=x, weight=w, **({"bias": b[0]} if b else {}))
    if why:
        return why
    return declines_forward(x.shape, w.shape, op.groups, x.layout, op.stride, op.padding, op.dilation)


__all__ = ["conv2d", "conv2d_kernel", "check", "declines_forward", "forward_shape", "variants", "REVISION"]
