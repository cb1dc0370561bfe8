"""An ONNX file as a benchmark :class:`~opgraph.benchmarks.models.common.Model`.

``load_model(path, batch=None, dtype=None, input_name=None)`` imports the file
with :func:`opgraph.onnx.load` and fills the record the driver times, so
``opgraph-bench --onnx PATH`` runs a user's network through the same protocol
and lowerings as the built-in models. The network must have one image input
(N, C, H, W) and one output.

* the image is the first graph input that is not an initializer, or
  ``input_name`` (``--onnx-input``); every other such graph input is a
  parameter without a value (a weightless export, ``export_params=False``),
  drawn like the built-in models' parameters (:func:`~.protocol.random_feeds`);
* ``dtype`` (``--dtype``) is the storage dtype of every floating tensor, as
  for the built-in models; None keeps the file's;
* ``key`` is the file name without ``.onnx``; ``spec_key`` is ``'onnx'``
  (there is no spec entry for a user's model);
* ``seed_batch`` is the batch the file declares (1 where it is symbolic),
  see :func:`declared_batch`; ``batch`` is the batch built;
* ``params`` are the float initializers and parameter inputs (trainable);
  BatchNorm running statistics are buffers and ``Constant`` nodes constants,
  not parameters;
* ``first_conv_input`` is the input of the first convolution in
  topological order (the driver asks no gradient for it when it is the image).
"""

from __future__ import annotations

from pathlib import Path

from opgraph.errors import ParameterError
from opgraph.ops import Conv2d
from opgraph.types import is_float

from .models.common import Model


def _read_structure(path):
    """The model proto without external weight data (only the graph is read).

    Raises:
        ImportError: the ``onnx`` package is missing.
        opgraph.onnx.OnnxImportError: an unreadable, empty or corrupt file.
    """
    from opgraph.onnx import onnx_module
    from opgraph.onnx.reading import read_model

    onnx = onnx_module()
    return read_model(onnx, path, external_data=False)[0]


def graph_inputs(model) -> list:
    """The graph inputs of a ``ModelProto`` that are not initializers (``ValueInfoProto``)."""
    inits = {t.name for t in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


def image_input(path, input_name: str | None = None):
    """The ``ValueInfoProto`` of the image input: ``input_name``, else the first graph input.

    Raises:
        ParameterError: ``input_name`` is not a graph input (the message lists them),
            or the model has no graph input.
    """
    inputs = graph_inputs(_read_structure(path))
    names = [vi.name for vi in inputs]
    if input_name is None and inputs:
        return inputs[0]
    if input_name in names:
        return inputs[names.index(input_name)]
    shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    raise ParameterError("input_name", input_name, f"{Path(path).name} has no graph input of that name; "
                                                   f"its graph inputs are {shown or 'none'}")


def declared_batch(path, input_name: str | None = None) -> int | None:
    """The fixed batch of the image input (see :func:`image_input`), or None when it is symbolic.

    Raises:
        ImportError: the ``onnx`` package is missing.
    """
    dims = image_input(path, input_name).type.tensor_type.shape.dim
    return int(dims[0].dim_value) if dims and dims[0].HasField("dim_value") else None


def load_model(path, batch: int | None = None, dtype: str | None = None,
               input_name: str | None = None) -> Model:
    """Import the ONNX file at ``path`` as a benchmark model.

    Args:
        path: an ``.onnx`` file.
        batch: batch to build (replaces a symbolic batch or a batch of 1;
            see :func:`opgraph.onnx.load`); None keeps the file's (1 if symbolic).
        dtype: storage dtype of every floating tensor (inputs, parameters,
            buffers, constants, activations); None keeps the file's.
        input_name: the image input; None: the first graph input.

    Returns:
        A :class:`Model` whose graph holds the imported network.

    Raises:
        ImportError: the ``onnx`` package is missing.
        opgraph.onnx.OnnxImportError: an unreadable, empty or corrupt file; an
            unsupported operator or attribute.
        ParameterError: ``input_name`` is not a graph input, not exactly one
            output, an image that is not a floating 4-D input, or a ``dtype``
            that is not floating.
    """
    from opgraph.onnx import load

    path = Path(path)
    image = image_input(path, input_name)
    graph, inputs, outputs = load(path, batch=batch, inputs=[image.name], dtype=dtype)
    if len(outputs) != 1:
        raise ParameterError("path", str(path), f"the benchmark needs one input and one output; the model "
                             f"has {len(outputs)} outputs")
    (x,), (y,) = inputs, outputs
    if not is_float(x.dtype):
        raise ParameterError("path", str(path), f"input {x.name!r} is {x.dtype}; the benchmark feeds a "
                             "floating (N, C, H, W) image")
    if len(x.shape) != 4:
        raise ParameterError("path", str(path), f"input {x.name!r} has shape {x.shape}; the benchmark "
                             "feeds an (N, C, H, W) image")
    nodes = list(graph.nodes_in_order([y]))
    first_conv = next((v.inputs[0] for v in nodes if isinstance(v.op, Conv2d)), x)
    declared = declared_batch(path, image.name)
    return Model(key=path.name.removesuffix(".onnx"), spec_key="onnx", title=f"{graph.name} ({path.name})",
                 graph=graph, input=x, output=y, params=[s.output for s in graph.sources("param")],
                 first_conv_input=first_conv, seed_batch=declared or 1, batch=x.shape[0], dtype=x.dtype)


__all__ = ["load_model", "declared_batch", "image_input", "graph_inputs"]
