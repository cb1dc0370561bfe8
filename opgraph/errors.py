"""Exception types of opgraph, and how its messages point the user at a fix.

Every error raised while building, lowering or running a graph names the node
(its name and op type), the parameter and the offending value, so that a user
can find the line of the model that caused it. An unknown name offers the
known names close to it (:func:`did_you_mean`); a warning names the user's
line that called into opgraph, not the pass that noticed
(:func:`warn_from_caller`).
"""

from __future__ import annotations

import difflib
import sys
import warnings
from typing import Callable, Iterable


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


def did_you_mean(name: str, known: Iterable[str], key: Callable[[str], str] | None = None, n: int = 3) -> str:
    """``" (did you mean 'winograd'?)"``: the suffix of an error about the
    unknown ``name``, offering the names of ``known`` close to it
    (``difflib.get_close_matches``: at most ``n``, three by default, closest
    first), or ``""`` when none is close. ``key``: what is compared of each
    name (``str.lower`` for units read in any case; the name without its
    dashes for a flag, so that ``--`` alone makes no two flags close); the
    names offered are the ``known`` spellings."""
    if not isinstance(name, str):  # a key of a mapping built in Python may be anything
        return ""
    if key is None:
        close = difflib.get_close_matches(name, sorted(set(known)), n=n)
    else:
        keyed: dict[str, str] = {}
        for k in sorted(set(known)):
            keyed.setdefault(key(k), k)
        close = [keyed[c] for c in difflib.get_close_matches(key(name), list(keyed), n=n)]
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


def warn_from_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the innermost frame
    outside the ``opgraph`` package (its subpackages ``opgraph.passes``,
    ``opgraph.backends``, ``opgraph.benchmarks`` included): the user's line
    that called into opgraph, not the pass that noticed. Frames are told
    apart by module name, not file path, since the subpackages live outside
    ``opgraph/`` in the source tree; this works on every supported Python
    (``skip_file_prefixes`` needs 3.12, setup.cfg allows 3.10)."""
    level, frame = 1, sys._getframe(1)  # level 1: this function's caller
    # the outermost frame ends the walk, so that a program run inside opgraph still gets a line
    while frame.f_back is not None and _in_opgraph(frame.f_globals.get("__name__", "")):
        level, frame = level + 1, frame.f_back
    warnings.warn(message, category, stacklevel=level + 1)  # + 1: this function's own frame


def _in_opgraph(module: str) -> bool:
    return module == "opgraph" or module.startswith("opgraph.")
