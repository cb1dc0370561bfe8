"""``load``: an ONNX model as an opgraph ``Graph`` (the rules it keeps: the
package docstring)."""

from __future__ import annotations

import os

import numpy as np

from ..errors import OpgraphError, ParameterError
from ..graph import Graph, Value
from ..ops import Constant
from ..types import DTYPES
from .context import NodeContext, Static
from .registry import CONVERTERS, OnnxImportError


def onnx_module():
    """The ``onnx`` package, with the submodules the importer reads.

    Raises:
        ImportError: ``onnx`` is not installed (the message says how to install it).
    """
    try:
        import onnx
        import onnx.defs
        import onnx.helper
        import onnx.numpy_helper  # noqa: F401
    except ImportError:
        raise ImportError("opgraph.onnx needs the 'onnx' package: pip install 'opgraph[onnx]' "
                          "(or pip install onnx)") from None
    return onnx


def load(path_or_model, batch: int | None = None) -> tuple[Graph, list[Value], list[Value]]:
    """Import an ONNX model.

    Args:
        path_or_model: a file path, the serialized bytes, or an
            ``onnx.ModelProto``.
        batch: the batch size to build for. It replaces a symbolic first
            axis of the graph inputs (default 1) and a fixed batch of 1;
            any other fixed batch must equal it.

    Returns:
        ``(graph, inputs, outputs)``: the graph, one ``Value`` per ONNX graph
        input that is not an initializer (named as in the file, fed by that
        name), one per ONNX graph output, in the file's order.

    Raises:
        ImportError: the ``onnx`` package is missing.
        OnnxImportError: an unreadable or corrupt file; an unsupported operator,
            version, attribute or input form, naming the ONNX node; or a
            symbolic non-batch dimension.
        ParameterError: ``batch`` is not an int >= 0, or conflicts with a
            fixed batch other than 1.
    """
    onnx = onnx_module()
    if isinstance(path_or_model, (str, os.PathLike)):
        path = os.fspath(path_or_model)
        try:
            model = onnx.load(path)
        except OSError as e:
            raise OnnxImportError(f"ONNX file {path!r} cannot be read ({e.strerror or e})") from None
        except Exception as e:  # protobuf's DecodeError and friends: not an ONNX model
            raise OnnxImportError(f"ONNX file {path!r} is not a valid ONNX model "
                                  f"({type(e).__name__}: {e})") from None
    elif isinstance(path_or_model, (bytes, bytearray)):
        try:
            model = onnx.load_from_string(bytes(path_or_model))
        except Exception as e:
            raise OnnxImportError(f"the bytes given are not a valid ONNX model ({type(e).__name__}: {e})") from None
    elif isinstance(path_or_model, onnx.ModelProto):
        model = path_or_model
    else:
        raise TypeError(f"load: expected a path, bytes or onnx.ModelProto, got {type(path_or_model).__name__}")
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 0):
        raise ParameterError("batch", batch, "must be an int >= 0 or None")
    return Importer(onnx, model, batch).run()


class Importer:
    """One import: walks the model's nodes in order, converting each with its
    registered converter (:data:`~.registry.CONVERTERS`)."""

    def __init__(self, onnx, model, batch):
        self.onnx, self.model, self.g = onnx, model, model.graph
        self.graph = Graph(self.g.name or "onnx")
        self.opset = self._opset()
        self.env: dict[str, Value | Static] = {}
        self.entered: dict[tuple, Value] = {}
        self.consumed = {n for node in self.g.node for n in node.input} | {o.name for o in self.g.output}
        self.batch, self.batch_from = batch, None

    def _opset(self) -> int:
        known = self.onnx.defs.onnx_opset_version()
        for imp in self.model.opset_import:
            if imp.domain in ("", "ai.onnx"):
                if imp.version > known:  # newer operator versions would be misread as older ones
                    raise OnnxImportError(f"the model's opset {imp.version} is newer than the installed "
                                          f"onnx package knows ({known}); upgrade onnx")
                return int(imp.version)
        raise OnnxImportError("the model imports no opset of the default ONNX domain")

    def unique_name(self, name: str) -> str:
        if name not in self.graph:
            return name
        k = 2
        while f"{name}_{k}" in self.graph:
            k += 1
        return f"{name}_{k}"

    # ---- values ----------------------------------------------------------
    def value(self, name: str, *, constant=False, dtype=None, ctx=None) -> Value:
        item = self.env.get(name)
        if item is None:
            raise (ctx.error if ctx else OnnxImportError)(f"tensor {name!r} is not produced by any "
                                                          "earlier node, input or initializer")
        if isinstance(item, Value):
            return item
        value = item.value if dtype is None else item.value.astype(dtype)
        trainable = item.trainable and not constant
        key = (item.name, trainable, value.dtype.name)  # item.name: the initializer's, through Identity
        if key not in self.entered:
            if value.dtype.kind in "iub":
                value = value.astype(np.int64)
            if value.dtype.name not in DTYPES:
                raise (ctx.error if ctx else OnnxImportError)(
                    f"tensor {name!r} has dtype {value.dtype}, not one of {DTYPES}")
            node_name = self.unique_name(item.name)
            if trainable:
                self.entered[key] = self.graph.param(node_name, value.shape, value.dtype.name, value=value)
            else:
                self.entered[key] = self.graph.apply(Constant, {"value": value}, [], node_name)
        return self.entered[key]

    def _dtype(self, elem_type: int, what: str) -> str:
        try:
            name = np.dtype(self.onnx.helper.tensor_dtype_to_np_dtype(elem_type)).name
        except (KeyError, TypeError, ValueError):
            name = f"ONNX element type {elem_type}"
        if name not in DTYPES:
            raise OnnxImportError(f"{what} has dtype {name}, not one of {DTYPES}")
        return name

    def _inputs(self, initializers: set[str]) -> list[Value]:
        out = []
        for vi in self.g.input:
            if vi.name in initializers:
                continue  # IR < 4 lists initializers among the inputs: they are parameters
            if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
                raise OnnxImportError(f"graph input {vi.name!r} is not a tensor of known rank")
            tt = vi.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            for axis, d in enumerate(dims[1:], start=1):
                if d is None:
                    raise OnnxImportError(f"graph input {vi.name!r} has a symbolic dimension at axis "
                                          f"{axis}; only the batch axis (0) may be symbolic")
            if dims:
                dims[0] = self._batch_dim(vi.name, dims[0])
            v = self.graph.input(vi.name, dims, self._dtype(tt.elem_type, f"graph input {vi.name!r}"))
            self.env[vi.name] = v
            out.append(v)
        return out

    def _batch_dim(self, name: str, fixed: int | None) -> int:
        if self.batch is None:
            return 1 if fixed is None else fixed
        if fixed is not None and fixed not in (1, self.batch):
            raise ParameterError("batch", self.batch, f"graph input {name!r} has a fixed batch of "
                                 f"{fixed}; only a symbolic batch or a batch of 1 can be overridden")
        if fixed == 1 and self.batch != 1:
            self.batch_from = 1
        return self.batch

    # ---- the walk --------------------------------------------------------
    def run(self):
        inits = {}
        for t in self.g.initializer:
            arr = self.onnx.numpy_helper.to_array(t)
            inits[t.name] = Static(t.name, arr, trainable=arr.dtype.kind == "f")
        if self.g.sparse_initializer:
            raise OnnxImportError("sparse initializers are not supported")
        inputs = self._inputs(set(inits))
        self.env.update(inits)
        for node in self.g.node:
            self._convert(node)
        outputs = []
        for o in self.g.output:
            if o.name not in self.env:
                raise OnnxImportError(f"graph output {o.name!r} is not produced by any node")
            outputs.append(self.value(o.name))
        return self.graph, inputs, outputs

    def _convert(self, node) -> None:
        label = f"ONNX node {node.name or node.output[0]!r} ({node.op_type})"
        if node.domain not in ("", "ai.onnx"):
            raise OnnxImportError(f"{label}: operator domain {node.domain!r} is not supported")
        if node.op_type not in CONVERTERS:
            raise OnnxImportError(f"{label}: operator {node.op_type} is not supported by the importer "
                                  f"(supported: {', '.join(sorted(CONVERTERS))})")
        versions, fn = CONVERTERS[node.op_type]
        try:
            version = self.onnx.defs.get_schema(node.op_type, self.opset, "").since_version
        except Exception:
            raise OnnxImportError(f"{label}: ONNX defines no {node.op_type} at opset {self.opset}") from None
        if version not in versions:
            raise OnnxImportError(f"{label}: version {version} of {node.op_type} (selected by opset "
                                  f"{self.opset}) is not supported; supported versions: "
                                  f"{', '.join(map(str, sorted(versions)))}")
        ctx = NodeContext(self, node, version)
        try:
            result = fn(ctx)
        except OnnxImportError:
            raise
        except OpgraphError as e:
            raise OnnxImportError(f"{label}: {e}") from e
        unread = ctx.unread_attributes()
        if unread:
            raise ctx.error(f"attribute(s) {', '.join(unread)} not supported by the importer")
        for i in range(1, len(node.output)):
            if ctx.output_used(i):
                raise ctx.error(f"output {i} ({node.output[i]!r}) is used, but only output 0 is supported")
        if not isinstance(result, (Value, Static)):
            result = Static(node.output[0], np.asarray(result))
        self.env[node.output[0]] = result


__all__ = ["load", "onnx_module", "Importer"]
