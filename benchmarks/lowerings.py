"""The lowerings ``opgraph-bench`` compares: names, their policies, where they apply.

A *lowering* is one column of the benchmark:

* an algorithm registered for the three convolution ops (``gemm``, ``fft``,
  ``winograd``, ``direct``, ``cudnn``, ...): the policy prefers it for every
  convolution node (``prefer = {"conv": [algorithm]}``); a node it declines
  (Winograd on a 5x5 kernel, cuDNN without a GPU) falls back to the device's
  default order, and the report marks that layer with the algorithm's own
  reason (the lower pass keeps every decline in the ``LoweringReport``);
* ``auto``: the autotuning pass (``autotune = true``): every applicable
  candidate of every node is checked and timed, the fastest kept. On cuda
  the ``direct``/``reference`` oracle is left out of its candidates (the
  float64 oracle's code, never the fastest there, and slow to time at model
  sizes); a ``--policy`` file can say otherwise;
* ``default``: the base policy as it is: a ``--policy`` file's or the
  ``--lowering`` policy items' preferences, then the device's default order.
  A run without ``--lowering`` whose ``--policy`` file prefers algorithms for
  the convolutions gets this one column (:func:`policy_file_default`): an
  algorithm column puts its algorithm before the file's preference.

A lowering spec may add a workspace limit, ``<lowering>@ws=<bytes>``
(``cudnn@ws=0``, ``auto@ws=64MiB``; bytes as the policy's
``workspace_limit`` takes them): the same lowering with that scratch budget
per node, as its own column beside the unlimited one (the 2014
convnet-benchmarks discussion asked for cuDNN timed both without extra
memory and with it). The limit replaces the base policy's for that column.

Linear layers and the non-convolution ops get the device's default
implementation in every column.
"""

from __future__ import annotations

import attrs

from opgraph import precision as precisions
from opgraph.backends.registry import lookup, rules_for
from opgraph.errors import did_you_mean
from opgraph.executable import Executable
from opgraph.op import abstract_of
from opgraph.ops import of_family
from opgraph.passes.autotune import UNMATCHED_ENGINE_LIMITS
from opgraph.passes.autotune_hand_edit import USED as USED_EDIT
from opgraph.passes.compiler import ENGINE_LIMITS_IDLE, NEVER_A_CANDIDATE
from opgraph.passes.candidates import decline_reason, policy_options, storage_dtype
from opgraph.passes.compiler import precision_applied  # re-exported: the driver records it
from opgraph.passes.policy import LoweringPolicy, parse_bytes

from .protocol import TrainingGraph
from .records import WARNING_NOTE

#: The convolution ops a lowering is an algorithm of (the ops of family
#: ``conv``, less the fuse pass's: a compiled graph's fused
#: ``Conv2dBiasRelu`` runs its convolution's algorithm).
CONV_TYPES = tuple(t for t in of_family("conv") if not t.fused)
SPECIAL = {
    "auto": "autotune: every applicable candidate of each node checked and timed, fastest kept",
    "default": "the base policy as it is: its preferences (a --policy file's, --lowering's items), "
               "then the device's default order",
}
#: Algorithms that are other names of one already listed (not a column of their own by default).
ALIASES = {"reference": "direct"}
#: Algorithms that are no column of their own by default either: ``fft-chunked`` takes only the
#: nodes whose weight and result spectra are large (``fft.CHUNKED_FROM``), the ``cuda`` kernels only
#: depthwise convolutions (the forward of stride 1); elsewhere their columns would time their
#: fallbacks. ``auto`` times them where they apply, ``--lowering fft-chunked`` or ``cuda`` asks for one.
PARTIAL = ("fft-chunked", "cuda")
#: Lowerings a CPU run gets without --lowering (see driver.CPU_DEFAULT_NOTE for why).
CPU_DEFAULT = ("gemm",)
#: Left out of autotune's candidates on cuda (module docstring). A tag: the two
#: convolution oracle rules carry it, the reference rules of the other ops
#: (their only implementation for some, e.g. Flatten, Concat) do not.
AUTO_EXCLUDE_CUDA = ("direct",)


def conv_algorithms() -> list[str]:
    """Algorithms registered for all three convolution ops, sorted."""
    sets = [set(rules_for(t)) for t in CONV_TYPES]
    return sorted(set.intersection(*sets))


#: The option of a lowering spec: ``<lowering>@ws=<bytes>`` (module docstring).
WORKSPACE_OPTION = "ws"


@attrs.frozen
class Lowering:
    """One benchmark column: ``name`` (the spec as written, ``'cudnn'`` or
    ``'cudnn@ws=0'``), its ``workspace_limit`` in bytes (None: the base
    policy's), and how it sets the policy."""

    name: str
    workspace_limit: int | None = None

    @property
    def base(self) -> str:
        """The lowering without its options: ``'cudnn'`` for ``'cudnn@ws=0'``."""
        return self.name.split("@", 1)[0]

    @property
    def algorithm(self) -> str | None:
        """The convolution algorithm it prefers; None for ``auto``/``default``."""
        return None if self.base in SPECIAL else self.base

    @property
    def autotune(self) -> bool:
        return self.base == "auto"

    def policy_note(self, policy: LoweringPolicy) -> str | None:
        """What a record of this column says when its ``policy`` (from
        :meth:`policy`) autotunes although the column names one algorithm (a
        ``--policy`` file with ``autotune = true``): its choices are then
        autotune's among every candidate, not that algorithm's alone."""
        if self.algorithm is None or not policy.autotune:
            return None
        return (f"{self.name}: the policy's autotune = true times every candidate, {self.algorithm} first in "
                f"order: this column's choices are autotune's, not {self.algorithm}'s alone")

    def describe(self) -> str:
        text = SPECIAL.get(self.base, f"{self.base} preferred for every convolution node where it "
                                      "applies, the device default elsewhere")
        if self.workspace_limit is not None:
            text += f"; workspace limit {self.workspace_limit} bytes per node"
        return text

    def policy(self, base: LoweringPolicy, device: str) -> LoweringPolicy:
        """``base`` (precision, layout, workspace limit, a --policy file) with
        this column's choice on top (its own workspace limit replaces base's)."""
        if self.workspace_limit is not None:
            base = attrs.evolve(base, workspace_limit=self.workspace_limit)
        if self.base == "default":
            return base
        if self.autotune:
            exclude = set(base.exclude)
            if device == "cuda" and not (set(AUTO_EXCLUDE_CUDA) & set(base.include)):
                exclude |= set(AUTO_EXCLUDE_CUDA)
            return attrs.evolve(base, autotune=True, exclude=exclude)
        prefer = {k: list(v) for k, v in base.prefer.items()}
        prefer["conv"] = [self.base] + [a for a in prefer.get("conv", []) if a != self.base]
        return attrs.evolve(base, prefer=prefer)


def parse_lowering(spec: str) -> Lowering:
    """One lowering spec: a name (case-insensitive), optionally with a workspace
    limit, ``'cudnn@ws=0'``, ``'auto@ws=64MiB'`` (module docstring).

    Raises:
        ValueError: an unknown name or option, or a limit the policy's byte
            parser refuses (the message names the spec).
    """
    base, _, options = spec.strip().partition("@")
    name = base.strip().lower()
    known = conv_algorithms()
    if name not in known and name not in SPECIAL:
        partial = sorted(t.__name__ for t in CONV_TYPES if name in rules_for(t))
        if partial:  # registered for some directions only (the depthwise 'cuda' kernels, 'unfold')
            raise ValueError(f"lowering {base.strip()!r} runs only {', '.join(partial)} of the convolution ops, so it "
                             f"cannot be a column of its own; prefer it (conv={name}) or force it on a node "
                             f"(@NODE={name}), or let auto time it")
        raise ValueError(f"unknown lowering {base.strip()!r}{did_you_mean(name, [*known, *SPECIAL])}; choose "
                         f"from {', '.join(known)} (the convolution algorithms registered) or {', '.join(SPECIAL)}")
    if not options:
        return Lowering(name)
    key, eq, value = options.partition("=")
    if key.strip().lower() != WORKSPACE_OPTION or not eq:
        raise ValueError(f"lowering {spec.strip()!r}: unknown option {options!r}; the one option is "
                         f"@{WORKSPACE_OPTION}=BYTES, a workspace limit (cudnn@ws=0, auto@ws=64MiB)")
    try:
        limit = parse_bytes(value.strip(), key=WORKSPACE_OPTION)
    except (ValueError, OverflowError) as e:  # PolicyError is a ValueError
        # the policy's error says "parameter ws='abc': ..." too: its reason alone, the spec named once
        why = getattr(e, "why", None) or str(e)
        raise ValueError(f"lowering {spec.strip()!r}: the workspace limit {why}") from None
    if limit is None:
        raise ValueError(f"lowering {spec.strip()!r}: @{WORKSPACE_OPTION}= needs a byte count "
                         f"(leave the option out for no limit)")
    return Lowering(f"{name}@{WORKSPACE_OPTION}={value.strip()}", limit)


def parse_lowerings(text: str) -> list[Lowering]:
    """``'gemm,fft,auto,cudnn@ws=0'`` -> lowerings (:func:`parse_lowering`), in
    order, duplicates (same lowering, same limit) dropped.

    Raises:
        ValueError: an empty list, an unknown name (the message lists the
            known ones) or a bad option.
    """
    out: list[Lowering] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        lowering = parse_lowering(part)
        if all((lo.base, lo.workspace_limit) != (lowering.base, lowering.workspace_limit) for lo in out):
            out.append(lowering)
    if not out:
        raise ValueError("no lowering given")
    return out


def default_lowerings(device: str) -> list[Lowering]:
    """Every convolution algorithm with an implementation on ``device`` (aliases
    once) plus ``auto`` on a GPU; :data:`CPU_DEFAULT` on the CPU."""
    if device == "cpu":
        return [Lowering(n) for n in CPU_DEFAULT]
    names = [a for a in conv_algorithms() if a not in ALIASES and a not in PARTIAL
             and all(device in rules_for(t)[a].devices for t in CONV_TYPES)]
    first = [n for n in ("cudnn", "gemm", "fft", "winograd") if n in names]
    return [Lowering(n) for n in first + [n for n in names if n not in first]] + [Lowering("auto")]


def conv_preference(policy: LoweringPolicy) -> str | None:
    """What ``policy``'s ``prefer`` says of the convolution ops, for a note:
    ``'fft, gemm'`` when every direction has that order, else each order with
    the ops it covers (``'fft, gemm (Conv2d, Conv2dBackwardData); gemm, fft
    (Conv2dBackwardFilter)'``); None when it prefers nothing for them."""
    orders: dict[tuple, list[str]] = {}
    for t in CONV_TYPES:
        orders.setdefault(policy.preferred(t.__name__), []).append(t.__name__)
    if set(orders) == {()}:
        return None
    if len(orders) == 1:
        return ", ".join(next(iter(orders)))
    return "; ".join(f"{', '.join(order) or 'none'} ({', '.join(types)})" for order, types in orders.items())


def policy_file_default(policy_file: str | None, device: str = "cpu") -> tuple[list[Lowering], str] | None:
    """The lowerings of a run without ``--lowering`` whose ``--policy`` file
    prefers algorithms for the convolutions, and the note saying so: the column
    ``default``, the file's policy as it is (an algorithm column, as the
    device's default columns are, would put its own algorithm before the file's
    preference: a user who wrote ``conv = ["fft", "gemm"]`` ran no FFT), and on
    a GPU ``auto`` too, as the default GPU run has it (autotune times every
    candidate whatever the order, and the autotune flags need a column that
    tunes). None without a file or a convolution preference in it.

    Raises:
        PolicyError: the file cannot be read or is invalid (``--policy`` named).
    """
    if not policy_file:
        return None
    preference = conv_preference(LoweringPolicy.from_toml(policy_file, flag="--policy"))
    if preference is None:
        return None
    tuned = [Lowering("auto")] if device == "cuda" else []
    return [Lowering("default"), *tuned], (
        f"--policy {policy_file} prefers {preference} for the convolutions: without --lowering the "
        f"lowerings are default, that policy as it is{', and auto' if tuned else ''} (an algorithm "
        "column such as gemm would put its algorithm first; --lowering default,gemm,fft times each)")


def displaced_preference(lowerings, base: LoweringPolicy, device: str) -> str | None:
    """A note when some of ``lowerings`` (columns naming an algorithm) put it
    before the convolution preference of ``base`` (a ``--policy`` file's or
    the ``--lowering`` policy items'), so that the column does not run what
    the preference says first; None when no column does."""
    preference = conv_preference(base)
    if preference is None:
        return None
    names = [lo.name for lo in lowerings if lo.algorithm is not None and any(
        base.preferred(t.__name__) and lo.policy(base, device).preferred(t.__name__)[0]
        != base.preferred(t.__name__)[0] for t in CONV_TYPES)]
    if not names:
        return None
    return (f"the policy prefers {preference} for the convolutions; column(s) {', '.join(names)} put their "
            "own algorithm first, as an algorithm column does (the column default follows the policy as it is)")


def unused_autotune_flags(flags: dict, lowerings, base: LoweringPolicy, device: str) -> str | None:
    """Why flags that only steer autotune (``flags``: flag name -> value, None
    when not given, e.g. ``{'--engine-limit': '3'}``) would be silently
    ignored: none of ``lowerings`` autotunes under ``base`` on ``device``;
    None when a column autotunes or no such flag was given."""
    given = [flag for flag, value in flags.items() if value is not None]
    if not given or any(lo.policy(base, device).autotune for lo in lowerings):
        return None
    names = ", ".join(lo.name for lo in lowerings)
    return (f"{' and '.join(given)} only steer{'s' if len(given) == 1 else ''} autotune, and no column "
            f"autotunes (lowerings: {names}); add auto to --lowering")


def conv_nodes(tg: TrainingGraph):
    """The convolution nodes (forward and backward) of the abstract training graph."""
    for node in tg.model.graph.nodes_in_order(tg.outputs):
        if node.op.family == "conv":
            yield node


def applicability(tg: TrainingGraph, lowering: Lowering, device: str,
                  policy: LoweringPolicy) -> dict[str, str | None]:
    """Convolution node name -> why ``lowering``'s algorithm cannot run it on
    ``device`` (None where it can), asked of the rule as the lower pass asks it
    (explicit padding counted as possible: the legalize pass adds it).
    Empty for ``auto``/``default``, which always apply."""
    algo = lowering.algorithm
    if algo is None:
        return {}
    out = {}
    for node in conv_nodes(tg):
        rule = lookup(type(node.op), algo)
        # the lowering's own policy may exclude its algorithm ('gemm,exclude=gemm'): then it runs nowhere
        out[node.name] = policy.exclusion(rule.algorithm, rule.tags) or decline_reason(
            rule, node.op, node.input_types, device, policy,
            policy_options(rule, policy, storage_dtype(node.input_types)), padded_ok=True)
    return out


def not_applicable(exe: Executable, lowering: Lowering) -> dict[str, str]:
    """Step name -> reason, for each convolution step of ``exe`` that did not get
    ``lowering``'s algorithm (the decline the lower pass recorded)."""
    algo = lowering.algorithm
    if algo is None:
        return {}
    report = getattr(exe, "report", None)
    nodes = getattr(report, "nodes", {}) or {}
    out = {}
    for st in exe.steps:
        if st.op.family == "conv" and st.op.algorithm != algo:
            rec = nodes.get(st.name)
            why = rec.declined.get(algo) if rec is not None else None
            out[st.name] = why or f"ran {st.op.algorithm} (no reason recorded)"
    return out


def algorithm_counts(exe: Executable) -> dict[str, dict[str, int]]:
    """Abstract op name -> algorithm -> number of steps, for the convolution,
    linear and matmul steps (what a column actually ran)."""
    out: dict[str, dict[str, int]] = {}
    for st in exe.steps:
        name = abstract_of(st.op).name
        if st.op.family in ("conv", "linear"):
            d = out.setdefault(name, {})
            d[st.op.algorithm] = d.get(st.op.algorithm, 0) + 1
    return out


def inapplicable(tg: TrainingGraph, lowering: "Lowering", device: str, policy: LoweringPolicy) -> str | None:
    """Why ``lowering`` (under its ``policy``) runs no convolution of ``tg``'s
    model, or None: its column (or profile) would only repeat the fallback."""
    app = applicability(tg, lowering, device, policy)
    if not app or any(why is None for why in app.values()):
        return None
    reasons = sorted(set(app.values()))
    return (f"{lowering.name} applies to no convolution of {tg.model.key}: " + "; ".join(reasons[:3])
            + (" ..." if len(reasons) > 3 else ""))


#: the compile's notes a record or a profile repeats, by what they say: the
#: memory-aware re-choice (what ``peak_tolerance`` changed), a policy key
#: only autotune reads, set while autotune is off (``passes/compiler.py``),
#: the engine limits' notes (an ``engine_limits`` key naming no node, ``passes/autotune.py``: its
#: warning alone would leave a record reading as if the named node's engines were all
#: timed; no effect on a device without cuDNN, ``passes/compiler.py``),
#: and a cached choice edited by hand that the compile used (``passes/autotune_hand_edit.py``:
#: it raises no warning, and the column times it, perhaps 200x slower than the measurements' choice),
#: and a ``prefer`` entry the device has no kernel of (``--lowering gemm,LayerNorm=codegen`` on the CPU
#: said only "applied to every column"; an include that turns nothing on is said in the run's notes)
_REPEATED_NOTES = ("chosen again for the memory peak", "only autotune reads", ENGINE_LIMITS_IDLE, UNMATCHED_ENGINE_LIMITS,
                   USED_EDIT, NEVER_A_CANDIDATE)


def requested_notes(exe: Executable, precision: str, layout: str, dtype: str, noted=()) -> list[str]:
    """Notes for what a compile was asked and did not do: a ``precision`` no
    kernel took (the CPU's oracle and generated kernels take none) and an
    NHWC ``layout`` the layout pass kept NCHW (its note), so that neither
    shows as applied in a record or a profile; and the compile's notes on
    the memory-aware re-choice and on autotune keys without effect, but for
    those that its warnings already put in ``noted`` (``records.warnings_noted``:
    ``'warning: '`` and the same words; an unmatched ``engine_limits`` key is both)."""
    notes = list(filter(None, [precisions.unapplied_note(precision, precision_applied(exe), dtype, exe.device)]))
    if layout != "NCHW":
        notes += [n for n in exe.report.notes if n.startswith("layout:")]
    notes += [n for n in exe.report.notes if any(k in n for k in _REPEATED_NOTES) and WARNING_NOTE + n not in noted]
    return notes


__all__ = ["conv_preference", "policy_file_default", "displaced_preference", "inapplicable", "requested_notes", "Lowering", "SPECIAL", "unused_autotune_flags", "CPU_DEFAULT", "WORKSPACE_OPTION", "conv_algorithms", "parse_lowering",
           "parse_lowerings",
           "default_lowerings", "conv_nodes", "applicability", "not_applicable",
           "algorithm_counts", "precision_applied"]
