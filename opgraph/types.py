"""Static type of a graph value: shape, dtype and layout."""

from __future__ import annotations

import math

import attrs
import numpy as np

#: the dtypes of a graph's sources, constants and ONNX tensors: floats and class indices (int64)
DTYPES = ("float16", "bfloat16", "float32", "float64", "int64")
#: dtypes only ops make: a max pooling's saved window indices (``ops.MaxPool2dArgmax``)
INDEX_DTYPES = ("uint8",)
#: the storage orders of a 4-D value (``Graph.set_layout``, ``TensorType.layout``)
LAYOUTS = ("NCHW", "NHWC")


def _canon_shape(shape) -> tuple[int, ...]:
    try:
        dims = tuple(shape)
    except TypeError:  # not "'float' object is not iterable", which names neither shape nor value
        raise TypeError(f"shape {shape!r} is not a sequence of dimensions (a tuple of ints)") from None
    try:
        out = tuple(int(s) for s in dims)
        whole = all(int(s) == s for s in dims)
    except (TypeError, ValueError):  # None, 'a'
        whole = False
    if not whole or any(s < 0 for s in out):
        raise ValueError(f"shape {dims}: every dimension must be an int >= 0")
    return out


def numpy_dtype(name) -> np.dtype:
    """The NumPy dtype of a dtype name (or dtype) of :data:`DTYPES`; bfloat16 is
    ``ml_dtypes.bfloat16`` (NumPy has none; importing ml_dtypes registers it,
    and CuPy >= 14 takes it as well).

    Raises:
        ValueError: not one of :data:`DTYPES`.
    """
    name = _canon_dtype(name)
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def as_dtype(xp, a, name: str):
    """``a`` (any shape) as an array of ``xp`` in the dtype named ``name`` (of
    :data:`DTYPES`), converted where it lies. NumPy knows bfloat16 only as
    ``ml_dtypes``' type (:func:`numpy_dtype`); CuPy converts a device array to
    ``'bfloat16'`` by the name, the path the benchmark's per-node checks take on
    the H200 (docs/gpu.md).

    Raises:
        ValueError: ``name`` is not one of :data:`DTYPES`.
    """
    return xp.asarray(a, dtype=numpy_dtype(name) if xp is np else _canon_dtype(name))


def rounded(value: float, dtype: str) -> float:
    """The Python float ``value`` rounded to storage ``dtype`` (a name of
    :data:`DTYPES`), as NumPy rounds a scalar compared with an array of that
    dtype; beyond the dtype's range, an infinity (as a stored value would be).
    On the host: kernels compare their operands with the rounded constant."""
    with np.errstate(over="ignore"):
        return float(np.asarray(value, dtype=numpy_dtype(dtype)).astype(np.float64))


#: The floating dtypes (what ``compile(dtype=...)`` may replace).
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def is_float(dtype: str) -> bool:
    """Whether the dtype name ``dtype`` is one of :data:`FLOAT_DTYPES`."""
    return dtype in FLOAT_DTYPES


#: Storage dtypes that compute in float32 (SEMANTICS.md, "Numbers": half
#: precision accumulates in fp32; the result is rounded once to the storage).
HALF_DTYPES = ("float16", "bfloat16")


def compute_dtype(xp, dtype):
    """The dtype a kernel computes in for storage ``dtype`` (a dtype, scalar type
    or name): ``xp.float32`` for :data:`HALF_DTYPES`, else ``dtype`` itself.
    Source: SEMANTICS.md, "Numbers" (half precision accumulates in fp32).

    Raises:
        TypeError: ``dtype`` is not a dtype NumPy knows (bfloat16 needs ml_dtypes).
    """
    return xp.float32 if np.dtype(dtype).name in HALF_DTYPES else dtype


def _canon_dtype(dtype) -> str:
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    if name not in DTYPES + INDEX_DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {DTYPES}")
    return name


@attrs.frozen
class TensorType:
    """Shape (logical NCHW order for 4-D activations), dtype name and layout.

    ``layout`` is the physical memory order chosen by the layout pass
    (``'NCHW'`` or ``'NHWC'`` for 4-D values, ``None`` otherwise); the logical
    shape is always NCHW so results never depend on it.
    """

    shape: tuple[int, ...] = attrs.field(converter=_canon_shape)
    dtype: str = attrs.field(default="float32", converter=_canon_dtype)
    layout: str | None = None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return 2 if self.dtype in ("float16", "bfloat16") else np.dtype(self.dtype).itemsize

    @property
    def nbytes(self) -> int:
        """Bytes of a dense buffer of this type."""
        return self.size * self.itemsize

    def with_shape(self, shape) -> "TensorType":
        return attrs.evolve(self, shape=shape)

    def __str__(self) -> str:
        layout = f" {self.layout}" if self.layout not in (None, "NCHW") else ""
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]{layout}"


def run_type(t: TensorType, dtype: str | None) -> TensorType:
    """``t`` as a node runs it when ``compile(dtype=...)`` replaces the floating
    dtype by ``dtype`` (None: as declared); integer values keep theirs."""
    return attrs.evolve(t, dtype=dtype) if dtype is not None and is_float(t.dtype) else t


def is_channels_last(a) -> bool:
    """Whether the 4-D array ``a`` (logical NCHW) is stored channels-last: the
    NCHW-shaped view of a C-contiguous (N, H, W, C) buffer. An array that is
    both (C == 1, or H == W == 1) counts as NCHW.

    Called after every 4-D step of an NHWC plan, so the usual case (packed
    channels-last strides) is decided without building a transposed view."""
    if getattr(a, "ndim", 0) != 4 or a.flags.c_contiguous:
        return False
    _, c, h, w = a.shape
    item = a.itemsize
    if tuple(a.strides) == (h * w * c * item, item, w * c * item, c * item):
        return True
    return a.transpose(0, 2, 3, 1).flags.c_contiguous


def storage_order(a) -> str | None:
    """``'NHWC'`` for a 4-D array whose channel axis is the fastest in memory
    (packed channels-last, or a strided view of a channels-last buffer such
    as a channel slice of a concat's, every other channel included), ``'NCHW'``
    for another 4-D one (and for one channel or one pixel, where both orders
    are the same memory), else None.

    A kernel that copies a strided operand into a dense one copies it into
    this order: a channel slice of an NHWC buffer copied C-contiguous (NCHW)
    flipped the layout of everything downstream, and a cuDNN engine tuned on
    the NHWC graph was asked to run the NCHW one (DenseNet-121, fp32, H200,
    2026-12-02: ``cudnnGraphNotSupportedError`` at run time)."""
    if getattr(a, "ndim", 0) != 4:
        return None
    if is_channels_last(a):
        return "NHWC"
    if a.flags.c_contiguous:
        return "NCHW"
    _, c, h, w = a.shape
    spatial = [abs(st) for st, n in zip(a.strides[2:], (h, w)) if n > 1]
    # one channel or one pixel: both orders are the same memory (NCHW, as is_channels_last says)
    if c == 1 or not spatial:
        return "NCHW"
    return "NHWC" if abs(a.strides[1]) < min(spatial) else "NCHW"


def to_layout(xp, a, layout: str | None):
    """``a`` (logical NCHW) stored in ``layout``: for ``'NHWC'`` the NCHW-shaped
    view of a channels-last copy (strides ``(HWC, 1, WC, C)``); otherwise ``a``.

    Every kernel reads its operands through their strides, so the storage
    order changes speed, never values (SEMANTICS.md).
    """
    if layout != "NHWC" or getattr(a, "ndim", 0) != 4 or is_channels_last(a):
        return a
    return xp.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
