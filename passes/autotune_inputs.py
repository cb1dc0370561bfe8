"""The inputs the autotune pass runs each candidate on, and the float64 reference on them.

Standard-normal arrays of the node's input types (:func:`random_inputs`),
seeded, in the run's dtype and layout. Some inputs are meaningful only as a
function of other inputs of the same node: the ``stats`` input of the
training batch-norm ops (``opgraph/ops/batchnorm_training.py``) is the
``BatchNormStats`` of their x; a standard-normal (2, C) array has negative
variances, whose ``1 / sqrt(var + eps)`` is NaN in every candidate and in
the reference, so every candidate was "wrong" and the pass raised. For an
input produced by one of :data:`CONSISTENT_PRODUCERS` from inputs the node
also takes, :func:`consistent_inputs` recomputes it from those arrays with
the producer's reference rule, as the graph will compute it.
"""

from __future__ import annotations

import numpy as np

from opgraph import ops
from opgraph.op import abstract_of
from opgraph.types import is_float, numpy_dtype, run_type, to_layout
from opgraph.backends.registry import KernelContext, rules_for

REFERENCE_ALGORITHMS = ("reference", "direct")
#: Producer op types whose output, read by a node together with the
#: producer's own inputs, must be recomputed from them (module docstring).
CONSISTENT_PRODUCERS = (ops.BatchNormStats,)


def random_inputs(in_types, xp, seed: int, dtype: str | None = None) -> list:
    """Standard-normal arrays of ``in_types`` on ``xp``; integer inputs (class
    indices) are zeros, valid for any class count."""
    rng = np.random.default_rng(seed)
    out = []
    for t in in_types:
        want = dtype if dtype and is_float(t.dtype) else t.dtype
        if is_float(want):
            host = rng.standard_normal(t.shape).astype(numpy_dtype(want))
        else:
            host = np.zeros(t.shape, dtype=want)
        out.append(to_layout(xp, xp.asarray(host), t.layout))  # tune in the run's layout
    return out


def reference_output(op, arrays, xp, device, out_type=None):
    """``op`` on ``arrays`` by its reference rule in float64 (None without one)."""
    rules = rules_for(type(op))
    for algo in REFERENCE_ALGORITHMS:
        if algo in rules:
            hi = [a.astype(xp.float64) if a.dtype.kind == "f" or str(a.dtype) == "bfloat16" else a
                  for a in arrays]
            run_as = None if out_type is None else run_type(out_type, "float64")
            return rules[algo].kernel(KernelContext(xp, device, {}, run_as), op, *hi)
    return None


def consistent_inputs(view, arrays: list, xp, device: str) -> list:
    """``arrays`` (the node ``view``'s inputs, in order) with every input made by a
    :data:`CONSISTENT_PRODUCERS` node from inputs this node also reads
    recomputed from those arrays (float64 reference, then the array's dtype).
    Other inputs, and a producer reading anything else, are left as they are."""
    graph, ids = view.graph, [v.node for v in view.inputs]
    out = list(arrays)
    for i, producer_id in enumerate(ids):
        producer = graph.node(producer_id)
        op = abstract_of(producer.op)
        sources = [v.node for v in producer.inputs]
        if not isinstance(op, CONSISTENT_PRODUCERS) or not all(s in ids for s in sources):
            continue
        value = reference_output(op, [arrays[ids.index(s)] for s in sources], xp, device)
        host = value.get() if hasattr(value, "get") else np.asarray(value)
        out[i] = xp.asarray(host.astype(arrays[i].dtype))
    return out


__all__ = ["REFERENCE_ALGORITHMS", "CONSISTENT_PRODUCERS", "random_inputs", "reference_output",
           "consistent_inputs"]
