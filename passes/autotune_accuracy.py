"""Whether a candidate's output is correct: its relative error to the float64 reference, within a tolerance.

The autotune pass runs each candidate once on the node's inputs and compares
its output with the reference rule's, computed in float64 on the same
inputs: :func:`relative_error` within :func:`tolerance` (SEMANTICS.md,
"Numbers"; NaN never passes). Separate from the pass because the benchmark's
whole-model check (``benchmarks/check.py``) and diagnostic scripts judge
outputs by the same two functions.
"""

from __future__ import annotations

import math

import numpy as np

#: The exact-summation algorithms (direct, GEMM, im2col): :func:`tolerance` holds
#: them to 1e-4 in fp32, the transform algorithms (FFT, Winograd, cuDNN engines) to 1e-3.
EXACT_ALGORITHMS = ("reference", "direct", "gemm", "cuda", "unfold")


def tolerance(algorithm: str, precision: str = "fp32", dtype: str = "float32") -> float:
    """Largest accepted relative error (SEMANTICS.md "Numbers"): half precision
    1e-2, TF32 5e-3, fp32 1e-4 for exact-summation algorithms (direct, GEMM)
    and 1e-3 for transform algorithms (FFT, Winograd, cuDNN engines); float64 1e-9."""
    if dtype in ("float16", "bfloat16") or precision in ("bf16", "fp16"):
        return 1e-2
    if precision == "tf32":
        return 5e-3
    if dtype == "float64":
        return 1e-9
    return 1e-4 if algorithm in EXACT_ALGORITHMS else 1e-3


def poisoned_copy(a):
    """A copy of ``a`` (its strides kept) for a kernel to fill (``Op.fills``), every element 255
    (an integer array) or NaN (a float one): what the kernel leaves unwritten fails
    :func:`filled_error`, and ``a`` itself, shared with other checks, is never written."""
    out = a.copy(order="K")
    out.fill(255 if out.dtype.kind in "ui" else float("nan"))
    return out


def filled_error(xp, got, want) -> float:
    """The error of what a kernel wrote into an input it fills (``Op.fills``): 0 or inf for
    integers (window indices: one misrouted window is a wrong gradient, whatever the norm),
    :func:`relative_error` for floats (a sum's rounding); NaN for a shape mismatch."""
    if tuple(got.shape) != tuple(want.shape):
        return math.nan
    if got.dtype.kind in "uib" and want.dtype.kind in "uib":
        return 0.0 if bool(xp.array_equal(got, want)) else math.inf
    return relative_error(xp, got, want)


def relative_error(xp, out, ref) -> float:
    """``||out - ref|| / ||ref||`` computed in float64 on the arrays' device
    (absolute error when ``ref`` is all zeros); NaN for a shape mismatch or
    a non-finite value.

    On the device, not the host: copying a large conv output and its
    reference to the host for every candidate dominated autotuning time.
    """
    if tuple(out.shape) != tuple(ref.shape):
        return math.nan
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: the NaN below says it
        diff = float(xp.linalg.norm((out.astype(xp.float64) - ref.astype(xp.float64)).ravel()))
        norm = float(xp.linalg.norm(ref.ravel().astype(xp.float64)))
    err = diff / norm if norm > 0 else diff
    return err if math.isfinite(err) else math.nan


__all__ = ["poisoned_copy", "filled_error", "EXACT_ALGORITHMS", "tolerance", "relative_error"]
