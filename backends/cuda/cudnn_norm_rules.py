"""Registry rules of the ``cudnn`` algorithm (device ``cuda``) for training batch norm.

Our graph has one output per node (``opgraph/ops/batchnorm_training.py``):
``BatchNormStats`` -> ``BatchNormTraining`` (y) and two
``BatchNormRunningUpdate`` nodes forward; ``BatchNormTrainingBackwardData``
(dx), ``BatchNormTrainingBackwardScale`` (dweight) and ``BiasAddBackward``
(dbias) backward. cuDNN's ``batchnorm`` makes y, the statistics and the
running statistics in one call, ``batchnorm_backward`` dx, dscale and dbias:
no single node can take all of a cuDNN call's outputs, so the rules run the
cuDNN graph that gives the node's own value from the node's own inputs:

* ``BatchNormTraining`` (x, stats[, weight[, bias]]): cuDNN's normalisation
  with the node's batch statistics (``batchnorm_inference`` with
  ``inv_variance = 1 / sqrt(var + eps)``; :func:`.cudnn_norm.batch_norm_normalize`).
  A rule recomputing the statistics inside cuDNN's training ``batchnorm``
  would ignore its stats input (wrong for a graph whose stats are not x's)
  and redo the ``BatchNormStats`` node's pass over x;
* ``BatchNormTrainingBackwardData``: dx of ``batchnorm_backward`` (its dscale
  and dbias, a few bytes, are dropped);
* ``BatchNormTrainingBackwardScale``: dscale of ``batchnorm_backward`` (its dx
  goes to scratch: this candidate writes a tensor codegen's does not, and the
  autotuner decides).

cuDNN's whole training forward, running statistics included
(:func:`.cudnn_norm.batch_norm_training_forward`), and its whole backward
are measured against the generated kernels in ``tests/gpu/test_cudnn_batchnorm.py``;
a multi-output node would be needed to use them in a graph.

These rules come after ``codegen`` in the default cuda order (``passes/policy.py``:
cuDNN is not listed for non-convolution ops, so it is an "other registered
rule"): without autotune the generated kernels run; with autotune both are
timed and checked, per node, and the faster stays, on the nodes the fuse pass
(before autotune) leaves: by default on cuda ``bn-backward-sums`` rewrites the
data and scale gradients lowered to codegen into ops cuDNN has no rule for
(``passes/fuse_bn_backward.py``), and ``elementwise`` fuses the normalisation
into its consumers' generated kernel, so cuDNN competes where those rules are
excluded or decline.

``check`` declines, with the reason: x's dtype other than float32, float16,
bfloat16 (float64: cuDNN graphs do not take it), a layout other than NCHW /
NHWC, no GPU, a missing ``nvidia-cudnn-frontend``, and any shape cuDNN
rejects (cuDNN's own message). ``variants`` lists one ``{'engine': i}`` per
cuDNN plan that builds; ``workspace`` is the plan's cuDNN workspace plus the
call's scratch.
"""

from __future__ import annotations

import math

from opgraph import ops
from opgraph.errors import LoweringError, ShapeError
from opgraph.types import to_layout

from ..registry import Rule, register
from .cudnn_norm import batch_norm_backward, batch_norm_normalize, plan_of
from .cudnn_norm_graph import IO_DTYPES
from .cudnn_rules import environment_reason

TAGS = frozenset({"cudnn", "gpu", "variants:engine_limit"})
#: op type -> (cuDNN graph kind, position of x among the node's inputs).
GRAPHS = {
    ops.BatchNormTraining: ("bn_normalize", 0),
    ops.BatchNormTrainingBackwardData: ("bn_backward", 1),
    ops.BatchNormTrainingBackwardScale: ("bn_backward", 0),
}


def _x(op, in_types):
    return in_types[GRAPHS[type(op)][1]]


def static_reason(op, in_types) -> str | None:
    """Why cuDNN cannot take this node whatever the machine (dtype, layout,
    rank), or None; needs neither a GPU nor the frontend."""
    x = _x(op, in_types)
    if x.dtype not in IO_DTYPES:
        return f"cuDNN batch norm takes {', '.join(IO_DTYPES)}; got {x.dtype}"
    if x.ndim < 2:
        return f"cuDNN batch norm needs x of shape (N, C, ...), got {x.shape}"
    if x.ndim == 4 and x.layout not in (None, "NCHW", "NHWC"):
        return f"cuDNN batch norm takes NCHW or NHWC layouts, got {x.layout}"
    return None


def _device() -> int:
    import cupy
    return cupy.cuda.runtime.getDevice()


def _plan(op, in_types):
    """The node's cached plan (built on first use), or None for an empty batch."""
    x = _x(op, in_types)
    if math.prod(x.shape) == 0:
        return None
    return plan_of(GRAPHS[type(op)][0], x.shape, x.dtype, x.ndim == 4 and x.layout == "NHWC", _device())


def check(op, in_types, device):
    """None if cuDNN can run ``op`` on ``in_types``, else why not."""
    why = static_reason(op, in_types)
    if why is not None:
        return why
    why = environment_reason()
    if why is not None:
        return why
    try:
        _plan(op, in_types)
    except (LoweringError, ShapeError) as exc:
        return str(exc)
    return None


def variants(op, in_types, device, limit=None):
    """``[{'engine': i}, ...]``: the cuDNN plans that build, heuristic order
    first; every one, or the first ``limit`` (``policy.engine_limit``)."""
    plan = _plan(op, in_types)
    return [{}] if plan is None else [{"engine": i} for i in plan.engines(limit)]


def workspace(op, in_types, options) -> int:
    """Scratch bytes of one call: the engine's cuDNN workspace, the float32
    per-channel vectors, and for ``BatchNormTrainingBackwardScale`` the dx it drops."""
    plan = _plan(op, in_types)
    if plan is None:
        return 0
    engine = dict(options or {}).get("engine")
    x = _x(op, in_types)
    total = plan.ensure(plan.pick_default() if engine is None else int(engine)) + 8 * 4 * x.shape[1]
    if isinstance(op, ops.BatchNormTrainingBackwardScale):
        total += math.prod(x.shape) * (4 if x.dtype == "float32" else 2)
    return total


def _in_node_layout(ctx, a):
    """``a`` in the node's output layout (the kernels return x's)."""
    layout = ctx.out_type.layout if ctx.out_type is not None else None
    return to_layout(ctx.xp, a, layout) if a.ndim == 4 else a


def _normalize(ctx, op, x, stats, *affine):
    """``BatchNormTraining`` by cuDNN's normalisation with the node's statistics."""
    y = batch_norm_normalize(ctx.xp, x, stats, *affine, eps=op.eps, engine=ctx.options.get("engine"))
    return _in_node_layout(ctx, y)


def _backward_data(ctx, op, gy, x, stats, *weight):
    """``BatchNormTrainingBackwardData``: dx of cuDNN's ``batchnorm_backward``."""
    dx = batch_norm_backward(ctx.xp, gy, x, stats, *weight, eps=op.eps, engine=ctx.options.get("engine"))[0]
    return _in_node_layout(ctx, dx)


def _backward_scale(ctx, op, x, stats, gy):
    """``BatchNormTrainingBackwardScale``: dscale of cuDNN's ``batchnorm_backward``."""
    return batch_norm_backward(ctx.xp, gy, x, stats, eps=op.eps, engine=ctx.options.get("engine"))[1]


KERNELS = {ops.BatchNormTraining: _normalize, ops.BatchNormTrainingBackwardData: _backward_data,
           ops.BatchNormTrainingBackwardScale: _backward_scale}


def register_rules() -> None:
    """Register the ``cudnn`` rules of training batch norm (idempotent). Every
    output is a new array (``fresh_output``)."""
    for op_type, kernel in KERNELS.items():
        register(Rule(op_type, "cudnn", kernel, devices={"cuda"}, check=check, variants=variants,
                      workspace=workspace, tags=TAGS, fresh_output=True))


register_rules()

__all__ = ["TAGS", "GRAPHS", "KERNELS", "static_reason", "check", "variants", "workspace", "register_rules"]
