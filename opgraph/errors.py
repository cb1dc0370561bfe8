"""Exception types of opgraph.

Every error raised while building, lowering or running a graph names the node
(its name and op type), the parameter and the offending value, so that a user
can find the line of the model that caused it.
"""

from __future__ import annotations


class OpgraphError(Exception):
    """Base class of every error opgraph raises on purpose."""


class ParameterError(OpgraphError, ValueError):
    """An op parameter is out of its domain (stride 0, negative padding, ...).

    Raised by op constructors as ``ParameterError(param, value, why)``; the
    graph re-raises it with the node name prefixed (:meth:`with_node`).
    """

    def __init__(self, param: str, value, why: str, node: str | None = None):
        self.param, self.value, self.why, self.node = param, value, why, node
        where = f"node {node}: " if node else ""
        super().__init__(f"{where}parameter {param}={value!r}: {why}")

    def with_node(self, node: str) -> "ParameterError":
        return ParameterError(self.param, self.value, self.why, node)


class ShapeError(OpgraphError, ValueError):
    """Input shapes or dtypes do not fit an op (raised by ``Op.infer``)."""

    def __init__(self, message: str, node: str | None = None):
        self.message, self.node = message, node
        super().__init__(f"node {node}: {message}" if node else message)

    def with_node(self, node: str) -> "ShapeError":
        return ShapeError(self.message, node)


class NotDifferentiableError(OpgraphError):
    """``grad`` reached an op that has no gradient rule."""


class LoweringError(OpgraphError):
    """A node cannot be lowered: a forced algorithm declined, or none applies."""


class NotLoweredError(OpgraphError):
    """The executor met an abstract (non-executable) node."""


class ExecutionError(OpgraphError):
    """Bad run-time feed: a missing input, a wrong shape, an unknown name."""
