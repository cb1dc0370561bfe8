"""The lowering report: what every pass decided, per node, and why.

``opgraph.compile`` returns an ``Executable`` whose ``.report`` is a
:class:`LoweringReport`. Passes append to it through the ``PassContext``:

* the lower pass records, per node, the candidate order it tried, every
  candidate that declined with its reason, and the implementation chosen
  (and how: ``policy``, ``forced``, ``autotune``, ``cache``); the text
  table ends with the number of steps per algorithm (``codegen``: the
  generated memory-bound kernels, ``reference``: the oracle);
* the autotune pass adds one :class:`Candidate` row per (algorithm, variant)
  with its time (ms), workspace (bytes), relative error and status, the
  seconds it spent on each node by part, and their sum over the compile
  (``passes/autotune_clock.py``);
* legalize, fuse and layout add notes; memory adds the planned peak bytes;
* the pipeline adds the wall time of each pass.

Everything is plain data (``to_dict`` is JSON-ready) so the benchmark driver
can store it beside its timings.
"""

from __future__ import annotations

from typing import Any

import attrs

from .autotune_clock import describe as describe_autotune

#: Candidate statuses, in the order a table lists them.
STATUSES = ("chosen", "ok", "wrong", "failed", "over budget", "declined", "excluded", "unverified")


def format_size(nbytes: int, *alongside: int) -> str:
    """``'290.0 MiB'``; under 0.1 MiB, ``'4,096 B'`` (as the autotune rows' reasons write bytes).
    ``alongside``: the other sizes of the same sentence, which decide the unit with ``nbytes``:
    one sentence never mixes ``0.1 MiB`` and ``68,164 B``, and writes bytes where two different
    sizes would read the same in MiB."""
    sizes = {nbytes, *alongside}
    in_mib = {f"{n / 2**20:.1f}" for n in sizes}
    if max(sizes) >= 2**20 / 10 and len(in_mib) == len(sizes):
        return f"{nbytes / 2**20:.1f} MiB"
    return f"{nbytes:,d} B"


@attrs.define
class Candidate:
    """One (algorithm, options) the autotuner considered for a node.

    Attributes:
        status: one of :data:`STATUSES`. ``wrong``: relative error above
            ``tolerance`` (or NaN); ``failed``: the kernel raised; ``over
            budget``: workspace above the policy's limit; ``declined``: the
            rule's ``check`` refused the node; ``unverified``: timed, but no
            reference rule exists for the op to check it against.
        time_ms / min_ms: median / minimum of the timed repeats, milliseconds.
        workspace: scratch bytes the rule declares for one call.
        rel_error: ``||out - ref|| / ||ref||`` against the float64 reference.
        reason: why it was not chosen (declines, exceptions, errors); on
            the chosen row, why it beat a faster one (``workspace_tolerance``
            or ``peak_tolerance``, see ``passes.autotune_choice.choose``).
    """

    algorithm: str
    options: dict = attrs.field(factory=dict)
    status: str = "ok"
    time_ms: float | None = None
    min_ms: float | None = None
    workspace: int | None = None
    rel_error: float | None = None
    tolerance: float | None = None
    reason: str = ""

    @property
    def label(self) -> str:
        """``winograd[tile=2]``: algorithm and options, as in reports and timers."""
        extra = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return f"{self.algorithm}[{extra}]" if extra else self.algorithm

    def to_dict(self) -> dict:
        return attrs.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Candidate":
        names = {f.name for f in attrs.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@attrs.define
class NodeReport:
    """Lowering decisions for one node.

    Attributes:
        how: ``policy`` (first accepting rule in policy order), ``forced``
            (``policy.force``), ``autotune`` (timed now), ``cache`` (autotune
            decision read from the cache).
        order: algorithms tried, in order.
        declined: algorithm -> reason, for every candidate that could not run
            the node (exclusions by the policy included).
        absorbed: for a node the fuse pass made, the name -> abstract op
            type of each node it absorbed (``passes/pattern.py``).
        buffer: how the executable runs the step when its output is a view
            (``[zero-copy: ...]``, ``opgraph/buffer_views.py``), else ''.
        tune_seconds: the autotune pass's wall seconds on this node per part
            (``inputs``, ``reference``, ``variants``, ``check``, ``timing``,
            ``other``: ``passes.autotune_clock.PARTS``); empty when the pass
            did not look at it (no autotune, a forced node).
    """

    node: int
    name: str
    op: str
    op_type: str
    order: list[str] = attrs.field(factory=list)
    declined: dict[str, str] = attrs.field(factory=dict)
    algorithm: str | None = None
    options: dict = attrs.field(factory=dict)
    chosen: str | None = None
    how: str = "policy"
    workspace: int = 0
    candidates: list[Candidate] = attrs.field(factory=list)
    cache_key: str | None = None
    absorbed: dict[str, str] = attrs.field(factory=dict)
    buffer: str = ""
    tune_seconds: dict[str, float] = attrs.field(factory=dict)

    def to_dict(self) -> dict:
        d = attrs.asdict(self, recurse=False)
        d["absorbed"] = dict(self.absorbed)
        d["tune_seconds"] = dict(self.tune_seconds)
        d["candidates"] = [c.to_dict() for c in self.candidates]
        return d


def describe_fusion(fusion: dict) -> str:
    """``'bn-backward-sums 121, elementwise 312 (2 declined); opt_in: pool-argmax; excluded:
    dgrad-relu'``: the fusion rules of ``fusion`` (``LoweringReport.fusion``) that matched
    something, with how many rewrites (and declined matches: ``dgrad-relu 0 (50 declined)``),
    then those that left nodes on the CPU's oracle kernels alone for want of
    ``include=['fused-reference']`` (``'opt_in': True``, the word the JSON record uses), then
    those the policy excluded; '' when no rule matched, waited or was excluded."""
    applied = [f"{k} {v['applied']}" + (f" ({v['declined']} declined)" if v.get("declined") else "")
               for k, v in fusion.items() if v.get("applied") or v.get("declined")]
    opt_in = [k for k, v in fusion.items() if v.get("opt_in")]
    excluded = [k for k, v in fusion.items() if v.get("excluded")]
    return "; ".join(filter(None, [", ".join(applied), opt_in and f"opt_in: {', '.join(opt_in)}",
                                   excluded and f"excluded: {', '.join(excluded)}"]))


@attrs.define
class LoweringReport:
    """Everything the pipeline decided for one compile.

    Attributes:
        nodes: node name -> :class:`NodeReport` (schedule order).
        passes: ``(pass name, seconds)`` in run order.
        memory: planned memory of the schedule (see ``passes/memory.py``).
        notes: free-form lines from legalize, fuse, layout and the policy.
        autotune: where the autotune pass's wall time went
            (``passes.autotune_clock.TuneClock.summary``: seconds per part,
            nodes tuned, cache hits, candidates checked and timed), the
            ``clock``, the cache file (``cache_path``, None when the cache
            is off) and ``file_hits``, the cache hits on decisions read from
            that file rather than made by this compile; empty without
            autotune.
        fusion: what the fuse pass's table did, per rule name in table
            order: ``{'applied': rewrites made, 'declined': matches whose
            rewrite declined}`` (with ``'opt_in': True`` where the rule left
            nodes on the CPU's oracle kernels alone for want of
            ``include=['fused-reference']``, which :func:`describe_fusion` lists as
            ``opt_in: RULE, ...``), or ``{'excluded': True}`` for a
            rule the policy turned off; empty when no fuse pass ran.
    """

    device: str = "cpu"
    pipeline: str = ""
    policy: dict = attrs.field(factory=dict)
    nodes: dict[str, NodeReport] = attrs.field(factory=dict)
    passes: list[tuple[str, float]] = attrs.field(factory=list)
    memory: dict[str, Any] = attrs.field(factory=dict)
    notes: list[str] = attrs.field(factory=list)
    autotune: dict[str, Any] = attrs.field(factory=dict)
    fusion: dict[str, dict] = attrs.field(factory=dict)

    def node(self, name: str) -> NodeReport:
        """The record of node ``name``.

        Raises:
            KeyError: no node of that name was lowered.
        """
        try:
            return self.nodes[name]
        except KeyError:
            raise KeyError(f"no lowering record for node {name!r}; "
                           f"recorded: {sorted(self.nodes)}") from None

    def record(self, rec: NodeReport) -> NodeReport:
        self.nodes[rec.name] = rec
        return rec

    def note(self, line: str) -> None:
        self.notes.append(line)

    @property
    def choices(self) -> dict[str, str]:
        """Node name -> chosen implementation (``Lowered.describe()``)."""
        return {n: r.chosen for n, r in self.nodes.items() if r.chosen is not None}

    def by_algorithm(self) -> dict[str, int]:
        """Algorithm -> how many nodes it runs (``codegen``: generated kernels;
        ``reference``: the oracle), most used first."""
        counts: dict[str, int] = {}
        for r in self.nodes.values():
            if r.algorithm is not None:
                counts[r.algorithm] = counts.get(r.algorithm, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def fallbacks(self) -> dict[str, dict[str, str]]:
        """Nodes not given the first algorithm of their order, with the reasons
        of the algorithms before the chosen one (what a benchmark of one
        lowering shows as "not applicable")."""
        out = {}
        for name, r in self.nodes.items():
            if r.how == "policy" and r.order and r.algorithm != r.order[0]:
                before = r.order[:r.order.index(r.algorithm)] if r.algorithm in r.order else r.order
                out[name] = {a: r.declined.get(a, "not tried") for a in before}
        return out

    def to_dict(self) -> dict:
        return {"device": self.device, "pipeline": self.pipeline, "policy": self.policy,
                "nodes": {n: r.to_dict() for n, r in self.nodes.items()},
                "passes": [list(p) for p in self.passes], "memory": dict(self.memory),
                "notes": list(self.notes), "autotune": dict(self.autotune),
                "fusion": {k: dict(v) for k, v in self.fusion.items()}}

    def fusion_summary(self) -> str:
        """:func:`describe_fusion` of :attr:`fusion`."""
        return describe_fusion(self.fusion)

    def format(self, verbose: bool = False) -> str:
        """A text table: one line per node (name, chosen implementation, how),
        the nodes a fused node absorbed under it; declined reasons and autotune rows under each node when ``verbose`` or
        when the node was autotuned."""
        width = max((len(n) for n in self.nodes), default=4)
        lines = [f"lowering for {self.device} (pipeline {self.pipeline or '?'})"]
        for name, r in self.nodes.items():
            lines.append(f"{name:<{width}}  {r.chosen or '-'}  [{r.how}]" + (f"  [{r.buffer}]" if r.buffer else ""))
            if r.absorbed:
                lines.append(f"{'':<{width}}    absorbed: " + ", ".join(f"{n} ({t})" for n, t in r.absorbed.items()))
            if verbose:
                lines += [f"{'':<{width}}    {a}: declined: {why}" for a, why in r.declined.items()]
            if r.candidates and (verbose or r.how in ("autotune", "cache")):
                lines += [f"{'':<{width}}    {_candidate_line(c)}" for c in r.candidates]
        if self.nodes:
            lines.append("steps per algorithm: " + ", ".join(f"{a} {n}" for a, n in self.by_algorithm().items()))
        if self.memory:
            lines.append("memory: " + ", ".join(f"{k}={v}" for k, v in self.memory.items()
                                                 if not isinstance(v, (dict, list))))
        if self.passes:
            lines.append("passes: " + ", ".join(f"{n} {1e3 * s:.1f} ms" for n, s in self.passes))
        if self.autotune:
            lines.append(describe_autotune(self.autotune))
        if self.fusion_summary():
            lines.append(f"fusion rules: {self.fusion_summary()}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()

    def __call__(self, verbose: bool = False) -> str:
        """``exe.report()`` keeps working: the text table (``Executable.report``
        was a method returning it before the report became this object)."""
        return self.format(verbose)


def _candidate_line(c: Candidate) -> str:
    parts = [f"{c.label:<20}", f"{c.status:<11}"]
    parts.append(f"{c.time_ms:9.3f} ms" if c.time_ms is not None else f"{'-':>12}")
    parts.append(f"ws {c.workspace:>12,d} B" if c.workspace is not None else f"ws {'-':>12}  ")
    parts.append(f"err {c.rel_error:.2e}" if c.rel_error is not None else "err    -    ")
    if c.reason:
        parts.append(c.reason)
    return "  ".join(parts)


__all__ = ["Candidate", "NodeReport", "LoweringReport", "STATUSES", "describe_fusion", "format_size"]
