"""How our CuPy kernels hold their operands: bfloat16 as its bits, layouts as
C-contiguous buffers, and the element-wise kernel cache.

bfloat16 (``ml_dtypes.bfloat16``, dtype name ``'bfloat16'``) is taken by every
kernel of this package and returned in the same dtype and layout, computed in
float32 with the load and store inside the kernel (no cast pass over the
tensor): the kernel gets the array's uint16 bit pattern (:func:`bits`, a
view), loads an element as ``__uint_as_float(bits << 16)`` (exact) and stores
a float32 result rounded to nearest even (NaN kept a quiet NaN, overflow to
inf), as :func:`float_to_bf16_bits` does; the ``LD``/``ST``/``CT`` macros of
:func:`storage_preamble` say how, per storage type (the identity for the
other dtypes, whose kernels compile to what they were). So comparisons (ReLU
and threshold masks, NaN tests) are those of float32 on the bf16 values, and
an output that is an input element (ReLU, the selects) is that element's bits.

A 4-D array is NCHW when C-contiguous and channels-last (NHWC) when it is a
``(0, 3, 1, 2)`` view of a C-contiguous NHWC buffer; :func:`physical`,
:func:`in_layout` and :func:`logical` move between the logical NCHW view and
the buffer a kernel indexes.

Element-wise kernels compile on first use (NVRTC) and are cached per source
(:func:`elementwise_kernel`).
"""

from __future__ import annotations

import functools

import numpy as np

from opgraph.errors import ShapeError
from opgraph.types import numpy_dtype, storage_order


@functools.lru_cache(maxsize=None)
def elementwise_kernel(name: str, in_params: str, out_params: str, code: str, preamble: str = ""):
    """The ``cupy.ElementwiseKernel`` ``opgraph_<name>`` of these parameters and
    body, compiled on first use and cached (CuPy imported here, not at module
    import)."""
    import cupy
    return cupy.ElementwiseKernel(in_params, out_params, code, f"opgraph_{name}", preamble=preamble)


# ------------------------------------------------------------------ storage types

#: numpy dtype name of bfloat16 (``ml_dtypes.bfloat16``): stored as 16 bits,
#: computed in float32 inside our kernels (module docstring).
BF16 = "bfloat16"

#: Device functions of bfloat16 storage: bits -> float32 (exact: the bits are
#: float32's upper half) and float32 -> bits rounded to nearest even, a NaN
#: kept a quiet NaN (sign and top payload bits kept), overflow to inf.
BF16_DEVICE = r"""
__device__ __forceinline__ float opgraph_bf16_load(unsigned short b) {
    return __uint_as_float(((unsigned int)b) << 16);
}
__device__ __forceinline__ unsigned short opgraph_bf16_bits(float f) {
    const unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
"""

_BF16_MACROS = BF16_DEVICE + ("#define CT float\n#define LD(e) opgraph_bf16_load(e)\n"
                              "#define ST(e, v) ((e) = opgraph_bf16_bits(v))\n")
_PLAIN_MACROS = "#define CT T\n#define LD(e) (e)\n#define ST(e, v) ((e) = (v))\n"


def dtype_name(dtype) -> str:
    """numpy's name of ``dtype`` (a dtype, a scalar type or a name): ``'bfloat16'``,
    ``'float32'``... (the name ``'bfloat16'`` is returned as is: NumPy knows it
    only once ml_dtypes is imported)."""
    return BF16 if isinstance(dtype, str) and dtype == BF16 else np.dtype(dtype).name


def storage_preamble(storage: str) -> str:
    """CUDA preamble of an element-wise kernel whose ``T`` arrays hold ``storage``
    (a numpy dtype name, as the caller's array had it before :func:`bits`).

    Defines ``CT`` (the compute type), ``LD(e)`` (an element of a ``T`` array
    as CT) and ``ST(e, v)`` (store the CT value ``v`` into element ``e``).
    bfloat16: T is ``unsigned short`` (the bits), CT ``float``, LD/ST the
    conversions of :data:`BF16_DEVICE`. Any other storage: CT is T and LD/ST
    the identity, so a kernel compiles to what it did without the macros.
    ``T``-typed constants such as ``(T)0`` stay bit patterns (0 is +0.0 in
    every storage)."""
    return _BF16_MACROS if storage == BF16 else _PLAIN_MACROS


def kernel_tag(storage: str) -> str:
    """Suffix of a kernel's name per storage: ``'_bf16'`` for bfloat16, else ``''``
    (the float kernels keep their names)."""
    return "_bf16" if storage == BF16 else ""


def is_bf16(a) -> bool:
    """Whether array ``a`` holds bfloat16."""
    return dtype_name(a.dtype) == BF16


def bits(xp, a):
    """``a`` as our kernels take it: a bfloat16 array as its uint16 bit pattern
    (a view: same shape and strides, so layout checks still hold), any other
    array unchanged. CuPy copies, transposes and allocates uint16 arrays; it
    may not compute on bfloat16 ones, so bfloat16 data stays in this form until
    :func:`unbits`."""
    return a.view(xp.uint16) if is_bf16(a) else a


def unbits(a, dtype):
    """A result held as ``bits`` (:func:`bits`) back in ``dtype``: a view for
    bfloat16, ``a`` itself otherwise."""
    return a.view(numpy_dtype(BF16)) if dtype_name(dtype) == BF16 else a


def host_to_device(cp, a, dtype: str):
    """Host array ``a`` (float64, any shape) on the device in storage ``dtype``
    (``'bfloat16'``: rounded to nearest even by ml_dtypes and copied as its
    bits, which CuPy cannot convert to; anything else: float32). A 4-D ``a``
    (NCHW) is stored channels-last and returned viewed NCHW, as the channels-last
    kernels take it; other ranks keep C order. For the GPU tests and device
    scripts that feed those kernels."""
    import ml_dtypes

    host = np.ascontiguousarray(a.transpose(0, 2, 3, 1)) if a.ndim == 4 else np.ascontiguousarray(a)
    if dtype_name(dtype) == BF16:
        dev = cp.asarray(host.astype(ml_dtypes.bfloat16).view(np.uint16)).view(ml_dtypes.bfloat16)
    else:
        dev = cp.asarray(host.astype(np.float32))
    return dev.transpose(0, 3, 1, 2) if a.ndim == 4 else dev


def zeros(xp, shape, dtype):
    """``zeros(shape, dtype)``; bfloat16 allocated as uint16 zeros (+0.0) and viewed."""
    if dtype_name(dtype) == BF16:
        return xp.zeros(shape, dtype=xp.uint16).view(dtype)
    return xp.zeros(shape, dtype=dtype)


def copy(xp, a):
    """A copy of ``a`` in its dtype and layout (bfloat16 copied as its bits)."""
    return unbits(bits(xp, a).copy(), a.dtype)


def like(xp, a, dtype):
    """``a`` as a kernel whose storage is ``dtype`` takes it (:func:`bits` form):
    a view when a already has that dtype, else converted (a pass over a;
    bfloat16 through :func:`float_to_bf16_bits` / :func:`bf16_bits_to_float`).
    For mixed-dtype calls (an op's two float operands in different dtypes)."""
    want, have = dtype_name(dtype), dtype_name(a.dtype)
    if have == want:
        return bits(xp, a)
    if have == BF16:
        a = bf16_bits_to_float(xp, bits(xp, a))
    if want == BF16:
        return float_to_bf16_bits(xp, a.astype(xp.float32, copy=False))
    return a.astype(dtype, copy=False)



def same_shape(what: str, a, b) -> None:
    """Raises ShapeError naming ``what`` when ``a`` and ``b`` differ in shape."""
    if tuple(a.shape) != tuple(b.shape):
        raise ShapeError(f"{what}: shapes differ, {a.shape} and {b.shape}")


# ------------------------------------------------------------------ bfloat16 bits

def float_to_bf16_bits(xp, x):
    """float32 -> bfloat16, round to nearest even, as uint16 bit patterns
    (NaN stays a quiet NaN, overflow rounds to inf). Layout kept."""
    k = elementwise_kernel("f32_to_bf16", "float32 x", "uint16 y", "y = opgraph_bf16_bits(x)", BF16_DEVICE)
    return k(x, xp.empty_like(x, dtype=xp.uint16))


def bf16_bits_to_float(xp, bits):
    """bfloat16 bit patterns (uint16) -> float32 (exact). Layout kept."""
    k = elementwise_kernel("bf16_to_f32", "uint16 x", "float32 y", "y = opgraph_bf16_load(x)", BF16_DEVICE)
    return k(bits, xp.empty_like(bits, dtype=xp.float32))



# ------------------------------------------------------------------ layouts

def physical(xp, x):
    """``(buffer, channels_last)``: a C-contiguous array holding x's memory
    (NHWC order when x is a channels-last view of a 4-D tensor), copying only
    when x is neither NCHW- nor NHWC-contiguous."""
    if storage_order(x) == "NHWC":  # packed: a view; a strided NHWC view: its NHWC copy
        return xp.ascontiguousarray(x.transpose(0, 2, 3, 1)), True
    return xp.ascontiguousarray(x), False


def in_layout(xp, a, cl: bool):
    """The C-contiguous buffer of ``a`` in NHWC (``cl``) or NCHW order (copies if needed)."""
    return xp.ascontiguousarray(a.transpose(0, 2, 3, 1) if cl else a)


def logical(buf, cl: bool):
    """Inverse of :func:`physical`: the NCHW-shaped view of ``buf``."""
    return buf.transpose(0, 3, 1, 2) if cl else buf


def dense_strides(shape, cl: bool) -> tuple:
    """Element strides (not bytes) of a dense ``(N, C, H, W)``-shaped tensor
    stored NHWC (``cl``) or NCHW, as cuDNN's tensor descriptors take them."""
    n, c, h, w = shape
    return (c * h * w, 1, w * c, c) if cl else (c * h * w, h * w, w, 1)


def empty_in_layout(xp, shape, dtype, cl: bool):
    """A new uninitialised ``(N, C, H, W)``-shaped array of ``dtype``, stored
    NHWC (a channels-last view, ``cl``) or NCHW."""
    if cl:
        n, c, h, w = shape
        return logical(xp.empty((n, h, w, c), dtype=dtype), True)
    return xp.empty(shape, dtype=dtype)


__all__ = ["BF16", "BF16_DEVICE", "elementwise_kernel", "storage_preamble", "kernel_tag", "dtype_name",
           "is_bf16", "bits", "unbits", "host_to_device", "zeros", "copy", "like", "same_shape", "float_to_bf16_bits",
           "bf16_bits_to_float", "physical", "in_layout", "logical", "dense_strides", "empty_in_layout"]
