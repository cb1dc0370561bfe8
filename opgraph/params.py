"""Canonical forms and size rules of convolution and pooling parameters.

All formulas follow ``shared/design/SEMANTICS.md``:

* output size ``floor((in + pad_begin + pad_end - d*(k-1) - 1) / s) + 1``;
* ``'same'`` is TensorFlow's rule (``out = ceil(in / s)``, extra pixel at the
  bottom/right);
* pooling with ``ceil_mode`` drops a last window that would start at or beyond
  ``in + pad_begin``.

Canonical forms, used by every op so that equal ops compare equal:

* a spatial pair is ``(h, w)`` of ints;
* padding is ``((top, bottom), (left, right))`` of ints.
"""

from __future__ import annotations

from numbers import Integral

from .errors import ParameterError

Pair = tuple[int, int]
Padding = tuple[tuple[int, int], tuple[int, int]]


def _is_int(v) -> bool:
    return isinstance(v, Integral) and not isinstance(v, bool)


def pair(name: str, value, *, minimum: int) -> Pair:
    """Canonicalise an int or an ``(h, w)`` pair; each entry must be >= minimum.

    Raises:
        ParameterError: a non-integer, a wrong length, or an entry < minimum.
    """
    try:
        items = (value, value) if _is_int(value) else tuple(value)
    except TypeError:
        raise ParameterError(name, value, "must be an int or a pair of ints") from None
    if len(items) != 2 or not all(_is_int(v) for v in items):
        raise ParameterError(name, value, "must be an int or a pair of ints")
    if any(v < minimum for v in items):
        raise ParameterError(name, value, f"every entry must be >= {minimum}")
    return (int(items[0]), int(items[1]))


def same_padding(in_hw: Pair, kernel: Pair, stride: Pair, dilation: Pair) -> Padding:
    """TensorFlow's ``'same'``: ``out = ceil(in/s)``, extra pad at bottom/right."""
    pads = []
    for n, k, s, d in zip(in_hw, kernel, stride, dilation):
        out = -(-n // s)
        total = max((out - 1) * s + d * (k - 1) + 1 - n, 0)
        pads.append((total // 2, total - total // 2))
    return (pads[0], pads[1])


def padding2d(value, *, in_hw: Pair | None = None, kernel: Pair | None = None,
              stride: Pair = (1, 1), dilation: Pair = (1, 1)) -> Padding:
    """Canonicalise padding given as int, ``(ph, pw)``, ``((t, b), (l, r))``,
    ``'valid'`` or ``'same'`` (the last needs ``in_hw`` and ``kernel``).

    Raises:
        ParameterError: unknown string, negative entry or malformed value.
    """
    if isinstance(value, str):
        mode = value.lower()
        if mode == "valid":
            return ((0, 0), (0, 0))
        if mode == "same":
            if in_hw is None or kernel is None:
                raise ParameterError("padding", value, "'same' needs the input and kernel size")
            return same_padding(in_hw, kernel, stride, dilation)
        raise ParameterError("padding", value, "strings allowed are 'same' and 'valid'")
    try:
        items = (value, value) if _is_int(value) else tuple(value)
    except TypeError:
        raise ParameterError("padding", value, "must be int, (ph, pw), ((top, bottom), (left, right)), 'same' or 'valid'") from None
    if len(items) != 2:
        raise ParameterError("padding", value, "must have two entries (height, width)")
    out = []
    for item in items:
        if _is_int(item):
            item = (item, item)
        try:
            a, b = item
        except (TypeError, ValueError):
            raise ParameterError("padding", value, "each side must be an int or a (begin, end) pair") from None
        if not (_is_int(a) and _is_int(b)):
            raise ParameterError("padding", value, "entries must be ints")
        if a < 0 or b < 0:
            raise ParameterError("padding", value, "entries must be >= 0")
        out.append((int(a), int(b)))
    return (out[0], out[1])


def conv_out_size(n: int, k: int, s: int, d: int, pad: tuple[int, int]) -> int:
    """Convolution output extent: ``floor((n + pb + pe - d*(k-1) - 1)/s) + 1``.

    May return a value < 1; callers turn that into an error naming the node.
    """
    return (n + pad[0] + pad[1] - d * (k - 1) - 1) // s + 1


def pool_out_size(n: int, k: int, s: int, pad: tuple[int, int], ceil_mode: bool) -> int:
    """Pooling output extent (dilation 1); with ``ceil_mode`` round up, then drop
    a last window starting at or beyond ``n + pad_begin`` (SEMANTICS.md)."""
    span = n + pad[0] + pad[1] - k
    if not ceil_mode:
        return span // s + 1
    out = -(-span // s) + 1
    if (out - 1) * s >= n + pad[0]:
        out -= 1
    return out


def describe(value) -> str:
    """Short text of a canonical parameter for graph dumps."""
    if isinstance(value, tuple) and value and isinstance(value[0], tuple):
        (t, b), (l, r) = value
        if t == b and l == r:
            return f"({t}, {l})" if t != l else str(t)
        return f"(({t}, {b}), ({l}, {r}))"
    if isinstance(value, tuple) and len(value) == 2 and value[0] == value[1]:
        return str(value[0])
    return repr(value)



__all__ = ["pair", "padding2d", "same_padding", "conv_out_size", "pool_out_size",
           "describe", "Pair", "Padding"]
