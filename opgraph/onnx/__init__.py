"""ONNX import: an ONNX model as an opgraph ``Graph`` of abstract ops.

``load(path_or_model, batch=None, *, inputs=None, dtype=None) -> (graph,
inputs, outputs)``. Every ONNX node becomes abstract ops with the attribute
semantics of the ONNX operator spec (https://onnx.ai/onnx/operators/). The
list of operators and attributes, and the known limits: ``docs/onnx.md``.

The package:

* ``registry``: the converter table (``@converter(op_type, versions)``) and
  :class:`OnnxImportError`;
* ``reading``: the model from a file, bytes or a ``ModelProto`` (an empty,
  corrupt or truncated file is an error naming it);
* ``context``: :class:`NodeContext`, what a converter sees of its node;
* ``patterns``: subgraphs read as one op before conversion (GELU written
  with ``Erf``);
* ``importer``: :func:`load` and the walk over the model's nodes;
* the converters, one decorated function per operator: ``layers`` (Conv,
  pooling, LRN, BatchNormalization, LayerNormalization, Gemm, ...),
  ``activations`` (Clip, Sigmoid, HardSigmoid, HardSwish, Gelu, ...),
  ``slicing`` (Slice, Split) and ``tensor`` (Add, Div, Reshape, Concat,
  Cast, ReduceMean, Constant, ...). Adding an operator is one ``@converter``
  function in one of them (a new converter module is also listed below).

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
  value as default); read by a BatchNormalization as running statistics,
  ``buffer`` sources (``Graph.buffer``: fed by name, never trained).
  ``Constant`` nodes and values computed only from constants (shape
  arithmetic: ``Shape``, ``Gather``, ``Concat``, ``Div``, ``Cast``, ...) are
  folded at import time and enter the graph, where a compute node reads
  them, as ``Constant`` ops.
* Weightless exports (``export_params=False``): with ``inputs=[names]`` the
  other graph inputs are parameters without values (static shapes, floating),
  entering as ``param`` or ``buffer`` sources like initializers, to be fed by
  name.
* One source per tensor name. Exporters deduplicate tensors that are equal at
  export time behind ``Identity`` nodes (PyTorch's: every zero bias of a
  freshly initialised network, a BatchNorm's zero running mean and another's
  zero bias). They are distinct parameters of the network, often of different
  roles, so an ``Identity`` of a parameter is a parameter of its own, named
  after the Identity's output (torchvision's parameter names, where the
  exporter kept them): parameter counts are the network's, and a gradient or
  a buffer never flows into another layer's parameter. Nodes reading one
  name share its source, as the file says.
* Batch: the first axis of every data input may be symbolic; it becomes
  ``batch`` (default 1). ``batch=`` also overrides a fixed batch of 1; then a
  ``Reshape`` whose constant target shape starts with that 1 while its input
  carries the new batch gets the new batch there (an exporter bakes
  ``x.view(1, -1)`` into the file for a batch-1 export).
* ``dtype=``: every floating tensor is stored in that dtype instead of the
  file's (the benchmark's ``--dtype``).
"""

from .context import Declared, NodeContext, Static
from .importer import load, onnx_module
from .registry import CONVERTERS, OnnxImportError, converter

# The converter modules: importing them registers their converters.
from . import activations as _activations  # noqa: E402,F401
from . import layers as _layers  # noqa: E402,F401
from . import slicing as _slicing  # noqa: E402,F401
from . import tensor as _tensor  # noqa: E402,F401

__all__ = ["load", "onnx_module", "OnnxImportError", "CONVERTERS", "converter", "NodeContext", "Static", "Declared"]
