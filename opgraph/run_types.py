"""The type each value runs in when ``compile(dtype=...)`` overrides the
declared floating dtype.

:func:`opgraph.types.run_type` replaces every floating dtype by the override.
That is right for sources and for every op whose output follows its inputs,
but wrong for a value an op keeps wider than its storage: batch statistics
stay float32 under bfloat16 or float16 storage (SEMANTICS.md, training
BatchNorm: statistics and sums in fp32; ``ops.batchnorm_training.stats_dtype``).
So sources take :func:`run_type` and every other node's dtype is inferred again
from its inputs' run types by its own op's ``infer``, as a graph declared in
that dtype would have it; the declared shape and layout are kept.
"""

from __future__ import annotations

from typing import Iterable

import attrs

from .errors import OpgraphError
from .op import abstract_of
from .types import TensorType, run_type


def run_types(graph, nodes: Iterable[int], dtype: str | None) -> dict[int, TensorType]:
    """Node id -> the type its output runs in, for ``nodes`` (closed under
    inputs: every input of a listed node is listed) under the override ``dtype``
    (None: the declared types).

    Raises:
        KeyError: a listed node reads a node that is not listed.
    """
    ids = list(nodes)
    if dtype is None:
        return {n: graph.node(n).type for n in ids}
    out: dict[int, TensorType] = {}
    for n in graph.topological(ids):
        view = graph.node(n)
        inputs = graph.input_ids(n)
        if not inputs:
            out[n] = run_type(view.type, dtype)
            continue
        try:
            inferred = abstract_of(view.op).infer(*(out[i] for i in inputs))
        except OpgraphError:  # an op whose infer insists on its declared dtypes: the plain override
            out[n] = run_type(view.type, dtype)
            continue
        out[n] = attrs.evolve(view.type, dtype=inferred.dtype)
    return out


__all__ = ["run_types"]
