"""Where the autotune pass's wall time goes: per node, split into named parts.

A ResNet-50 bf16 compile spent 295 s in autotune on the H200 and nothing
said whether building cuDNN plans, the float64 reference or the timing runs
took it. :class:`NodeClock` splits one node's wall time (``time.perf_counter``,
seconds) into :data:`PARTS`; :class:`TuneClock` collects the nodes of one
pass and sums them (:meth:`TuneClock.summary`, stored as
``LoweringReport.autotune``); :func:`describe` is its one-line form.

GPU work is asynchronous: a part that queues device work and returns before
it finishes would see its time billed to the next part that waits (the
float64 reference's kernels to the first candidate's check). A part opened
with ``settle=True`` waits for the device before it stops its clock, through
the timer's own ``synchronize`` (none on the CPU, where nothing is queued).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator

#: The parts of one node's autotuning, in the order they run:
#: ``inputs`` (random inputs, made consistent), ``reference`` (the float64
#: output), ``variants`` (listing each rule's variants: cuDNN plans are built
#: here; for a cache hit, checking the cached choice still applies),
#: ``check`` (each candidate's first run, output dtype and relative error),
#: ``timing`` (the timer's runs) and ``other`` (the rest: survey, cache key,
#: choosing, Python overhead).
PARTS = ("inputs", "reference", "variants", "check", "timing", "other")


class NodeClock:
    """Wall seconds of one node's autotuning per part of :data:`PARTS`, and
    how many candidates were checked and timed. The clock starts when made;
    :meth:`stop` gives ``other`` the time no part claimed."""

    def __init__(self, settle: Callable[[], None]):
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self.checked = self.timed = 0
        self._settle = settle
        self._started = time.perf_counter()

    @contextmanager
    def part(self, name: str, *, settle: bool = False) -> Iterator[None]:
        """Add the block's wall seconds to part ``name``; with ``settle``, wait
        for the device work the block queued first, so that it counts here
        (module docstring). An exception leaves the block's seconds counted,
        without the wait: a failed kernel's error must not be replaced by the
        wait's."""
        if name not in PARTS:
            raise ValueError(f"autotune clock: unknown part {name!r}; parts: {', '.join(PARTS)}")
        t0 = time.perf_counter()
        try:
            yield
            if settle:
                self._settle()
        finally:
            self.seconds[name] += time.perf_counter() - t0

    def stop(self) -> dict[str, float]:
        """The node's seconds per part (``other``: the wall time since the
        clock started that no part claimed, never negative)."""
        total = time.perf_counter() - self._started
        claimed = sum(s for p, s in self.seconds.items() if p != "other")
        self.seconds["other"] = max(0.0, total - claimed)
        return dict(self.seconds)


class TuneClock:
    """The node clocks of one autotune pass, and their sum.

    ``settle``: waits for queued device work (the timer's ``synchronize``;
    a no-op where the timer has none); ``device``: where the pass ran
    (``'cpu'``, ``'cuda'``; it names what the ``variants`` part built,
    :func:`describe`)."""

    def __init__(self, settle: Callable[[], None] | None = None, device: str | None = None):
        self._settle = settle or (lambda: None)
        self._device = device
        self._started = time.perf_counter()
        self._nodes: list[tuple[str, NodeClock]] = []

    def node(self) -> NodeClock:
        """A new clock for the next node, started now."""
        return NodeClock(self._settle)

    def done(self, clock: NodeClock, outcome: str) -> dict[str, float]:
        """Stop ``clock`` and keep it; ``outcome`` is ``'tuned'``, ``'cache'``
        (a cached decision reused) or ``'untimed'`` (one candidate: nothing to
        time). Returns its seconds per part (for the node's report record)."""
        seconds = clock.stop()
        self._nodes.append((outcome, clock))
        return seconds

    def summary(self) -> dict:
        """The pass's totals, JSON-ready: ``device`` (where it ran; None when
        not told), ``total_s`` (the pass's wall seconds so far), ``seconds``
        (part -> seconds summed over its nodes),
        ``outside_nodes_s`` (the rest: loading and saving the cache, the run
        types), ``nodes_tuned``, ``cache_hits``, ``cache_hit_s`` (the hits'
        seconds, included in ``seconds``), ``nodes_untimed``,
        ``candidates_checked``, ``candidates_timed``."""
        total = time.perf_counter() - self._started
        seconds = {p: sum(c.seconds[p] for _, c in self._nodes) for p in PARTS}
        count = lambda outcome: sum(1 for o, _ in self._nodes if o == outcome)  # noqa: E731
        return {"device": self._device, "total_s": total, "seconds": seconds,
                "outside_nodes_s": max(0.0, total - sum(seconds.values())),
                "nodes_tuned": count("tuned"), "cache_hits": count("cache"),
                "cache_hit_s": sum(sum(c.seconds.values()) for o, c in self._nodes if o == "cache"),
                "nodes_untimed": count("untimed"),
                "candidates_checked": sum(c.checked for _, c in self._nodes),
                "candidates_timed": sum(c.timed for _, c in self._nodes)}


#: What the ``variants`` part builds, by device, for :func:`describe`: cuDNN
#: execution plans on cuda; elsewhere only the variants are listed (a rule's
#: option values), and the line says no more than ``variants``.
VARIANTS_LABEL = {"cuda": "variants (cuDNN plans)"}


def describe(summary: dict) -> str:
    """One line of :meth:`TuneClock.summary`: ``'autotune 295.0 s: inputs 12.0 s,
    reference 40.0 s, variants (cuDNN plans) 180.0 s, ...; 120 nodes tuned
    (2,100 candidates checked, 1,900 timed), 40 cache hits (0.8 s)'``; the
    ``variants`` part is labelled per ``summary['device']``
    (:data:`VARIANTS_LABEL`: cuDNN plans are built on cuda only; a summary
    without a device, recorded before it was kept, gets the plain name); the
    clock that timed the candidates follows the total when the summary names
    it (``summary['clock']``, added by the autotune pass)."""
    label = {"variants": VARIANTS_LABEL.get(summary.get("device"), "variants")}
    parts = [f"{label.get(p, p)} {_duration(summary['seconds'][p])}" for p in PARTS]
    parts.append(f"outside nodes {_duration(summary['outside_nodes_s'])}")
    counts = (f"{summary['nodes_tuned']:,d} nodes tuned ({summary['candidates_checked']:,d} candidates "
              f"checked, {summary['candidates_timed']:,d} timed), {summary['cache_hits']:,d} cache hits "
              "in this run or the file "
              f"({_duration(summary['cache_hit_s'])}), {summary['nodes_untimed']:,d} with one candidate")
    clock = f" ({summary['clock']} clock)" if summary.get("clock") else ""
    return f"autotune {_duration(summary['total_s'])}{clock}: " + ", ".join(parts) + f"; {counts}"


def _duration(seconds: float) -> str:
    """``'295.0 s'``; under 0.1 s in milliseconds (``'4.2 ms'``), so a small
    compile's parts do not all read 0.0 s."""
    return f"{seconds:.1f} s" if seconds >= 0.1 else f"{1e3 * seconds:.1f} ms"


__all__ = ["PARTS", "VARIANTS_LABEL", "NodeClock", "TuneClock", "describe"]
