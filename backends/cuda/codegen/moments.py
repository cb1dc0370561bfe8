"""The normalisations' shared arithmetic as IR: one-pass shifted moments and the
reciprocal standard deviation, used by batch norm's statistics (per channel,
``expressions.py``) and layer norm's (per row, ``layer_norm.py``).

For a full value x, a shift s (one of x's own elements in the target's space:
the first element of each channel or row) and n the elements summed per entry::

    d = x - s,  m1 = <d>,  var = max(<d^2> - m1^2, 0)  (biased),  mean = s + m1

(Chan, Golub & LeVeque, "Algorithms for computing the sample variance", 1983:
the shift keeps the one-pass variance from cancelling when the mean is far from
0). Sums are in CT (fp32 for half storage); ``rstd = 1 / sqrt(var + eps)``.
"""

from __future__ import annotations

from .storage import lit


def shifted_moments(b, x, shift, target: str, trailing: int | None = None):
    """``(d, m1, var, n)`` of the full value ``x`` over the axes ``target`` drops
    (``'channel'``, or ``'row'`` with ``trailing`` the split's k), shifted by ``shift``
    (a value of ``target``'s space); ``n`` is the count each entry sums (module docstring)."""
    d = b.expr("({0} - {1})", b.value(x), shift)
    n = b.count(target)
    m1 = b.expr("({0} / {1})", b.reduce(d, target, trailing), n)
    m2 = b.expr("({0} / {1})", b.reduce(b.expr("({0} * {0})", d), target, trailing), n)
    return d, m1, b.expr("fmax({0} - {1} * {1}, (CT)0)", m2, m1), n


def rstd(b, var, eps: float):
    """``1 / sqrt(var + eps)`` of a variance value, ``eps`` as a CT literal."""
    return b.expr(f"((CT)1 / sqrt({{0}} + {lit(eps)}))", var)


__all__ = ["shifted_moments", "rstd"]
