"""The lowering-rule registry: the only backend interface the passes know.

A backend module registers one :class:`Rule` per ``(abstract op type,
algorithm)``. A rule holds

* ``kernel(ctx, op, *arrays) -> array``: runs the abstract ``op`` (its
  parameters) on arrays of ``ctx.xp`` (NumPy or CuPy);
* ``check(op, in_types, device) -> str | None``: ``None`` if the rule applies
  to this node, otherwise the reason it declines (kept for reports);
* ``variants(op, in_types, device) -> list[dict]``: option sets the
  autotuner may time separately (e.g. one per cuDNN engine); default one;
* ``workspace(op, in_types, options) -> int``: scratch bytes of one call.

Backends import this module and nothing else from the passes; passes import
this module and never a backend module.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, Mapping

import attrs

Kernel = Callable[..., Any]


@attrs.frozen
class KernelContext:
    """What a kernel gets beside its op and arrays."""

    xp: ModuleType
    device: str = "cpu"
    options: Mapping[str, Any] = attrs.field(factory=dict)


def _always(op, in_types, device):
    return None


def _one_variant(op, in_types, device):
    return [{}]


def _no_workspace(op, in_types, options):
    return 0


@attrs.frozen
class Rule:
    """How ``algorithm`` implements ``op_type`` on ``devices``."""

    op_type: type
    algorithm: str
    kernel: Kernel
    devices: frozenset = attrs.field(default=frozenset({"cpu", "cuda"}), converter=frozenset)
    check: Callable[..., str | None] = _always
    variants: Callable[..., list] = _one_variant
    workspace: Callable[..., int] = _no_workspace
    tags: frozenset = attrs.field(default=frozenset(), converter=frozenset)

    def __attrs_post_init__(self):
        if getattr(self.op_type, "fused", False):  # the fuse pass's ops (Op.fused)
            object.__setattr__(self, "tags", self.tags | {"fused"})

    def decline_reason(self, op, in_types, device: str) -> str | None:
        """Why this rule cannot run ``op`` on these inputs, or None if it can."""
        if device not in self.devices:
            return f"{self.algorithm} has no {device} implementation"
        return self.check(op, in_types, device)


_RULES: dict[type, dict[str, Rule]] = {}


def register(rule: Rule) -> Rule:
    """Add ``rule``; registering the same (op type, algorithm) twice replaces it."""
    _RULES.setdefault(rule.op_type, {})[rule.algorithm] = rule
    return rule


def rule(op_type: type, algorithm: str, **fields) -> Callable[[Kernel], Kernel]:
    """Decorator form: ``@rule(Conv2d, 'gemm', check=...)`` above a kernel."""

    def deco(kernel: Kernel) -> Kernel:
        register(Rule(op_type, algorithm, kernel, **fields))
        return kernel

    return deco


def rules_for(op_type: type) -> dict[str, Rule]:
    """All rules registered for ``op_type``, by algorithm name."""
    _load_backends()
    return dict(_RULES.get(op_type, {}))


def lookup(op_type: type, algorithm: str) -> Rule:
    """The rule for ``(op_type, algorithm)``.

    Raises:
        KeyError: no such rule is registered.
    """
    rules = rules_for(op_type)
    if algorithm not in rules:
        raise KeyError(f"no {algorithm!r} lowering is registered for {op_type.__name__}"
                       f" (registered: {sorted(rules) or 'none'})")
    return rules[algorithm]


def algorithms() -> set[str]:
    """Every algorithm name some rule uses."""
    _load_backends()
    return {a for rules in _RULES.values() for a in rules}


_loaded = False


def _load_backends() -> None:
    """Import the backend modules once so that they register their rules."""
    global _loaded
    if not _loaded:
        _loaded = True
        import importlib

        importlib.import_module("opgraph.backends")
