"""The names a policy's ``include`` / ``exclude`` may hold, and the check that
refuses the others.

A name there is an algorithm (``winograd``), a tag some lowering rule carries
(``fused``, ``gemm``, ``optional``), the name of a fusion rule of the fuse
pass's table (``bn-fold``, ``elementwise``, ``gradient-sum``,
``bn-stats-parts``, ``bn-backward-sums``, ``bn-apply-remat``, ``bn-gradient-remat``:
``passes/fuse.py``) or the opt-in
of the generated fusion on the CPU (``fused-reference``). A typo
(``exclude=["winogard"]``) used to be accepted silently, and Winograd kept
running; ``prefer`` and ``force`` already refused unknown algorithms.

The check runs when a policy is used (``opgraph.compile``, ``opgraph-bench``),
not when it is built: ``passes/policy.py`` sits below the passes and the
backends' registries that know these names. So does the refusal of an
``include`` name that ``exclude`` covers through other names (``fused``
beside ``fused-reference``): exclude would win, and the include do nothing;
the same name in both is refused when the policy is built. A fusion rule's
name is exempt (``include=['pool-scan']`` beside ``exclude=['fused']``): every
fusion rule runs unless excluded, so such an include does nothing whatever
exclude says, and the compile notes that (:func:`idle_include_note`, which
names the exclude that turns it off); ``pool-scan`` and ``relu-bias-sums``
were opt-in until 2026-12-05, and a policy written then still runs. The
fusion rules of ``fuse.OPT_IN_RULES`` (kernels not yet run on a GPU:
``ln-backward-sums``) are the exception: they run only when include names
them.
"""

from __future__ import annotations

from opgraph.backends.registry import (algorithm_devices, algorithms, opt_in_names, registered_rules,
                                       registered_tags)
from opgraph.errors import did_you_mean

from .candidates import CONTRACT_TAGS
from .fuse import OPT_IN_RULES, TABLE
from .fuse_elementwise import OPT_IN
from .policy import LoweringPolicy, PolicyError


def known_names() -> set[str]:
    """Every name ``include`` / ``exclude`` can mean (module docstring)."""
    return algorithms() | registered_tags() | {rule.name for rule in TABLE} | {OPT_IN}


def listed_names() -> set[str]:
    """The names an error about an unknown one lists and suggests:
    :func:`known_names` less the tags that tell the passes how to pad for a
    rule and call it (``candidates.CONTRACT_TAGS``: ``option:precision``,
    ``symmetric_padding_only``, ...), which match as any tag does but name no
    group of rules a user would turn on or off."""
    return known_names() - CONTRACT_TAGS


def check_names(policy: LoweringPolicy) -> None:
    """Refuse an ``include`` / ``exclude`` entry that names nothing, and an
    ``include`` entry that ``exclude`` covers through other names
    (:func:`excluded_include`).

    Raises:
        PolicyError: names the key, the unknown entry, the close known names
            (did you mean ...) and the known names (:func:`listed_names`); or
            both keys, the covering exclude names and the include entry.
    """
    known = known_names()
    for key in ("include", "exclude"):
        unknown = sorted(set(getattr(policy, key)) - known)
        if unknown:
            listed = listed_names()
            raise PolicyError(key, unknown[0], f"names no algorithm, rule tag or fusion rule"
                              f"{did_you_mean(unknown[0], listed)}; known: {', '.join(sorted(listed))}")
    covered = excluded_include(policy)
    if covered:
        name, by, rules = covered
        shown = ", ".join(rules) if len(rules) <= 3 else f"{len(rules)}: {', '.join(rules[:3])}, ..."
        raise PolicyError("exclude", by, f"covers include=[{name!r}]: it turns off every rule {name!r} stands "
                          f"for ({shown}), and exclude would win: a rule may be in one of them")


def _rules_named(name: str) -> dict[str, set[str]]:
    """What ``name`` stands for in ``include`` / ``exclude``, each with the names
    that exclude it: ``'Conv2d gemm'`` (a lowering rule: its algorithm and tags),
    ``'fusion rule pool-scan'`` (a rule of the fuse pass's table: its name, and
    ``fused``, which turns every one off). An algorithm or a tag stands for
    the lowering rules carrying it (and ``fused`` for every fusion rule too),
    a fusion rule's name for that rule, ``fused-reference`` for the fusion
    rules (it lets some of them fuse on the CPU's oracle kernels)."""
    out = {}
    for rule in registered_rules():
        if name == rule.algorithm or name in rule.tags:
            out[f"{rule.op_type.__name__} {rule.algorithm}"] = {rule.algorithm, *rule.tags}
    for rule in TABLE:
        if name in (rule.name, "fused", OPT_IN):
            out[f"fusion rule {rule.name}"] = {rule.name, "fused"}
    return out


def excluded_include(policy: LoweringPolicy) -> tuple[str, list[str], list[str]] | None:
    """The first ``include`` entry every rule of which ``exclude`` turns off
    through other names (``include=['fused-reference']`` beside
    ``exclude=['fused']``, ``include=['gemm']`` beside ``exclude=['im2col']``):
    ``(entry, the exclude names that cover it, its rules)``, or None. Exclude
    wins, so such an include would do nothing; the same name in both is
    refused when the policy is built (``LoweringPolicy``), this when it is
    used, since the names' rules are the registries' (module docstring). An
    include that keeps a rule (``include=['im2col']`` beside
    ``exclude=['gemm']``: ``unfold``) is no contradiction, nor is a fusion
    rule's name, which include never turns on (:func:`idle_include_note`)."""
    exclude = set(policy.exclude)
    if not exclude:
        return None
    fusion_rules = {rule.name for rule in TABLE}  # exempt: such an include does nothing (module docstring)
    for name in sorted(set(policy.include) - fusion_rules):
        covering = _covering_excludes(name, exclude)
        if covering:
            return name, covering, sorted(_rules_named(name))
    return None


def _covering_excludes(name: str, exclude: set[str]) -> list[str]:
    """The ``exclude`` names that together turn off every rule ``name`` stands for
    (:func:`_rules_named`), sorted; empty when ``name`` stands for none, or one of them is left on."""
    hits = [exclude & names for names in _rules_named(name).values()]
    return sorted(set().union(*hits)) if hits and all(hits) else []


def preferences_elsewhere(policy: LoweringPolicy, device: str) -> list[str]:
    """The ``prefer`` entries naming an algorithm without an implementation on
    ``device`` (``conv=unfold`` on the CPU: unfold runs on cuda only), as
    ``'key=algorithm (devices)'``: such an entry can never be a candidate
    there, which the compile notes rather than ignoring it silently."""
    out = []
    for key, names in policy.prefer.items():
        for name in names:
            devices = algorithm_devices(name)
            if devices and device not in devices:
                out.append(f"{key}={name} (runs on {', '.join(sorted(devices))})")
    return out


def idle_includes(policy: LoweringPolicy) -> list[str]:
    """The ``include`` entries that turn nothing on: ``include`` enables the
    rules tagged ``optional`` and the fusion rules on the CPU's oracle
    (``fused-reference``); any other name (a rule that is a candidate
    already, a fusion rule: every one runs unless excluded) has no effect,
    which the compile notes; the fusion rules of ``fuse.OPT_IN_RULES`` run only when named."""
    return sorted(set(policy.include) - opt_in_names() - {OPT_IN} - OPT_IN_RULES)


def idle_include_note(policy: LoweringPolicy) -> str | None:
    """The note on :func:`idle_includes`, or None when there are none: what
    ``include`` turns on (the lowering rules tagged ``optional``; with the
    name ``fused-reference``, not a tag, the fusion rules on the CPU's oracle
    kernels), and for an entry that ``exclude`` turns off through other names
    (a fusion rule's, beside ``exclude=['fused']``: :func:`excluded_include`
    lets it through), which exclude names do. The compile puts it in its
    report's notes, ``opgraph-bench`` in a run's notes."""
    idle = idle_includes(policy)
    if not idle:
        return None
    note = (f"policy include {idle}: no effect: include turns on only the lowering rules tagged 'optional', "
            f"the fusion rules not yet run on a GPU ({', '.join(sorted(OPT_IN_RULES))}) by their names, "
            f"and, by the name {OPT_IN!r}, the fusion rules on the CPU's oracle kernels; every other rule "
            f"runs unless excluded, every fusion rule among them on the GPU (on the CPU's oracle kernels, "
            f"those only with include=[{OPT_IN!r}])")
    exclude = set(policy.exclude)
    for name in idle:
        covering = _covering_excludes(name, exclude)
        if covering:
            note += f"; exclude={covering} turns {name} off"
    return note


__all__ = ["known_names", "listed_names", "check_names", "excluded_include", "preferences_elsewhere", "idle_includes",
           "idle_include_note"]
