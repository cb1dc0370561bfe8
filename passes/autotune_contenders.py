"""The rules that compete for a node in autotune, and the stable name of that set in the cache key.

Of the rules the survey finds applicable (``passes/candidates.py``), the
autotune pass times :func:`contenders`: one reference alias, and on ``cuda``
no oracle kernel when another rule applies. The set of competing rules and
the functions enumerating their variants are part of each decision's cache
key (:func:`candidate_set`), named so that every process spells them the
same and so that a kernel family's ``revision``, an edit of the code that
generates its kernels (its ``fingerprint``), a change of the kernels the
generator emits for the node (a ``node_fingerprint``, of the node the key is
made for: :class:`KeyNode`) or a different ``engine_limit`` makes the
decision tuned again. Separate from
``passes/candidates.py``, which answers the question every lowering pass
asks (which rules could lower this node), where this is autotune's own
narrowing of that answer.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from .autotune_inputs import REFERENCE_ALGORITHMS
from .candidates import ENGINE_LIMIT_TAG


class KeyNode(NamedTuple):
    """The node a key is made for, as a variants function's ``node_fingerprint`` reads it
    (``backends/cuda/codegen_sources.py``: the hash of the kernels the generator emits for it).

    Attributes:
        op: the node's abstract op.
        in_types: its inputs' run types (compile's dtype applied: ``run_types``), a tuple.
        out_type: its output's run type.
        out: ``(element strides, element offset)`` of the slice of a concat's buffer the
            zero-copy plan puts its output in (``zero_copy.Home.placement``), or None.
    """

    op: object
    in_types: tuple
    out_type: object
    out: tuple | None = None


def candidate_set(applicable, engine_limit: int | None = None, node: KeyNode | None = None) -> str:
    """``'cuda:pool_variants,cudnn:variants[engines<=10]'``: the competing
    rules (``(rule, options)`` pairs) and the function enumerating each one's
    variants, with the engine limit of those that take it (part of the cache
    key, so the same in every process: no object address; a decision tuned
    among 10 engines is not reused for a policy asking for all). ``node``: the
    node the key is for, which a variants function's ``node_fingerprint``
    hashes (:func:`_stable_name`); None leaves those fingerprints out (the key
    of a decision that is never cached: ``passes/autotune.py``)."""
    def name(rule) -> str:
        limited = ENGINE_LIMIT_TAG in rule.tags and engine_limit is not None
        at = node
        if node is not None and node.out is not None and not rule.writes_strided(node.out_type.layout):
            at = node._replace(out=None)  # it runs dense, copied into the slice: no strided form to hash
        return (f"{rule.algorithm}:{_stable_name(rule.variants, at)}"
                + (f"[engines<={engine_limit}]" if limited else ""))
    return ",".join(sorted(name(r) for r, _ in applicable))


def _stable_name(fn, node: KeyNode | None = None) -> str:
    """A function's qualified name; for a ``functools.partial``, the wrapped
    function's with its bound arguments (``variants('forward')``); with
    ``@<revision>`` when the function has a ``revision`` attribute (a kernel
    family that changed how fast it runs bumps it, so the decisions tuned
    against its old kernels are tuned again: ``rules.vector_pool_variants``);
    with ``#<fingerprint>`` when it has a ``fingerprint`` (a zero-argument
    callable: the hash of the code that generates the family's kernels,
    ``backends/cuda/kernel_sources.py``), so an edit of that code has the
    decisions tuned again with no revision bump, their checks (a filled
    input's too) run on the kernels as they are now; and with
    ``#<fingerprint>`` of ``node`` when it has a ``node_fingerprint``
    (``node_fingerprint(op, in_types, out_type, out)``: the hash of the
    kernels the generator emits for that node, ``codegen_sources``) and
    ``node`` is given: an edit of the generator re-tunes the nodes whose
    kernels it changed, and no other. Both are ``#`` and 12 hex digits, which
    ``AutotuneCache.superseded`` recognises."""
    if isinstance(fn, functools.partial):
        args = ", ".join([*map(repr, fn.args), *(f"{k}={v!r}" for k, v in sorted(fn.keywords.items()))])
        return f"{_stable_name(fn.func, node)}({args})"
    name = getattr(fn, "__qualname__", type(fn).__qualname__)
    revision = getattr(fn, "revision", None)
    fingerprint = getattr(fn, "fingerprint", None)
    per_node = getattr(fn, "node_fingerprint", None)
    name = name if revision is None else f"{name}@{revision}"
    name = name if fingerprint is None else f"{name}#{fingerprint()}"
    return name if per_node is None or node is None else f"{name}#{per_node(*node)}"


def contenders(applicable, device: str):
    """The candidates worth timing: all but the first reference alias (``direct``
    and ``reference`` run the same conv code: timing both is wasted work), and on
    ``cuda`` no reference at all when another rule applies: the oracle kernels
    are written to be right, not fast (float64-capable NumPy/CuPy code, host
    synchronisations), no step of a model may run them on the GPU (issue 16),
    and timing them on every node of a large model cost minutes of autotuning."""
    applicable = list(applicable)
    if device == "cuda" and any(e.rule.algorithm not in REFERENCE_ALGORITHMS for e in applicable):
        applicable = [e for e in applicable if e.rule.algorithm not in REFERENCE_ALGORITHMS]
    seen_ref = False
    for entry in applicable:
        if entry.rule.algorithm in REFERENCE_ALGORITHMS:
            if seen_ref:
                continue
            seen_ref = True
        yield entry


__all__ = ["contenders", "candidate_set", "KeyNode"]
