"""attrs field factories shared by the op families (validated, canonical)."""

from __future__ import annotations

import math
from numbers import Integral, Real

import attrs

from ..errors import ParameterError
from ..params import pair, padding2d


def _int_at_least(name: str, minimum: int):
    def convert(v):
        if not isinstance(v, Integral) or isinstance(v, bool) or v < minimum:
            raise ParameterError(name, v, f"must be an int >= {minimum}")
        return int(v)
    return convert


def _real(name: str, lo: float | None = None, hi: float | None = None, *, open_lo=False,
          infinite=False):
    """Converter to a float in [lo, hi] (``(lo, hi]`` with ``open_lo``). NaN is
    never a value (every comparison with it is false, so a range check alone
    lets it through); an infinity only where ``infinite`` says one has a meaning
    (a padding value of -inf, a one-sided clip)."""
    def convert(v):
        if not isinstance(v, Real) or isinstance(v, bool):
            raise ParameterError(name, v, "must be a real number")
        v = float(v)
        if math.isnan(v):
            raise ParameterError(name, v, "must be a number, not NaN")
        if math.isinf(v) and not infinite:
            raise ParameterError(name, v, "must be finite")
        if lo is not None and (v <= lo if open_lo else v < lo):
            raise ParameterError(name, v, f"must be {'>' if open_lo else '>='} {lo}")
        if hi is not None and v > hi:
            raise ParameterError(name, v, f"must be <= {hi}")
        return v
    return convert


def real_value(name: str, value, lo: float | None = None, hi: float | None = None) -> float:
    """``value`` checked as a finite real in [lo, hi], for a builder argument no
    op field holds (batch norm's ``momentum`` where nothing updates running
    statistics must still be a number).

    Raises:
        ParameterError: not a real, NaN, infinite or out of range.
    """
    return _real(name, lo, hi)(value)


def _bool(name: str):
    def convert(v):
        if not isinstance(v, (bool, Integral)) or v not in (0, 1):
            raise ParameterError(name, v, "must be a bool")
        return bool(v)
    return convert


def _shape(name: str):
    def convert(v):
        try:
            items = tuple(v)
        except TypeError:
            raise ParameterError(name, v, "must be a sequence of ints") from None
        if not all(isinstance(i, Integral) and not isinstance(i, bool) and i >= 0 for i in items):
            raise ParameterError(name, v, "entries must be ints >= 0")
        return tuple(int(i) for i in items)
    return convert


def spatial(name: str, default=(1, 1), minimum: int = 1):
    return attrs.field(default=default, kw_only=True,
                       converter=lambda v: pair(name, v, minimum=minimum))


def padding(default=((0, 0), (0, 0))):
    return attrs.field(default=default, kw_only=True, converter=padding2d)


def integer(name: str, default=None, minimum: int = 0):
    kw = {} if default is None else {"default": default}
    return attrs.field(kw_only=True, converter=_int_at_least(name, minimum), **kw)


def _signed(v: float) -> tuple:
    """A float field's equality key: the value and its sign bit, so that ops differing only in
    a signed zero (``Threshold(value=-0.0)``, whose output zeros are negative) are not equal and
    hash apart; the plan and fingerprint caches keyed by op would otherwise run one's kernel for
    the other."""
    return v, math.copysign(1.0, v)


def real(name: str, default=None, lo=None, hi=None, open_lo=False, infinite=False):
    """A float field in [lo, hi]: finite unless ``infinite``, never NaN (:func:`_real`); -0.0
    and 0.0 are different values of it (:func:`_signed`)."""
    kw = {} if default is None else {"default": default}
    return attrs.field(kw_only=True, converter=_real(name, lo, hi, open_lo=open_lo, infinite=infinite),
                       eq=_signed, **kw)


def flag(name: str, default: bool = False):
    return attrs.field(default=default, kw_only=True, converter=_bool(name))


def shape(name: str):
    return attrs.field(kw_only=True, converter=_shape(name))


def axis(default: int = 1):
    return attrs.field(default=default, kw_only=True, converter=_int_at_least("axis", -8))


def choice(name: str, choices: tuple, default=None):
    """A field holding one of ``choices`` (ParameterError naming it otherwise)."""
    def convert(v):
        if v not in choices:
            raise ParameterError(name, v, f"must be one of {choices}")
        return v
    kw = {} if default is None else {"default": default}
    return attrs.field(kw_only=True, converter=convert, **kw)
