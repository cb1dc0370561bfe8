"""ONNX converters of the activations of modern convnets: Clip (ReLU6),
Sigmoid, HardSigmoid, HardSwish, Gelu and Erf.

Semantics (ONNX operator spec, https://onnx.ai/onnx/operators/):

* ``Clip``: ``min(max(x, min), max)``. Version 6 takes ``min`` / ``max`` as
  attributes (defaults -/+ the largest float32, 3.4028235e38); from 11 on they
  are optional scalar inputs (absent: no bound), which must be import-time
  constants here. ``Clip(0, 6)`` is ReLU6 (``Hardtanh``); ``min=0`` alone is
  ``Relu``; no bound is the identity. ``min > max`` is refused (the spec then
  gives ``max`` everywhere; PyTorch refuses such a hardtanh).
* ``HardSigmoid``: ``max(0, min(1, alpha * x + beta))``, ONNX defaults alpha 0.2,
  beta 0.5 (PyTorch exports alpha 1/6 explicitly): the attributes are read.
* ``HardSwish``: ``x * max(0, min(1, x / 6 + 1/2))`` (alpha 1/6, beta 1/2 fixed).
* ``Gelu`` (opset 20): ``x * Phi(x)``, ``approximate`` 'none' (erf) or 'tanh'.
* ``Erf``: no opgraph op computes erf alone. Exporters write GELU with it
  before opset 20; :mod:`.patterns` reads that subgraph as one ``Gelu`` before
  conversion, so an ``Erf`` that reaches its converter is outside the pattern
  and is an error naming the node.
"""

from __future__ import annotations

import numpy as np

from ..ops import Gelu, Hardsigmoid, Hardswish, Hardtanh, Relu, Sigmoid
from ..ops.smooth_activation import GELU_APPROXIMATIONS
from .registry import converter

#: Version 6's default bounds: -/+ the largest float32.
FLOAT32_MAX = float(np.finfo(np.float32).max)


def _bound(ctx, i: int, what: str) -> float | None:
    """Input ``i`` (a scalar bound) as a float, or None where it is absent."""
    if not ctx.has_input(i):
        return None
    v = np.asarray(ctx.require_static(i, what))
    if v.size != 1:
        raise ctx.error(f"input {i} ({what}) must be a scalar, got shape {v.shape}")
    return float(v.reshape(()))


@converter("Clip", {6, 11, 12, 13})
def clip(ctx):
    x = ctx.input(0)
    if ctx.version == 6:
        lo, hi = float(ctx.attr("min", -FLOAT32_MAX)), float(ctx.attr("max", FLOAT32_MAX))
    else:
        lo, hi = _bound(ctx, 1, "min"), _bound(ctx, 2, "max")
    if lo is not None and hi is not None and lo > hi:
        raise ctx.error(f"min={lo} > max={hi} is not supported (the spec then returns max everywhere)")
    if lo is None and hi is None:
        return x
    if lo == 0.0 and hi is None:
        return ctx.apply(Relu, {}, [x])
    params = dict(min_val=-np.inf if lo is None else lo, max_val=np.inf if hi is None else hi)
    return ctx.apply(Hardtanh, params, [x])


@converter("Sigmoid", {6, 13})
def sigmoid(ctx):
    return ctx.apply(Sigmoid, {}, [ctx.input(0)])


@converter("HardSigmoid", {6, 22})
def hard_sigmoid(ctx):
    params = dict(alpha=float(ctx.attr("alpha", 0.2)), beta=float(ctx.attr("beta", 0.5)))
    return ctx.apply(Hardsigmoid, params, [ctx.input(0)])


@converter("HardSwish", {14, 22})
def hard_swish(ctx):
    return ctx.apply(Hardswish, {}, [ctx.input(0)])


@converter("Gelu", {20})
def gelu(ctx):
    approximate = ctx.attr("approximate", "none")
    if approximate not in GELU_APPROXIMATIONS:
        raise ctx.error(f"attribute approximate={approximate!r} is not 'none' or 'tanh'")
    return ctx.apply(Gelu, {"approximate": approximate}, [ctx.input(0)])


@converter("Erf", {9, 13})
def erf(ctx):
    raise ctx.error("Erf alone has no opgraph op; it is supported inside the GELU pattern "
                    "x * 0.5 * (1 + erf(x / sqrt(2))) (one Gelu op), which this node is not part of "
                    "(every intermediate must feed only the next node of the pattern)")


__all__ = ["clip", "sigmoid", "hard_sigmoid", "hard_swish", "gelu", "erf"]
