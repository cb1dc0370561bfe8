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
backends' registries that know these names.
"""

from __future__ import annotations

from opgraph.backends.registry import algorithm_devices, algorithms, opt_in_names, registered_tags
from opgraph.errors import did_you_mean

from .candidates import CONTRACT_TAGS
from .fuse import TABLE
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
    """Refuse an ``include`` / ``exclude`` entry that names nothing.

    Raises:
        PolicyError: names the key, the unknown entry, the close known names
            (did you mean ...) and the known names (:func:`listed_names`).
    """
    known = known_names()
    for key in ("include", "exclude"):
        unknown = sorted(set(getattr(policy, key)) - known)
        if unknown:
            listed = listed_names()
            raise PolicyError(key, unknown[0], f"names no algorithm, rule tag or fusion rule"
                              f"{did_you_mean(unknown[0], listed)}; known: {', '.join(sorted(listed))}")


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
    rules tagged ``optional`` and the generated fusion on the CPU's oracle
    (``fused-reference``) and the opt-in fusion rules (``FusionRule.opt_in``);
    any other name (a rule that is a candidate already, another fusion rule)
    has no effect, which the compile notes."""
    from .fuse import TABLE  # the fusion table imports the policy: read it when asked
    return sorted(set(policy.include) - opt_in_names() - {OPT_IN} - {r.name for r in TABLE if r.opt_in})


__all__ = ["known_names", "listed_names", "check_names", "preferences_elsewhere", "idle_includes"]
