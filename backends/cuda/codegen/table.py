"""The expression table itself: op type -> :class:`Expression` (``expressions.py``
fills it, ``layer_norm.py`` adds layer normalisation's ops, ``plan.py`` reads it)."""

from __future__ import annotations

from typing import Callable

import attrs


@attrs.frozen
class Expression:
    build: Callable
    iterates: str | None = "out"


EXPRESSIONS: dict[type, Expression] = {}


def expression(*op_types, iterates="out"):
    """Decorator: ``fn(b, op, types, *operands)`` is the IR of ``op_types``."""
    def deco(fn):
        for t in op_types:
            EXPRESSIONS[t] = Expression(fn, iterates)
        return fn
    return deco


__all__ = ["EXPRESSIONS", "Expression", "expression"]
