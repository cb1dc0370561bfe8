"""``load``: an ONNX model as an opgraph ``Graph`` (the rules it keeps: the
package docstring)."""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from ..errors import OpgraphError, ParameterError
from ..graph import Graph, Value
from ..ops import Constant
from ..types import DTYPES, FLOAT_DTYPES, is_float, numpy_dtype
from .context import ROLES, Declared, NodeContext, Static
from .patterns import GELU_VERSION, fuse_gelu
from .reading import read_model
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
                          "(in a source checkout: pip install -e '.[onnx]'; or pip install onnx)") from None
    return onnx


def load(path_or_model, batch: int | None = None, *, inputs: Sequence[str] | None = None,
         dtype: str | None = None) -> tuple[Graph, list[Value], list[Value]]:
    """Import an ONNX model.

    Args:
        path_or_model: a file path, the serialized bytes, or an
            ``onnx.ModelProto``.
        batch: the batch size to build for. It replaces a symbolic first
            axis of the data inputs (default 1) and a fixed batch of 1;
            any other fixed batch must equal it.
        inputs: the names of the graph inputs that are data, fed at every
            run (an image). Every other graph input that is not an
            initializer is then a parameter without a value (a weightless
            export, ``torch.onnx.export(..., export_params=False)``): its
            shape must be static and its dtype floating; it enters the graph
            as a ``param`` source, or a ``buffer`` source where a
            BatchNormalization reads it as running statistics, one source
            per tensor name a node reads (see the package docstring on
            ``Identity``). None (default): every such graph input is data.
        dtype: None keeps the file's dtypes; a floating dtype name
            (``'float32'``, ``'float64'``, ``'float16'``, ``'bfloat16'``)
            stores every floating tensor in it instead: data inputs,
            parameters, buffers, constants and so every activation (a
            ``Cast`` between floating types then casts to it).

    Returns:
        ``(graph, inputs, outputs)``: the graph, one ``Value`` per data input
        (named as in the file, fed by that name), one per ONNX graph output,
        in the file's order.

    Raises:
        ImportError: the ``onnx`` package is missing.
        OnnxImportError: an unreadable, empty, corrupt or truncated file (the
            message names it); an unsupported operator, version, attribute or
            input form, naming the ONNX node; tensors no input, initializer or
            earlier node defines; or a symbolic non-batch dimension.
        ParameterError: ``batch`` is not an int >= 0 or conflicts with a
            fixed batch other than 1; ``inputs`` names a tensor that is not a
            graph input (the message lists them); ``dtype`` is not floating.
    """
    onnx = onnx_module()
    model, origin = read_model(onnx, path_or_model)
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 0):
        raise ParameterError("batch", batch, "must be an int >= 0 or None")
    if isinstance(inputs, str) or (inputs is not None and not all(isinstance(n, str) for n in inputs)):
        raise ParameterError("inputs", inputs, "must be a sequence of graph input names or None")
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise ParameterError("dtype", dtype, f"must be None (the file's) or one of {FLOAT_DTYPES}")
    try:
        return Importer(onnx, model, batch, inputs, dtype).run()
    except OnnxImportError as e:
        if isinstance(path_or_model, (str, os.PathLike)):  # several files may be imported in one run
            raise OnnxImportError(f"{origin}: {e}") from e
        raise


class Importer:
    """One import: walks the model's nodes in order, converting each with its
    registered converter (:data:`~.registry.CONVERTERS`)."""

    def __init__(self, onnx, model, batch, data_inputs=None, dtype=None):
        self.onnx, self.model, self.g = onnx, model, model.graph
        self.graph = Graph(self.g.name or "onnx")
        self.opset = self._opset()
        self.env: dict[str, Value | Static | Declared] = {}
        self.entered: dict[tuple, Value] = {}
        self.consumed = {n for node in self.g.node for n in node.input} | {o.name for o in self.g.output}
        self.batch, self.batch_from = batch, None
        self.data_inputs = None if data_inputs is None else list(data_inputs)
        self.dtype = dtype  # None: the file's; else the storage dtype of every floating tensor

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

    def storage(self, dtype: str) -> str:
        """The dtype a tensor the file declares as ``dtype`` is stored in."""
        return self.dtype if self.dtype is not None and is_float(dtype) else dtype

    # ---- values ----------------------------------------------------------
    def value(self, name: str, *, role="param", dtype=None, ctx=None) -> Value:
        """The graph value of tensor ``name``; a parameter or import-time value
        enters the graph here (once per name, role and dtype)."""
        fail = ctx.error if ctx else OnnxImportError
        if role not in ROLES:
            raise ValueError(f"role {role!r} is not one of {ROLES}")
        item = self.env.get(name)
        if item is None:
            raise fail(f"tensor {name!r} is not produced by any earlier node, input or initializer")
        if isinstance(item, Value):
            return item
        if isinstance(item, Declared):
            kind = "param" if role == "param" else "buffer"
            key = (item.name, kind, item.dtype)
            if key not in self.entered:
                make = self.graph.param if kind == "param" else self.graph.buffer
                self.entered[key] = make(self.unique_name(item.name), item.shape, item.dtype)
            return self.entered[key]
        value = item.value
        if dtype is None and is_float(value.dtype.name):
            dtype = self.storage(value.dtype.name)
        if dtype is not None and value.dtype != numpy_dtype(dtype):
            value = value.astype(numpy_dtype(dtype))
        kind = role if item.trainable else "constant"
        key = (item.name, kind, value.dtype.name)  # item.name: the initializer's, or an Identity's output
        if key not in self.entered:
            if value.dtype.kind in "iub":
                value = value.astype(np.int64)
            if value.dtype.name not in DTYPES:
                raise fail(f"tensor {name!r} has dtype {value.dtype}, not one of {DTYPES}")
            node_name = self.unique_name(item.name)
            if kind == "param":
                v = self.graph.param(node_name, value.shape, value.dtype.name, value=value)
            elif kind == "buffer":
                v = self.graph.buffer(node_name, value.shape, value.dtype.name, value=value)
            else:
                v = self.graph.apply(Constant, {"value": value}, [], node_name)
            self.entered[key] = v
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
        """Data inputs as ``input`` sources; the other graph inputs, when
        ``data_inputs`` names the data, as :class:`Declared` parameters."""
        declared = [vi for vi in self.g.input if vi.name not in initializers]  # IR < 4 lists initializers too
        names = [vi.name for vi in declared]
        for n in self.data_inputs or ():
            if n not in names:
                shown = ", ".join(map(repr, names[:10])) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
                raise ParameterError("inputs", n, f"is not a graph input of the model; its graph inputs "
                                                  f"are {shown or 'none'}")
        out = []
        for vi in declared:
            if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
                raise OnnxImportError(f"graph input {vi.name!r} is not a tensor of known rank")
            tt = vi.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            dtype = self.storage(self._dtype(tt.elem_type, f"graph input {vi.name!r}"))
            if self.data_inputs is not None and vi.name not in self.data_inputs:
                self.env[vi.name] = self._declared_param(vi.name, dims, dtype)
                continue
            for axis, d in enumerate(dims[1:], start=1):
                if d is None:
                    raise OnnxImportError(f"graph input {vi.name!r} has a symbolic dimension at axis "
                                          f"{axis}; only the batch axis (0) may be symbolic")
            if dims:
                dims[0] = self._batch_dim(vi.name, dims[0])
            v = self.graph.input(vi.name, dims, dtype)
            self.env[vi.name] = v
            out.append(v)
        return out

    def _declared_param(self, name: str, dims: list, dtype: str) -> Declared:
        data = ", ".join(map(repr, self.data_inputs))
        if None in dims:
            raise OnnxImportError(f"graph input {name!r} has a symbolic dimension at axis {dims.index(None)}; "
                                  f"a parameter input (any input but {data}) needs a static shape")
        if not is_float(dtype):
            raise OnnxImportError(f"graph input {name!r} is {dtype}; a parameter input (any input but "
                                  f"{data}) must be floating")
        return Declared(name, tuple(dims), dtype)

    def _batch_dim(self, name: str, fixed: int | None) -> int:
        if self.batch is None:
            return 1 if fixed is None else fixed
        if fixed is not None and fixed not in (1, self.batch):
            hint = ("" if self.data_inputs is not None else
                    "; if it is a parameter (a weightless export), name the data inputs with inputs=[...]")
            raise ParameterError("batch", self.batch, f"graph input {name!r} has a fixed batch of "
                                 f"{fixed}; only a symbolic batch or a batch of 1 can be overridden{hint}")
        if fixed == 1 and self.batch != 1:
            self.batch_from = 1
        return self.batch

    def _check_defined(self, defined: set[str]) -> None:
        """Every tensor a node reads is a graph input, an initializer or an
        earlier node's output; else one error naming each missing tensor and its reader.
        Every tensor is defined once (ONNX graphs are in single static assignment form:
        ``onnx.checker`` and onnxruntime refuse a name defined twice); else an error naming
        each and its definitions, rather than reading whichever came last."""
        missing: dict[str, str] = {}
        writers: dict[str, list[str]] = {t: [] for t in defined}
        for node in self.g.node:
            label = f"ONNX node {node.name or node.output[0]!r} ({node.op_type})"
            for t in node.input:
                if t and t not in defined and t not in missing:
                    missing[t] = label
            for o in node.output:
                if o:
                    writers.setdefault(o, []).append(label)
            defined.update(o for o in node.output if o)
        twice = {t: who for t, who in writers.items() if len(who) > 1 or (who and t in self.env)}
        if twice:
            listed = "; ".join(f"{t!r} (" + ("a graph input or initializer, and by " if t in self.env else "by ")
                               + " and ".join(who) + ")" for t, who in list(twice.items())[:10])
            more = f"; and {len(twice) - 10} more" if len(twice) > 10 else ""
            raise OnnxImportError(f"{len(twice)} tensor(s) are defined more than once (an ONNX graph defines "
                                  f"each tensor once): {listed}{more}")
        if missing:
            listed = "; ".join(f"{t!r} (read by {who})" for t, who in list(missing.items())[:10])
            more = f"; and {len(missing) - 10} more" if len(missing) > 10 else ""
            raise OnnxImportError(f"{len(missing)} tensor(s) are read but not defined by any graph input, "
                                  f"initializer or earlier node: {listed}{more}")

    def _constants(self) -> dict[str, np.ndarray]:
        """Every initializer and ``Constant`` node output with a tensor or number value (for patterns)."""
        out = {name: s.value for name, s in self.env.items() if isinstance(s, Static)}
        helper = self.onnx.helper
        for node in self.g.node:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.attribute) == 1:
                a = node.attribute[0]
                if a.name in ("value", "value_float", "value_floats", "value_int", "value_ints"):
                    v = helper.get_attribute_value(a)
                    out[node.output[0]] = (self.onnx.numpy_helper.to_array(v) if a.name == "value"
                                           else np.asarray(v))
        return out

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
        self._check_defined(set(self.env))
        graph_outputs = {o.name for o in self.g.output}
        nodes, fused = fuse_gelu(self.onnx.helper, self.g.node, self._constants(), graph_outputs)
        for node in nodes:
            self._convert(node, GELU_VERSION if id(node) in fused else None)
        outputs = []
        for o in self.g.output:
            if o.name not in self.env:
                raise OnnxImportError(f"graph output {o.name!r} is not produced by any node")
            outputs.append(self.value(o.name))
        return self.graph, inputs, outputs

    def _version(self, node, label: str) -> tuple[int, object]:
        versions, fn = CONVERTERS[node.op_type]
        try:
            version = self.onnx.defs.get_schema(node.op_type, self.opset, "").since_version
        except Exception:
            raise OnnxImportError(f"{label}: ONNX defines no {node.op_type} at opset {self.opset}") from None
        if version not in versions:
            raise OnnxImportError(f"{label}: version {version} of {node.op_type} (selected by opset "
                                  f"{self.opset}) is not supported; supported versions: "
                                  f"{', '.join(map(str, sorted(versions)))}")
        return version, fn

    def _convert(self, node, version: int | None = None) -> None:
        """Convert ``node`` (at the opset's version of its operator, or ``version``
        for a node :func:`~.patterns.fuse_gelu` made) and bind its outputs."""
        label = f"ONNX node {node.name or node.output[0]!r} ({node.op_type})"
        if node.domain not in ("", "ai.onnx"):
            raise OnnxImportError(f"{label}: operator domain {node.domain!r} is not supported")
        if node.op_type not in CONVERTERS:
            raise OnnxImportError(f"{label}: operator {node.op_type} is not supported by the importer "
                                  f"(supported: {', '.join(sorted(CONVERTERS))})")
        if version is None:
            version, fn = self._version(node, label)
        else:
            fn = CONVERTERS[node.op_type][1]
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
        results = list(result) if isinstance(result, (list, tuple)) else [result]
        for i in range(len(results), len(node.output)):
            if ctx.output_used(i):
                raise ctx.error(f"output {i} ({node.output[i]!r}) is used, but only "
                                f"{'output 0 is' if len(results) == 1 else f'{len(results)} outputs are'} "
                                "supported")
        for name, r in zip(node.output, results):
            if name:
                self.env[name] = r if isinstance(r, (Value, Static, Declared)) else Static(name, np.asarray(r))


__all__ = ["load", "onnx_module", "Importer"]
