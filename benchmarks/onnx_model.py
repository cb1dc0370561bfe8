"""An ONNX file as a benchmark :class:`~opgraph.benchmarks.models.common.Model`.

``load_model(path, batch=None)`` imports the file with :func:`opgraph.onnx.load`
and fills the record the driver times, so ``opgraph-bench --onnx PATH`` runs
a user's network through the same protocol and lowerings as the built-in
models. The network must have one image input (N, C, H, W) and one output.

* ``key`` is the file name without ``.onnx``; ``spec_key`` is ``'onnx'``
  (there is no spec entry for a user's model);
* ``seed_batch`` is the batch the file declares (1 where it is symbolic),
  see :func:`declared_batch`; ``batch`` is the batch built;
* ``params`` are the float initializers (trainable parameters); BatchNorm
  running statistics and ``Constant`` nodes are constants, not parameters;
* ``first_conv_input`` is the input of the first convolution in
  topological order (the driver asks no gradient for it when it is the image).
"""

from __future__ import annotations

import os
from pathlib import Path

from opgraph.errors import ParameterError
from opgraph.ops import Conv2d

from .models.common import Model


def _read_structure(path):
    """The model proto without external weight data (only the graph is read)."""
    from opgraph.onnx import onnx_module

    return onnx_module().load(os.fspath(path), load_external_data=False)


def declared_batch(path) -> int | None:
    """The fixed batch of the file's first graph input, or None when it is symbolic.

    Raises:
        ImportError: the ``onnx`` package is missing.
    """
    m = _read_structure(path)
    inits = {t.name for t in m.graph.initializer}
    for vi in m.graph.input:
        if vi.name not in inits:
            dims = vi.type.tensor_type.shape.dim
            return int(dims[0].dim_value) if dims and dims[0].HasField("dim_value") else None
    return None


def load_model(path, batch: int | None = None, dtype: str | None = None) -> Model:
    """Import the ONNX file at ``path`` as a benchmark model.

    Args:
        path: an ``.onnx`` file.
        batch: batch to build (replaces a symbolic batch or a batch of 1;
            see :func:`opgraph.onnx.load`); None keeps the file's (1 if symbolic).
        dtype: None or the file's input dtype (ONNX models run in the dtype
            of the file; no conversion is made).

    Returns:
        A :class:`Model` whose graph holds the imported network.

    Raises:
        ImportError: the ``onnx`` package is missing.
        opgraph.onnx.OnnxImportError: an unsupported operator or attribute.
        ParameterError: not exactly one input and one output, a 4-D input
            expected, or a ``dtype`` other than the file's.
    """
    from opgraph.onnx import load

    path = Path(path)
    graph, inputs, outputs = load(path, batch=batch)
    if len(inputs) != 1 or len(outputs) != 1:
        raise ParameterError("path", str(path), f"the benchmark needs one input and one output; the model "
                             f"has {len(inputs)} inputs and {len(outputs)} outputs")
    (x,), (y,) = inputs, outputs
    if len(x.shape) != 4:
        raise ParameterError("path", str(path), f"input {x.name!r} has shape {x.shape}; the benchmark "
                             "feeds an (N, C, H, W) image")
    if dtype is not None and dtype != x.dtype:
        raise ParameterError("dtype", dtype, f"the ONNX model's input is {x.dtype}; it runs in that dtype")
    nodes = list(graph.nodes_in_order([y]))
    first_conv = next((v.inputs[0] for v in nodes if isinstance(v.op, Conv2d)), x)
    declared = declared_batch(path)
    return Model(key=path.name.removesuffix(".onnx"), spec_key="onnx", title=f"{graph.name} ({path.name})",
                 graph=graph, input=x, output=y, params=[s.output for s in graph.sources("param")],
                 first_conv_input=first_conv, seed_batch=declared or 1, batch=x.shape[0], dtype=x.dtype)


__all__ = ["load_model", "declared_batch"]
