"""How a reference kernel registers itself, next to its definition.

Two decorators, one per kernel convention:

* :func:`reference` over ``fn(xp, *arrays, **fields)``: the op's fields are
  the function's keyword arguments (wrapped by :func:`params_kernel`);
* :func:`reference_node` over ``kernel(ctx, op, *arrays)``: a kernel that
  reads the node's geometry (the op's canonical fields, ``ctx.out_type``).

Each registers the ``reference`` rule of its op type (tag ``reference``).
Every reference kernel returns a new array, never a view of an input
(``fresh_output``; each module's docstring says so). A new op's oracle is
one decorated function in one of this package's modules: the package
imports them all (``rules.py``).
"""

from __future__ import annotations

from ..registry import Rule, register


def params_kernel(fn, prefix: str = "reference", options: tuple = ()):
    """Wrap ``fn(xp, *arrays, **params)`` as a rule kernel ``(ctx, op, *arrays)``:
    the op's fields are the function's keyword arguments (shared by every
    backend whose kernels follow that convention, e.g. ``cuda_rules``), plus
    those of ``options`` the kernel context sets (an autotune variant's
    choice, e.g. ``specialize``; unset ones keep ``fn``'s defaults). An
    ``out=`` array (an in-place step, ``Rule.inplace``) is passed on to
    ``fn``; the kernel is called without it otherwise."""

    def kernel(ctx, op, *arrays, out=None):
        chosen = {k: ctx.options[k] for k in options if k in ctx.options}
        if out is not None:
            chosen["out"] = out
        return fn(ctx.xp, *arrays, **op.params(), **chosen)

    kernel.__name__ = kernel.__qualname__ = f"{prefix}_{fn.__name__}"
    kernel.__doc__ = fn.__doc__
    return kernel


def _register(op_type, kernel, inplace) -> None:
    register(Rule(op_type, "reference", kernel, tags={"reference"}, inplace=inplace, fresh_output=True))


def reference(op_type: type, *, inplace=None):
    """Decorator: ``fn(xp, *arrays, **fields)`` is ``op_type``'s reference rule.

    ``inplace``: the input positions whose buffer the kernel may write its
    output into (``Rule.inplace``: an element-wise op into an operand of its
    output's type; ``fn`` then takes that array as ``out=``). Returns ``fn``.
    """
    def deco(fn):
        _register(op_type, params_kernel(fn), inplace)
        return fn
    return deco


def reference_node(op_type: type, *, inplace=None):
    """Decorator: ``kernel(ctx, op, *arrays)`` is ``op_type``'s reference rule;
    ``inplace`` as for :func:`reference` (the kernel then takes ``out=``).
    Returns ``kernel``."""
    def deco(kernel):
        _register(op_type, kernel, inplace)
        return kernel
    return deco


__all__ = ["reference", "reference_node", "params_kernel"]
