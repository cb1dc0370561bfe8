"""How generated kernels hold, load and store each storage dtype, 16 bytes at a time.

Every array is passed to a kernel as a pointer to its C-contiguous buffer
(the physical order: NCHW, or NHWC for a channels-last tensor) in a C type of
its own size: float32 as ``float``, float64 as ``double``, bfloat16 and
float16 as ``unsigned short`` bit patterns (no ``cuda_fp16.h``, which NVRTC
does not always find). A kernel computes in ``CT``: ``float``, or ``double``
when an operand is float64; each load converts to CT and each store rounds
once:

* bfloat16: load ``bits << 16`` (exact), store rounded to nearest even with
  NaN kept a quiet NaN (``storage.BF16_DEVICE``, the same conversions as
  every other kernel of this package);
* float16: PTX ``cvt.f32.f16`` / ``cvt.rn.f16.f32`` (``__half2float`` and
  ``__float2half_rn`` compile to these);
* float32 / float64: C conversions.

Vector access (:func:`vector_load`, :func:`vector_store`): ``V`` consecutive
elements as ``V * itemsize / 16`` ``uint4`` words (8 bfloat16 or float16, 4
float32, 2 float64 per word), unpacked into ``V`` scalar lanes. A kernel
uses it only where every operand's buffer is 16-byte aligned and the element
index of lane 0 is a multiple of V (``plan.py`` decides).

The device helpers (:data:`DEVICE_HELPERS`) also hold the 32-bit fast
division by a run-time divisor (Granlund & Montgomery, "Division by
invariant integers using multiplication", PLDI 1994; the ``(mul, shift)``
form CUTLASS's ``FastDivmod`` uses): ``q = (umulhi(n, mul) + n) >> shift``,
exact for ``n, d < 2^31`` (:func:`magic`). CUDA intrinsics the text uses
(``__umulhi``, ``__uint_as_float``, ``__hiloint2double``...) are the ones the
CPU emulator of the tests defines; it defines ``OPGRAPH_CPU`` and its own
float16 conversions.
"""

from __future__ import annotations

import math

import attrs

from ..storage import BF16_DEVICE


@attrs.frozen
class Storage:
    """One storage dtype: its C buffer type, size and conversions."""

    name: str
    ctype: str
    itemsize: int
    load_fn: str = ""   # device function element -> CT ('' : a C conversion)
    store_fn: str = ""  # device function CT -> element ('' : a C conversion)

    def load(self, element: str) -> str:
        """``element`` (an expression of the C type) as CT."""
        return f"{self.load_fn}({element})" if self.load_fn else f"(CT)({element})"

    def store(self, value: str) -> str:
        """CT ``value`` as an element of the C type (rounded once)."""
        return f"{self.store_fn}({value})" if self.store_fn else f"({self.ctype})({value})"


STORAGES = {
    "bfloat16": Storage("bfloat16", "unsigned short", 2, "opgraph_bf16_load", "opgraph_bf16_bits"),
    "float16": Storage("float16", "unsigned short", 2, "opgraph_h2f", "opgraph_f2h"),
    "float32": Storage("float32", "float", 4),
    "float64": Storage("float64", "double", 8),
}


def storage_of(dtype: str) -> Storage:
    """The :class:`Storage` of dtype name ``dtype``. Raises KeyError for another."""
    return STORAGES[dtype]


def compute_type(dtypes) -> str:
    """``'double'`` when one of ``dtypes`` is float64, else ``'float'``."""
    return "double" if "float64" in dtypes else "float"


#: Device helpers every generated source starts with (module docstring).
DEVICE_HELPERS = BF16_DEVICE + r"""
#ifndef OPGRAPH_CPU
__device__ __forceinline__ float opgraph_h2f(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ unsigned short opgraph_f2h(float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
}
#endif
__device__ __forceinline__ unsigned int opgraph_div(unsigned int n, unsigned int mul, unsigned int shift) {
    return (__umulhi(n, mul) + n) >> shift;
}
__device__ __forceinline__ bool opgraph_dropout_keep(unsigned long long k, unsigned long long state,
                                                     unsigned long long golden, unsigned long long m1,
                                                     unsigned long long m2, unsigned int threshold) {
    unsigned long long z = state + (k + 1ull) * golden;
    z = (z ^ (z >> 30)) * m1;
    z = (z ^ (z >> 27)) * m2;
    z = z ^ (z >> 31);
    return (unsigned int)(z >> 40) >= threshold;
}
"""


def magic(d: int) -> tuple[int, int]:
    """``(mul, shift)`` of the fast division by ``d`` (1 <= d < 2^31): for every
    ``0 <= n < 2^31``, ``(umulhi(n, mul) + n) >> shift == n // d``.

    Raises:
        ValueError: d outside [1, 2^31).
    """
    if not 1 <= d < 2 ** 31:
        raise ValueError(f"fast division needs 1 <= d < 2^31, got {d}")
    shift = (d - 1).bit_length()
    return ((1 << 32) * ((1 << shift) - d)) // d + 1, shift


def lit(value: float) -> str:
    """A CT literal of the real ``value`` (inf and NaN spelled as bit patterns)."""
    v = float(value)
    if math.isnan(v):
        return "(CT)__uint_as_float(0x7fc00000u)"
    if math.isinf(v):
        return f"(CT){'-' if v < 0 else ''}__uint_as_float(0x7f800000u)"
    return f"((CT){v!r})"


def _lane(st: Storage, word: str, lane: int) -> str:
    """Lane ``lane`` of a ``uint4`` named ``word`` holding elements of ``st``."""
    per = 16 // st.itemsize
    comp = "xyzw"
    j = lane % per
    if st.itemsize == 2:
        return st.load(f"(unsigned short)({word}.{comp[j // 2]} >> {16 * (j % 2)})")
    if st.itemsize == 4:
        return f"(CT)__uint_as_float({word}.{comp[j]})"
    return f"(CT)__hiloint2double((int){word}.{comp[2 * j + 1]}, (int){word}.{comp[2 * j]})"


def vector_load(st: Storage, ptr: str, index: str, lanes: int, name: str) -> tuple[list[str], list[str]]:
    """Statements loading ``lanes`` elements of ``ptr`` from element ``index`` on,
    and the CT expression of each lane. ``lanes == 1``: a plain scalar load."""
    if lanes == 1:
        return [], [st.load(f"{ptr}[{index}]")]
    if lanes * st.itemsize % 16:
        raise ValueError(f"{lanes} lanes of {st.name} are not whole 16-byte words")
    words = lanes * st.itemsize // 16
    lines = [f"const uint4 {name}_w{q} = reinterpret_cast<const uint4*>({ptr} + {index})[{q}];"
             for q in range(words)]
    per = 16 // st.itemsize
    return lines, [_lane(st, f"{name}_w{j // per}", j) for j in range(lanes)]


def vector_store(st: Storage, ptr: str, index: str, values: list[str], name: str) -> list[str]:
    """Statements storing the CT ``values`` (one per lane) at ``ptr[index...]``."""
    if len(values) == 1:
        return [f"{ptr}[{index}] = {st.store(values[0])};"]
    per = 16 // st.itemsize
    lines = []
    for q in range(len(values) * st.itemsize // 16):
        lanes = values[q * per:(q + 1) * per]
        if st.itemsize == 2:
            bits = [f"(unsigned int){st.store(v)}" for v in lanes]
            words = [f"{bits[2 * k]} | ({bits[2 * k + 1]} << 16)" for k in range(4)]
        elif st.itemsize == 4:
            words = [f"__float_as_uint((float)({v}))" for v in lanes]
        else:
            words = []
            for v in lanes:
                words += [f"(unsigned int)__double2loint((double)({v}))",
                          f"(unsigned int)__double2hiint((double)({v}))"]
        lines.append(f"{{ uint4 {name}_s{q}; " + " ".join(
            f"{name}_s{q}.{c} = {w};" for c, w in zip("xyzw", words))
            + f" reinterpret_cast<uint4*>({ptr} + {index})[{q}] = {name}_s{q}; }}")
    return lines


__all__ = ["Storage", "STORAGES", "storage_of", "compute_type", "DEVICE_HELPERS", "magic", "lit",
           "vector_load", "vector_store"]
