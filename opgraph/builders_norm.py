"""Builders of batch normalisation (inference and training form) and layer
normalisation, with ``torch.nn.functional``'s names and signatures.

Re-exported by ``opgraph.builders`` and ``opgraph``. Semantics and sources:
``opgraph/ops/norm.py`` (inference), ``opgraph/ops/batchnorm_training.py``
(training), ``opgraph/ops/layer_norm.py``; SEMANTICS.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from numbers import Integral

import numpy as np

from . import ops
from .errors import ParameterError, ShapeError
from .graph import Value, graph_of
from .ops.batchnorm_training import channel_count
from .ops._fields import real_value
from .types import numpy_dtype


def _part(name: str | None, suffix: str) -> str | None:
    """The name of a helper node of the layer ``name`` (None: automatic)."""
    return None if name is None else f"{name}/{suffix}"


def _filled(input: Value, shape: tuple, fill: float, name: str | None) -> Value:
    """A ``Constant`` of ``fill`` in input's dtype: the weight or bias torch takes as absent."""
    value = np.full(shape, fill, dtype=numpy_dtype(input.dtype))
    return input.graph.apply(ops.Constant, {"value": value}, [], name)


def batch_norm(input: Value, running_mean: Value | None, running_var: Value | None,
               weight: Value | None = None, bias: Value | None = None, training: bool = False,
               momentum: float | None = 0.1, eps: float = 1e-5, *, return_running_stats: bool = False,
               name: str | None = None):
    """Batch normalisation over axis 1 of input (N, C, ...), as ``torch.nn.functional.batch_norm``.

    ``training=False``: ``(x - running_mean) / sqrt(running_var + eps) * weight + bias``
    with the given statistics (one ``BatchNorm`` node, ONNX ``BatchNormalization``);
    momentum is unused. ``training=True``: the batch's own statistics (mean and
    biased variance over every axis but 1: one ``BatchNormStats`` node, named
    ``{name}/stats``, and one ``BatchNormTraining`` node); the gradient goes
    through the statistics (Ioffe & Szegedy 2015, section 3).

    Running statistics in training: the graph is functional, nothing is updated
    in place. With ``return_running_stats=True`` the result is ``(y, new_mean,
    new_var)``: ``(1 - momentum) * running + momentum * batch`` statistic, the
    variance unbiased (``* n / (n - 1)``); nodes ``{name}/running_mean`` and
    ``{name}/running_var``, extra outputs a training step fetches. Running
    statistics get no gradient; make them ``Graph.buffer`` sources, e.g.
    ``g.buffer("bn1.running_var", (C,), value=1.0)`` and ``value=0.0`` for the
    mean (``torch.nn.BatchNorm2d``'s initial values).

    Args:
        input: (N, C, ...), floating.
        running_mean, running_var: (C,) values (buffers); required unless
            training without ``return_running_stats``, where they must be None.
        weight, bias: (C,) values or None (1 and 0).
        momentum: in [0, 1]; None (PyTorch's cumulative average) is refused.
        eps: added to the variance, >= 0.

    Returns:
        y (input's shape and dtype), or ``(y, new_mean, new_var)``.

    Raises:
        ParameterError: running statistics missing where needed, given where
            nothing would update them (training without
            ``return_running_stats``), ``return_running_stats`` in inference,
            momentum None or outside [0, 1], negative eps.
        ShapeError: input not (N, C, ...), vectors not (C,), or, in training,
            one value per channel (n = 1: "Expected more than 1 value per
            channel when training").
    """
    g = graph_of(input, running_mean, running_var, weight, bias)
    node = name or ("batch_norm_training" if training else "batch_norm")
    if momentum is not None and not (training and return_running_stats):
        # unused here (no running update node checks it), yet a NaN must not pass silently
        try:
            real_value("momentum", momentum, lo=0.0, hi=1.0)
        except ParameterError as e:
            raise e.with_node(node) from None
    if input.type.ndim < 2:
        raise ShapeError(f"input must be (N, C, ...), got shape {input.shape}", node)
    stats_given = (running_mean is not None, running_var is not None)
    if not training:
        if return_running_stats:
            raise ParameterError("return_running_stats", True, "inference (training=False) updates "
                                 "no running statistics", node)
        if not all(stats_given):
            raise ParameterError("running_mean" if running_mean is None else "running_var", None,
                                 "required in inference (training=False)", node)
        w = weight if weight is not None else _filled(input, input.shape[1:2], 1.0, _part(name, "weight"))
        b = bias if bias is not None else _filled(input, input.shape[1:2], 0.0, _part(name, "bias"))
        return g.apply(ops.BatchNorm, {"eps": eps}, [input, w, b, running_mean, running_var], name)
    if return_running_stats and not all(stats_given):
        raise ParameterError("running_mean" if running_mean is None else "running_var", None,
                             "required with return_running_stats=True", node)
    if any(stats_given) and not return_running_stats:
        raise ParameterError("return_running_stats", False,
                             "running statistics were given but nothing would update them (the graph "
                             "updates nothing in place): pass return_running_stats=True to get "
                             "(y, new_mean, new_var), or pass None for both", node)
    if momentum is None:
        raise ParameterError("momentum", None, "None (a cumulative moving average) is not supported; "
                             "give a number in [0, 1]", node)
    channels = tuple(input.shape[1:2])
    for which, running in (("running_mean", running_mean), ("running_var", running_var)):
        # checked here, in the builder's terms: the update node would name its internal (2, C) input
        if running is not None and tuple(running.shape) != channels:
            raise ShapeError(f"{which} shape {tuple(running.shape)} != (C,) = {channels}", node)
    stats = g.apply(ops.BatchNormStats, {}, [input], _part(name, "stats"))
    affine = [weight, bias] if bias is not None else [weight] if weight is not None else []
    if affine and affine[0] is None:
        affine[0] = _filled(input, input.shape[1:2], 1.0, _part(name, "weight"))
    y = g.apply(ops.BatchNormTraining, {"eps": eps}, [input, stats, *affine], name)
    if not return_running_stats:
        return y
    count = channel_count(input.type)
    new = [g.apply(ops.BatchNormRunningUpdate, dict(statistic=s, momentum=momentum, count=count),
                   [stats, running], _part(name, f"running_{s}"))
           for s, running in (("mean", running_mean), ("var", running_var))]
    return (y, *new)


def _normalized_shape(value):
    """``(n,)`` for an int ``n`` (NumPy's included), a tuple for any other sequence but a string;
    anything else as given, for ``LayerNorm``'s field to refuse with the node's name (a float, a
    string, None: ``tuple(16.0)`` raised a bare TypeError here, and ``'16'`` became ``('1', '6')``)."""
    if isinstance(value, Integral) and not isinstance(value, bool):
        return (int(value),)
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes)):
        return tuple(value)
    return value


def layer_norm(input: Value, normalized_shape, weight: Value | None = None, bias: Value | None = None,
               eps: float = 1e-5, *, name: str | None = None) -> Value:
    """Layer normalisation over the trailing ``normalized_shape`` axes
    (``torch.nn.functional.layer_norm``; ONNX ``LayerNormalization``):
    ``(x - mean) / sqrt(var + eps) * weight + bias``, statistics per leading
    index, variance biased. One ``LayerNorm`` node.

    Args:
        input: (..., *normalized_shape), floating.
        normalized_shape: an int (the last axis: ConvNeXt's channels-last
            norm) or a sequence of ints that ends input's shape.
        weight, bias: values of ``normalized_shape`` or None (1 and 0).
        eps: added to the variance, >= 0.

    Raises:
        ParameterError: a malformed normalized_shape or a negative eps.
        ShapeError: normalized_shape not ending input's shape, weight or bias
            of another shape.
    """
    ns = _normalized_shape(normalized_shape)
    affine = [weight, bias] if bias is not None else [weight] if weight is not None else []
    if affine and affine[0] is None and isinstance(ns, tuple):  # else the op refuses ns, naming the node
        affine[0] = _filled(input, ns, 1.0, _part(name, "weight"))
    g = graph_of(input, *affine)
    return g.apply(ops.LayerNorm, dict(normalized_shape=ns, eps=eps), [input, *affine], name)


__all__ = ["batch_norm", "layer_norm"]
