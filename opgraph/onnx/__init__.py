"""ONNX import: an ONNX model as an opgraph ``Graph`` of abstract ops.

``load(path_or_model, batch=None) -> (graph, inputs, outputs)``. Every ONNX
node becomes abstract ops with the attribute semantics of the ONNX operator
spec (https://onnx.ai/onnx/operators/). The list of operators and
attributes, and the known limits: ``docs/onnx.md``.

The package:

* ``registry``: the converter table (``@converter(op_type, versions)``) and
  :class:`OnnxImportError`;
* ``context``: :class:`NodeContext`, what a converter sees of its node;
* ``importer``: :func:`load` and the walk over the model's nodes;
* the converters, one decorated function per operator: ``layers`` (Conv,
  pooling, LRN, BatchNormalization, Gemm, ...) and ``tensor`` (Add, Reshape,
  Concat, Constant, ...). Adding an operator is one ``@converter`` function
  in one of them (a new converter module is also listed below).

Rules the importer keeps:

* Nothing is silently approximated. An operator, an operator version, an
  attribute, an attribute value, a domain or an input form it does not
  implement raises :class:`OnnxImportError` naming the ONNX node (name and
  op_type) and what is missing. Every attribute a node carries must be read
  by its converter, so an attribute unknown to the importer is an error too.
* Versions: each converter lists the operator versions (``since_version`` in
  the ONNX operator changelog) whose semantics it implements; a node is
  resolved to the version its model's opset selects.
* Float initializers become ``param`` sources (trainable, fed by name, their
  value as default); ``Constant`` nodes and values computed only from
  constants (shape arithmetic: ``Shape``, ``Gather``, ``Concat``, ...) are
  folded at import time and enter the graph, where a compute node reads
  them, as ``Constant`` ops. BatchNorm running statistics become constants.
* Batch: the first axis of every graph input may be symbolic; it becomes
  ``batch`` (default 1). ``batch=`` also overrides a fixed batch of 1; then a
  ``Reshape`` whose constant target shape starts with that 1 while its input
  carries the new batch gets the new batch there (an exporter bakes
  ``x.view(1, -1)`` into the file for a batch-1 export).
"""

from .context import NodeContext, Static
from .importer import load, onnx_module
from .registry import CONVERTERS, OnnxImportError, converter

# The converter modules: importing them registers their converters.
from . import layers as _layers  # noqa: E402,F401
from . import tensor as _tensor  # noqa: E402,F401

__all__ = ["load", "onnx_module", "OnnxImportError", "CONVERTERS", "converter", "NodeContext", "Static"]
