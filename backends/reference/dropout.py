"""Reference (oracle) kernel of ``Dropout``, and its counter-based mask.

The keep mask is a pure function of ``(seed, logical NCHW flat index, p)``,
computed with vectorised uint64 arithmetic on ``xp`` (NumPy or CuPy: no host
draw, no host-to-device copy, so a GPU step can be captured into a CUDA
graph) and by the generated CUDA kernel with the same integer operations
(``backends/cuda/codegen``), so both give the same mask bit for bit, in either
storage layout (the index is the logical one). The rule:

* ``state = mix(seed mod 2^64)``; for element ``k`` (row-major index of the
  logical shape), ``z = mix(state + (k + 1) * GOLDEN mod 2^64)``: the
  ``k+1``-th output of SplitMix64 started at ``state`` (Steele, Lea & Flood,
  "Fast splittable pseudorandom number generators", OOPSLA 2014; the
  finalizer constants are Stafford's "Mix13", also used by Java's
  ``SplittableRandom``);
* ``u = z >> 40`` (the top 24 bits, a uniform integer in ``[0, 2^24)``);
  the element is kept when ``u >= ceil(p * 2^24)`` (:func:`keep_threshold`),
  so ``P(keep) = 1 - p`` to within 2^-24, p = 0 keeps everything and p = 1
  nothing. The comparison is on integers: no rounding can differ between
  NumPy and CUDA.

The mask therefore depends only on (seed, shape), and the backward of
dropout is the same function applied to the output gradient.
"""

from __future__ import annotations

import math

import numpy as np

from opgraph import ops

from .kernel import reference

#: SplitMix64's increment (2^64 / golden ratio, odd) and its finalizer's multipliers.
GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
#: Bits of the uniform integer compared against the threshold.
KEEP_BITS = 24
_MASK64 = (1 << 64) - 1


def mix(z: int) -> int:
    """SplitMix64's finalizer on a Python int (mod 2^64)."""
    z &= _MASK64
    z = ((z ^ (z >> 30)) * MIX1) & _MASK64
    z = ((z ^ (z >> 27)) * MIX2) & _MASK64
    return z ^ (z >> 31)


def seed_state(seed: int) -> int:
    """The generator state of ``seed`` (any int >= 0, taken mod 2^64)."""
    return mix(int(seed))


def keep_threshold(p: float) -> int:
    """``ceil(p * 2^24)``: the smallest 24-bit draw that keeps its element
    (0 for p = 0: all kept; 2^24 for p = 1: none kept)."""
    return min(1 << KEEP_BITS, max(0, math.ceil(float(p) * (1 << KEEP_BITS))))


def keep_mask(xp, shape, *, seed: int, p: float):
    """Boolean keep mask of ``shape`` (logical, row-major), on ``xp``."""
    u64 = xp.uint64
    k = xp.arange(1, math.prod(shape) + 1, dtype=u64)
    z = k * u64(GOLDEN) + u64(seed_state(seed))  # uint64 arrays wrap mod 2^64
    z = (z ^ (z >> u64(30))) * u64(MIX1)
    z = (z ^ (z >> u64(27))) * u64(MIX2)
    z = z ^ (z >> u64(31))
    return (z >> u64(64 - KEEP_BITS) >= u64(keep_threshold(p))).reshape(tuple(shape))


@reference(ops.Dropout)
def dropout(xp, x, *, p, training, seed):
    """Inverted dropout.

    Not training (or ``p == 0``): a copy of x. Training: kept cells (the
    :func:`keep_mask` of ``(seed, x's logical shape)``) are scaled by
    ``1 / (1 - p)`` (in x's dtype), dropped cells are 0 (an inf or NaN input
    at a dropped cell gives 0); ``p == 1`` gives zeros. ``p`` outside
    ``[0, 1]`` is checked by the op, not here.

    Source: Srivastava et al., "Dropout", JMLR 2014 (inverted scaling as in
    PyTorch); the mask rule is this module's docstring. Returns x's shape and
    dtype, in x's memory layout.
    """
    if not training or p == 0:
        return x.copy()
    if p >= 1:
        return xp.zeros_like(x)
    keep = keep_mask(xp, x.shape, seed=seed, p=p)
    scaled = x * xp.asarray(1.0 / (1.0 - p), dtype=x.dtype)
    out = xp.where(keep, scaled, xp.zeros((), dtype=x.dtype))
    return out if out.dtype == x.dtype else out.astype(x.dtype)  # CuPy's bf16 where promotes


__all__ = ["GOLDEN", "MIX1", "MIX2", "KEEP_BITS", "mix", "seed_state", "keep_threshold", "keep_mask",
           "dropout"]
