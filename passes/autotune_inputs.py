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
the producer's reference rule, as the graph will compute it. The same for
the saved window indices of a max pooling (``MaxPool2dArgmax``), which
``MaxPool2dTake`` reads beside the ``x`` they index: zeros would name a
padding cell at the border and read -inf there; and for the slot a
``MaxPool2dScan`` fills (``MaxPool2dArgmaxSlot``), whose value is the
argmax the candidate's own must equal; and for the bias gradient a
``ReluBackwardSums`` fills (``ReluBackwardSumsSlot``), and the layer-norm weight gradient a
``LayerNormBackwardDataSums`` fills (``LayerNormBackwardScaleSlot``).

One pass run draws each array once (:class:`InputPool`): the arrays are keyed
by input position and type, so the many nodes of a model that read the same
shapes (a dense block's convolutions, every batch norm of a stage) share
them, and on a device they are drawn there. Drawing them on the host was
43 % of EfficientNet-B0's autotune on the H200 (19.8 of 45.7 s, 122 nodes
tuned), and still 14.8 s with the pool (``passes/autotune_clock.py``'s
``inputs`` part, docs/performance.md).
"""

from __future__ import annotations

import attrs
import numpy as np

from collections import OrderedDict

from opgraph import ops
from opgraph.op import abstract_of
from opgraph.types import as_dtype, is_float, numpy_dtype, run_type, to_layout
from opgraph.backends.registry import KernelContext, rules_for

REFERENCE_ALGORITHMS = ("reference", "direct")
#: Producer op types whose output, read by a node together with the
#: producer's own inputs, must be recomputed from them (module docstring).
CONSISTENT_PRODUCERS = (ops.BatchNormStats, ops.MaxPool2dArgmax, ops.MaxPool2dArgmaxSlot,
                        ops.ReluBackwardSumsSlot, ops.LayerNormBackwardScaleSlot)


def random_inputs(in_types, xp, seed: int, dtype: str | None = None) -> list:
    """Standard-normal arrays of ``in_types`` on ``xp`` (``dtype``: the float
    inputs' dtype instead of their own), in each type's layout; integer inputs
    (class indices) are zeros, valid for any class count."""
    rng = np.random.default_rng(seed)
    return [_drawn(attrs.evolve(t, dtype=dtype) if dtype and is_float(t.dtype) else t, xp, rng) for t in in_types]


def _drawn(t, xp, rng):
    """One standard-normal array of type ``t`` on ``xp`` in ``t``'s layout (float32
    draws for every float dtype but float64; integer inputs are zeros).

    On a device (``xp`` not NumPy) the draw is the device's own generator,
    seeded from ``rng``: the host's draw and transfer of large tensors were
    most of the ``inputs`` part of a cold autotune even with the pool (H200,
    2026-12-02: EfficientNet-B0 14.8 s, DenseNet-121 31.1 s)."""
    if not is_float(t.dtype):
        return to_layout(xp, xp.asarray(np.zeros(t.shape, dtype=t.dtype)), t.layout)
    wide = "float64" if t.dtype == "float64" else "float32"
    if xp is np:
        a = rng.standard_normal(t.shape, dtype=wide).astype(numpy_dtype(t.dtype), copy=False)
    else:
        drawn = xp.random.default_rng(int(rng.integers(2 ** 63))).standard_normal(t.shape, dtype=wide)
        a = as_dtype(xp, drawn, t.dtype)
    return to_layout(xp, a, t.layout)


class InputPool:
    """The autotune inputs of one pass run (module docstring), drawn once per
    ``(position, shape, dtype, layout)`` and reused by every node reading
    that type at that position; arrays beyond ``limit_bytes`` in all are
    dropped oldest first (and drawn again if asked for). Candidates run out of
    place, so a shared array is never written.

    Args:
        xp: NumPy or CuPy; seed: the pass's seed (each array's generator is
            seeded by it, the position and the shape: the same arrays in
            every run, whatever the node order).
    """

    #: the pool's bound; a model's distinct input types rarely reach it
    LIMIT_BYTES = 2 << 30

    def __init__(self, xp, seed: int, limit_bytes: int | None = None):
        self.xp, self.seed = xp, seed
        self.limit = self.LIMIT_BYTES if limit_bytes is None else limit_bytes
        self._arrays: OrderedDict = OrderedDict()
        self.bytes = 0
        self.drawn = 0  # arrays drawn (not reused), for the tests

    def inputs(self, in_types) -> list:
        """One array per type of ``in_types``, in order."""
        return [self._get(k, t) for k, t in enumerate(in_types)]

    def _get(self, position: int, t):
        key = (position, tuple(t.shape), t.dtype, t.layout)
        a = self._arrays.get(key)
        if a is not None:
            self._arrays.move_to_end(key)
            return a
        rng = np.random.default_rng([self.seed, position, *map(int, t.shape)])
        a = self._arrays[key] = _drawn(t, self.xp, rng)
        self.drawn += 1
        self.bytes += a.nbytes
        while self.bytes > self.limit and len(self._arrays) > 1:
            _, old = self._arrays.popitem(last=False)
            self.bytes -= old.nbytes
        return a


def reference_output(op, arrays, xp, device, out_type=None):
    """``op`` on ``arrays`` by its reference rule in float64 (None without one)."""
    rules = rules_for(type(op))
    for algo in REFERENCE_ALGORITHMS:
        if algo in rules:
            # a filled input (Op.fills) is written: the caller's array stays as it was
            hi = [a.astype(xp.float64) if a.dtype.kind == "f" or str(a.dtype) == "bfloat16"
                  else a.copy(order="K") if k in op.fills else a for k, a in enumerate(arrays)]
            run_as = None if out_type is None else run_type(out_type, "float64")
            return rules[algo].kernel(KernelContext(xp, device, {}, run_as), op, *hi)
    return None


def consistent_inputs(view, arrays: list, xp, device: str) -> list:
    """``arrays`` (the node ``view``'s inputs, in order) with every input made by a
    :data:`CONSISTENT_PRODUCERS` node from inputs this node also reads
    recomputed from those arrays (float64 reference, then the array's dtype and
    the producer's layout), and an input the node reads at several positions one
    array at all of them.
    Other inputs, and a producer reading anything else, are left as they are."""
    graph, ids = view.graph, [v.node for v in view.inputs]
    # one value read at two positions (ReluBackward(y, y): a ReLU output as its own output
    # gradient) is one array, as it will be in the run; a producer's value below follows it
    out = [arrays[ids.index(n)] for n in ids]
    for i, producer_id in enumerate(ids):
        producer = graph.node(producer_id)
        op = abstract_of(producer.op)
        sources = [v.node for v in producer.inputs]
        if not isinstance(op, CONSISTENT_PRODUCERS) or not all(s in ids for s in sources):
            continue
        value = reference_output(op, [arrays[ids.index(s)] for s in sources], xp, device)
        host = value.get() if hasattr(value, "get") else np.asarray(value)
        out[i] = to_layout(xp, xp.asarray(host.astype(arrays[i].dtype)), producer.type.layout)
    return out


__all__ = ["REFERENCE_ALGORITHMS", "CONSISTENT_PRODUCERS", "random_inputs", "InputPool", "reference_output",
           "consistent_inputs"]
