"""The rules that compete for a node in autotune, and the stable name of that set in the cache key.

Of the rules the survey finds applicable (``passes/candidates.py``), the
autotune pass times :func:`contenders`: one reference alias, and on ``cuda``
no oracle kernel when another rule applies. The set of competing rules and
the functions enumerating their variants are part of each decision's cache
key (:func:`candidate_set`), named so that every process spells them the
same and so that a kernel family's ``revision``, an edit of the code that
generates its kernels (its ``fingerprint``) or a different ``engine_limit``
makes the decision tuned again. Separate from
``passes/candidates.py``, which answers the question every lowering pass
asks (which rules could lower this node), where this is autotune's own
narrowing of that answer.
"""

from __future__ import annotations

import functools

from .autotune_inputs import REFERENCE_ALGORITHMS
from .candidates import ENGINE_LIMIT_TAG


def candidate_set(applicable, engine_limit: int | None = None) -> str:
    """``'cuda:pool_variants,cudnn:variants[engines<=10]'``: the competing
    rules (``(rule, options)`` pairs) and the function enumerating each one's
    variants, with the engine limit of those that take it (part of the cache
    key, so the same in every process: no object address; a decision tuned
    among 10 engines is not reused for a policy asking for all)."""
    def name(rule) -> str:
        limited = ENGINE_LIMIT_TAG in rule.tags and engine_limit is not None
        return f"{rule.algorithm}:{_stable_name(rule.variants)}" + (f"[engines<={engine_limit}]" if limited else "")
    return ",".join(sorted(name(r) for r, _ in applicable))


def _stable_name(fn) -> str:
    """A function's qualified name; for a ``functools.partial``, the wrapped
    function's with its bound arguments (``variants('forward')``); with
    ``@<revision>`` when the function has a ``revision`` attribute (a kernel
    family that changed how fast it runs bumps it, so the decisions tuned
    against its old kernels are tuned again: ``rules.vector_pool_variants``);
    with ``#<fingerprint>`` when it has a ``fingerprint`` (a zero-argument
    callable: the hash of the code that generates the family's kernels,
    ``backends/cuda/kernel_sources.py``), so an edit of that code has the
    decisions tuned again with no revision bump, their checks (a filled
    input's too) run on the kernels as they are now."""
    if isinstance(fn, functools.partial):
        args = ", ".join([*map(repr, fn.args), *(f"{k}={v!r}" for k, v in sorted(fn.keywords.items()))])
        return f"{_stable_name(fn.func)}({args})"
    name = getattr(fn, "__qualname__", type(fn).__qualname__)
    revision = getattr(fn, "revision", None)
    fingerprint = getattr(fn, "fingerprint", None)
    name = name if revision is None else f"{name}@{revision}"
    return name if fingerprint is None else f"{name}#{fingerprint()}"


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


__all__ = ["contenders", "candidate_set"]
