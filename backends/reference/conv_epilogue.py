"""The epilogues of convolutions on a fresh convolution output, on any array
module: the bias of ``Conv2d`` and the fused ops' steps
(``opgraph/ops/conv_fused.py``: bias, residual add, ReLU / ReLU6, and
backward-data's ReLU gradient).

Every convolution algorithm without a fused kernel of its own runs its
convolution and then :func:`apply_epilogue` in place on the result, before a
half-precision result is rounded once (``backends/algorithms/rules.py``);
cuDNN does the same where no engine fuses the epilogue
(``backends/cuda/cudnn.py``). Semantics: SEMANTICS.md (ReLU and ReLU6 clip
with NaN propagating; the ReLU gradient is 0 at exactly 0 and for NaN).
"""

from __future__ import annotations

from opgraph.errors import ParameterError
from opgraph.ops.conv_fused import ACTIVATIONS, EPILOGUE_STEPS

from .elementwise import relu_backward


def _clip(xp, y, lo, hi):
    """``y`` clipped to ``[lo, hi]`` in place (None: unbounded); NaN propagates
    (``maximum`` / ``minimum`` do)."""
    if lo is not None:
        xp.maximum(y, xp.full((), lo, dtype=y.dtype), out=y)
    if hi is not None:
        xp.minimum(y, xp.full((), hi, dtype=y.dtype), out=y)
    return y


def apply_epilogue(xp, steps, y, operands):
    """``steps`` (names of ``EPILOGUE_STEPS``) applied in order to ``y``, in place.

    Args:
        xp: the array module.
        steps: e.g. ``('bias', 'add', 'relu6')`` (``epilogue_steps(op, n)``).
        y: the convolution's fresh output ``(N, O, Ho, Wo)`` (or backward-data's
            ``(N, C, H, W)``), in the dtype the kernel computes in.
        operands: the node's inputs after its first two, one per step that
            reads one, in order: ``b`` (O,), ``r`` (y's shape), the ReLU output
            ``y`` of ``drelu`` (y's shape).

    Returns:
        ``y``.

    Raises:
        ParameterError: an unknown step.
    """
    rest = iter(operands)
    for step in steps:
        if step not in EPILOGUE_STEPS:
            raise ParameterError("epilogue step", step, f"must be one of {list(EPILOGUE_STEPS)}")
        if step == "bias":
            y += next(rest).reshape(1, -1, 1, 1).astype(y.dtype, copy=False)
        elif step == "add":
            y += next(rest).astype(y.dtype, copy=False)
        elif step == "drelu":
            y = relu_backward(xp, next(rest).astype(y.dtype, copy=False), y, out=y)
        else:
            y = _clip(xp, y, *ACTIVATIONS[step])
    return y


__all__ = ["apply_epilogue"]
