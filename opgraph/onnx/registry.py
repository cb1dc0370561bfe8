"""The ONNX converter table: one converter per ONNX operator, with the operator
versions (``since_version`` values of the ONNX operator changelog) whose
semantics it implements, and the importer's error.

A converter is ``fn(ctx) -> Value | ndarray`` (``ctx`` a
:class:`~.context.NodeContext`; an ndarray is an import-time constant),
registered with ``@converter("OpType", {versions})``.
"""

from __future__ import annotations

from typing import Callable

from ..errors import OpgraphError

#: op_type -> (versions implemented, converter(ctx) -> Value | ndarray).
CONVERTERS: dict[str, tuple[frozenset, Callable]] = {}


class OnnxImportError(OpgraphError):
    """The model uses an operator, attribute, version or form the importer does not implement."""


def converter(op_type: str, versions):
    """Register ``fn(ctx)`` as the converter of ``op_type`` at ``versions`` (since_version values)."""

    def deco(fn):
        CONVERTERS[op_type] = (frozenset(versions), fn)
        return fn

    return deco


__all__ = ["CONVERTERS", "OnnxImportError", "converter"]
