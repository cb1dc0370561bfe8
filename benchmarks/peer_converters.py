"""The PyTorch peer's converters: one ``torch`` / ``torch.nn.functional`` call per abstract op.

The peer (:mod:`.peer_torch`) runs *our* forward graph node by node in
PyTorch and lets autograd produce the gradients in one backward pass, as a
PyTorch user's training step does. So it needs a converter for every op that
can appear in a model's forward graph, and none for the ops that only
opgraph's gradient rules create (:data:`GRADIENT_OPS`: autograd computes
those values itself). Every op of ``opgraph.ops.__all__`` is in exactly one
of :data:`CONVERTERS` and :data:`GRADIENT_OPS`, or is made only by the fuse
pass (``Op.fused``, e.g. ``FusedElementwise``: the peer converts the graph
before any pass runs, so it never meets one) (``tests/benchmarks/
test_peer_converters.py`` fails otherwise, and checks that each op called a
gradient op is made by some gradient rule).

A converter is ``fn(t, op, *inputs) -> tensor`` with ``t`` a
:class:`PeerContext`. Each calls what a PyTorch user would write
(``F.conv2d``, ``F.batch_norm``, ``F.adaptive_avg_pool2d``, ...), so the
peer runs PyTorch's own kernels, fused where PyTorch fuses:

* **Batch norm in training form.** ``BatchNormStats`` computes nothing: its
  value is a :class:`BatchStats` naming its input. ``BatchNormTraining`` of
  that same input is one ``F.batch_norm(training=True)`` (PyTorch computes the
  statistics inside its own kernel and differentiates through them, as
  opgraph's rule does). When the peer also computes ``BatchNormRunningUpdate``
  nodes of those statistics (one mean, one variance, one momentum, ``count``
  the values per channel), the running buffers go into that call and PyTorch
  updates them in place (:func:`fused_running`); other shapes of graph fall
  back to explicit formulas with the same semantics.
* **Values fixed before the step** (:data:`PREPARED`): a ``Constant`` and
  the mask of a training ``Dropout`` (opgraph's mask depends only on seed and
  shape, so the peer draws the same one once) become tensors on the device
  when the peer is built, so that no step copies from the host (a CUDA graph
  could not capture that copy).
* **Asymmetric padding.** Convolutions pad explicitly first; pooling pads to
  the window geometry of ``SEMANTICS.md`` (``-inf`` for max, a divisor
  computed from the cells each window counts for average).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import attrs
import numpy as np

from opgraph.backends.reference.dropout import keep_mask

from opgraph.op import Source, abstract_of
from opgraph.ops.batchnorm_training import channel_count
from opgraph.params import pool_out_size
from opgraph.types import is_float


@attrs.define
class PeerContext:
    """What converters need besides the op: ``torch``, ``torch.nn.functional``,
    the torch ``device`` and the floating ``dtype`` every value is stored in."""

    torch: Any
    F: Any
    device: Any
    dtype: Any


class BatchStats:
    """The value of a ``BatchNormStats`` node: its input ``x``, whose mean and
    biased variance ``F.batch_norm(training=True)`` computes itself."""

    def __init__(self, x):
        self.x = x

    def tensor(self, t: PeerContext):
        """``(2, C)``: the mean and biased variance over every axis but 1, in
        float32 for a half-precision x (``stats_dtype``)."""
        x = self.x if self.x.dtype not in (t.torch.float16, t.torch.bfloat16) else self.x.float()
        dims = (0, *range(2, x.ndim))
        return t.torch.stack([x.mean(dims), x.var(dims, unbiased=False)])


def _channel(v, ndim: int):
    """A (C,) vector shaped to broadcast over axis 1 of an ``ndim``-D tensor."""
    return v.reshape(1, -1, *([1] * (ndim - 2)))


def _symmetric(padding) -> tuple[int, int] | None:
    (t, b), (l, r) = padding
    return (t, l) if (t, l) == (b, r) else None


def _conv2d(t, op, x, w, b=None):
    pad = _symmetric(op.padding)
    if pad is None:  # asymmetric: explicit zero padding, then none
        (top, bottom), (left, right) = op.padding
        x, pad = t.F.pad(x, (left, right, top, bottom)), 0
    return t.F.conv2d(x, w, b, stride=op.stride, padding=pad, dilation=op.dilation, groups=op.groups)


def _window_padding(op, hw) -> tuple:
    """``(left, right, top, bottom)`` padding that makes every window of ``op``
    on an input of extent ``hw`` lie inside the padded input (the explicit
    padding, and at the end what the last window reaches, ceil_mode overhang
    included; SEMANTICS.md, Pooling)."""
    ends = []
    for n, k, s, (pb, pe) in zip(hw, op.kernel_size, op.stride, op.padding):
        out = pool_out_size(n, k, s, (pb, pe), op.ceil_mode)
        ends.append((pb, max((out - 1) * s + k - pb - n, 0)))
    (top, bottom), (left, right) = ends
    return (left, right, top, bottom)


def _max_pool2d(t, op, x):
    pad = _symmetric(op.padding)
    if pad is not None:
        return t.F.max_pool2d(x, op.kernel_size, op.stride, pad, ceil_mode=op.ceil_mode)
    x = t.F.pad(x, _window_padding(op, x.shape[2:]), value=float("-inf"))
    return t.F.max_pool2d(x, op.kernel_size, op.stride)


def _avg_pool2d(t, op, x):
    pad = _symmetric(op.padding)
    if pad is not None:
        return t.F.avg_pool2d(x, op.kernel_size, op.stride, pad, ceil_mode=op.ceil_mode,
                              count_include_pad=op.count_include_pad)
    # the sum over each window, over the number of cells the window counts: those in
    # the input, plus with count_include_pad the explicit padding (never the overhang)
    padding = _window_padding(op, x.shape[2:])
    area = op.kernel_size[0] * op.kernel_size[1]
    total = t.F.avg_pool2d(t.F.pad(x, padding), op.kernel_size, op.stride) * area
    counted = t.torch.ones((1, 1, *x.shape[2:]), dtype=x.dtype, device=x.device)
    if op.count_include_pad:
        (top, bottom), (left, right) = op.padding
        counted = t.F.pad(counted, (left, right, top, bottom), value=1.0)
        padding = (0, padding[1] - right, 0, padding[3] - bottom)  # negative: crops
    count = t.F.avg_pool2d(t.F.pad(counted, padding), op.kernel_size, op.stride) * area
    return total / count


def _lrn(t, op, x):
    """SEMANTICS.md's window (``c - floor((size-1)/2) .. c + ceil((size-1)/2)``;
    ``F.local_response_norm`` centres even windows the other way)."""
    lo = (op.size - 1) // 2
    sq = t.F.pad((x * x).unsqueeze(1), (0, 0, 0, 0, lo, op.size - 1 - lo))
    s = t.F.avg_pool3d(sq, (op.size, 1, 1), stride=1).squeeze(1) * op.size
    return x / (op.k + op.alpha / op.size * s) ** op.beta


def _hardsigmoid(t, op, x):
    if (op.alpha, op.beta) == (1 / 6, 0.5):
        return t.F.hardsigmoid(x)
    return t.F.hardtanh(op.alpha * x + op.beta, 0.0, 1.0)  # gradient 0 at the bounds, as ours


def _div(t, op, a, b):
    if a.dtype.is_floating_point:
        return a / b
    return t.torch.div(a, b, rounding_mode="trunc")  # ONNX Div on integers (ops/arithmetic.py)


def _mean(t, op, x):
    return t.torch.mean(x, dim=op.axes, keepdim=op.keepdim) if op.axes else x


def _matmul(t, op, a, b):
    return (a.t() if op.transpose_a else a) @ (b.t() if op.transpose_b else b)


def _batch_norm_training(t, op, x, stats, weight=None, bias=None, running_mean=None,
                         running_var=None, momentum=0.1):
    """``F.batch_norm(training=True)`` when ``stats`` are x's own (the usual
    graph), else the formula over the given statistics."""
    if isinstance(stats, BatchStats) and stats.x is x:
        return t.F.batch_norm(x, running_mean, running_var, weight, bias, training=True,
                              momentum=momentum, eps=op.eps)
    s = stats.tensor(t) if isinstance(stats, BatchStats) else stats
    y = (x - _channel(s[0], x.ndim)) * _channel(t.torch.rsqrt(s[1] + op.eps), x.ndim)
    y = y.to(x.dtype)
    if weight is not None:
        y = y * _channel(weight, x.ndim)
    if bias is not None:
        y = y + _channel(bias, x.ndim)
    return y


def _running_update(t, op, stats, running):
    """The formula of ``BatchNormRunningUpdate`` (a graph :func:`fused_running`
    does not cover)."""
    if op.count == 0:
        return running
    s = stats.tensor(t) if isinstance(stats, BatchStats) else stats
    value = s[0] if op.statistic == "mean" else s[1] * (op.count / (op.count - 1))
    return ((1 - op.momentum) * running + op.momentum * value).to(running.dtype)


def _updated_running(t, op, y, running):
    """A ``BatchNormRunningUpdate`` that the ``F.batch_norm`` call producing
    ``y`` did in place: the running buffer itself."""
    return running


#: abstract op name -> ``fn(t, op, *inputs)``.
CONVERTERS: dict[str, Callable] = {
    "Conv2d": _conv2d,
    "Conv2dBiasRelu": lambda t, op, x, w, b: t.F.relu(_conv2d(t, op, x, w, b)),
    "MaxPool2d": _max_pool2d,
    "AvgPool2d": _avg_pool2d,
    "GlobalAvgPool2d": lambda t, op, x: t.F.adaptive_avg_pool2d(x, 1),
    "Relu": lambda t, op, x: t.F.relu(x),
    "Threshold": lambda t, op, x: t.F.threshold(x, op.threshold, op.value),
    "Hardtanh": lambda t, op, x: t.F.hardtanh(x, op.min_val, op.max_val),
    "Hardsigmoid": _hardsigmoid,
    "Hardswish": lambda t, op, x: t.F.hardswish(x),
    "Sigmoid": lambda t, op, x: t.torch.sigmoid(x),
    "Silu": lambda t, op, x: t.F.silu(x),
    "Gelu": lambda t, op, x: t.F.gelu(x, approximate=op.approximate),
    "Linear": lambda t, op, x, w, b=None: t.F.linear(x, w, b),
    "MatMul": _matmul,
    "LocalResponseNorm": _lrn,
    "BatchNorm": lambda t, op, x, w, b, mean, var: t.F.batch_norm(x, mean, var, w, b, training=False,
                                                                  eps=op.eps),
    "BatchNormStats": lambda t, op, x: BatchStats(x),
    "BatchNormTraining": _batch_norm_training,
    "BatchNormRunningUpdate": _running_update,
    "LayerNorm": lambda t, op, x, w=None, b=None: t.F.layer_norm(x, op.normalized_shape, w, b, op.eps),
    "Add": lambda t, op, a, b: a + b,
    "BroadcastAdd": lambda t, op, a, b: a + b,
    "Mul": lambda t, op, a, b: a * b,
    "Div": _div,
    "Neg": lambda t, op, x: -x,
    "BiasAdd": lambda t, op, x, b: x + _channel(b, x.ndim),
    "SumTo": lambda t, op, x: x.sum_to_size(op.shape) if op.shape else x.sum(),
    "BroadcastTo": lambda t, op, x: x.expand(op.shape),
    "Mean": _mean,
    "Flatten": lambda t, op, x: t.torch.flatten(x, op.start_dim),
    "Reshape": lambda t, op, x: x.reshape(op.shape),
    "Transpose": lambda t, op, x: x.permute(op.perm),
    "Concat": lambda t, op, *xs: t.torch.cat(xs, dim=op.axis),
    "Slice": lambda t, op, x: x.narrow(op.axis, op.start, op.stop - op.start),
    "Pad": lambda t, op, x: t.F.pad(x, (*op.padding[1], *op.padding[0]), value=op.value),
    "Zeros": lambda t, op: t.torch.zeros(op.type.shape, dtype=_dtype_of(t, op.type.dtype),
                                         device=t.device),
    "Softmax": lambda t, op, x: t.F.softmax(x, dim=op.axis),
    "LogSoftmax": lambda t, op, x: t.F.log_softmax(x, dim=op.axis),
    "CrossEntropy": lambda t, op, logits, target: t.F.cross_entropy(logits, target,
                                                                     reduction=op.reduction),
    # Dropout and Constant: PREPARED (below) adds their fixed tensor as the last input
    "Dropout": lambda t, op, x, keep=None: x if keep is None else t.torch.where(
        keep, x * (1.0 / (1.0 - op.p)), t.torch.zeros((), dtype=x.dtype, device=x.device)),
    "Constant": lambda t, op, value: value,
}


def _dtype_of(t: PeerContext, dtype: str):
    """The peer's dtype of an opgraph dtype name: floating values in the peer's
    storage dtype, int64 as it is."""
    return t.dtype if is_float(dtype) else getattr(t.torch, dtype)


def _constant(t: PeerContext, op, input_types):
    value = op.value
    if value.dtype.kind == "f" or value.dtype.name == "bfloat16":
        return t.torch.as_tensor(value.astype(np.float64)).to(device=t.device, dtype=t.dtype)
    return t.torch.as_tensor(np.array(value)).to(t.device)  # a writable copy: the op keeps its array read-only


def _dropout_mask(t: PeerContext, op, input_types):
    """The keep mask of a training ``Dropout`` (the reference kernel's draw), or
    None where dropout is the identity (not training, or p = 0)."""
    if not op.training or op.p == 0:
        return None
    keep = keep_mask(np, input_types[0].shape, seed=op.seed, p=op.p)
    return t.torch.as_tensor(keep).to(t.device)


#: abstract op name -> ``prepare(t, op, input_types) -> tensor or None``: a value
#: computed once when the peer is built and passed to the converter as its last input.
PREPARED: dict[str, Callable] = {"Constant": _constant, "Dropout": _dropout_mask}

#: Ops that only gradient rules (or the fuse pass, from gradient ops) create: the
#: peer needs no converter for them, as autograd computes these values in its
#: one backward pass.
GRADIENT_OPS = frozenset((
    "AvgPool2dBackward", "BatchNormBackwardData", "BatchNormBackwardScale",
    "BatchNormBackwardSumsRow", "BatchNormTrainingBackwardData", "BatchNormTrainingBackwardDataFromSums",
    "BatchNormTrainingBackwardScale", "BatchNormTrainingBackwardSums",
    "BatchNormTrainingDoubleBackward", "BiasAddBackward", "Conv2dBackwardData",
    "Conv2dBackwardFilter", "CrossEntropyBackward", "GeluBackward", "GlobalAvgPool2dBackward",
    "HardsigmoidBackward", "HardswishBackward", "HardtanhBackward", "LayerNormBackwardData",
    "LayerNormBackwardScale", "LayerNormDoubleBackward", "LocalResponseNormBackward",
    "LogSoftmaxBackward", "MaxPool2dBackward", "MaxPool2dBackwardRelu", "MaxPool2dSelect",
    "MeanBackward", "PadBackward", "ReluBackward", "SigmoidBackward", "SiluBackward",
    "SliceBackward", "SoftmaxBackward", "ThresholdBackward"))


def fused_running(graph, node, plan_nodes: set) -> tuple[int, int, float] | None:
    """``(running_mean id, running_var id, momentum)`` when the
    ``BatchNormTraining`` ``node`` can update its running statistics inside
    ``F.batch_norm``: its stats input is ``BatchNormStats`` of its own input
    and, among ``plan_nodes`` (the nodes the peer computes), only it and
    exactly one mean and one variance ``BatchNormRunningUpdate`` read those
    statistics, with one momentum and ``count`` equal to the values per
    channel (PyTorch's unbiased-variance factor); each update's running value
    is a source (a buffer) that no other node of the plan reads, since
    PyTorch overwrites it. None otherwise."""
    x_id, stats_id = graph.input_ids(node.id)[:2]
    stats = graph.node(stats_id)
    if abstract_of(stats.op).name != "BatchNormStats" or graph.input_ids(stats_id)[0] != x_id:
        return None
    updates = {}
    for u in set(graph.users(stats_id)) & plan_nodes - {node.id}:
        op = abstract_of(graph.node(u).op)
        running = graph.input_ids(u)[1] if op.name == "BatchNormRunningUpdate" else None
        if (running is None or op.statistic in updates or not isinstance(graph.node(running).op, Source)
                or set(graph.users(running)) & plan_nodes != {u}):
            return None
        updates[op.statistic] = (op, running)
    if set(updates) != {"mean", "var"}:
        return None
    (m_op, mean_id), (v_op, var_id) = updates["mean"], updates["var"]
    if m_op.momentum != v_op.momentum or v_op.count != channel_count(graph.node(x_id).type):
        return None
    return mean_id, var_id, m_op.momentum


def running_update_step(graph, node_id: int, training_of: dict) -> tuple[Callable, tuple] | None:
    """``(converter, args)`` of a ``BatchNormRunningUpdate`` whose update an
    ``F.batch_norm`` call does in place (``training_of``: stats node id ->
    the fused training node id), or None. Its arguments are that training
    node (so it runs after it) and the running buffer."""
    stats_id, running_id = graph.input_ids(node_id)
    training = training_of.get(stats_id)
    if training is None:
        return None
    return _updated_running, (training, running_id)


def training_step(fused: tuple[int, int, float]) -> tuple[Callable, tuple]:
    """``(converter, extra args)`` of a ``BatchNormTraining`` that updates the
    running buffers ``fused`` (:func:`fused_running`) in place."""
    mean_id, var_id, momentum = fused
    return functools.partial(_fused_training, momentum=momentum), (mean_id, var_id)


def _fused_training(t, op, x, stats, *rest, momentum):
    *affine, running_mean, running_var = rest
    return _batch_norm_training(t, op, x, stats, *affine, *([None] * (2 - len(affine))),
                                running_mean=running_mean, running_var=running_var, momentum=momentum)


__all__ = ["PeerContext", "BatchStats", "CONVERTERS", "PREPARED", "GRADIENT_OPS", "fused_running",
           "running_update_step", "training_step"]
