"""Where a training step's time goes, per op type and direction, against the
machine's own limits (``opgraph-bench --profile``; issue 16, section 6).

For one model, lowering, dtype and layout, the benchmark's training graph
(:func:`.protocol.training_graph`: forward, parameter gradients, the model
output as its own output gradient) is compiled, run once keeping every
value, and every step is timed alone on those values, out of place,
``--warmup`` then ``--repeat`` calls, the median (:mod:`.step_clock`):

* on a GPU, as a **CUDA-graph replay of that step alone** (device time,
  CUDA events; a short step captured as several calls of itself so that
  the graph's launch is shared), the time it costs inside the ``+graph``
  column's graphs; a step that cannot be captured (a cuBLAS call through
  CuPy, a declared blocker) is called eagerly from Python and marked
  (``timed: 'eager'`` and ``eager_reason`` on its node; the record's
  ``timing`` counts both kinds);
* on the CPU, called from Python between ``perf_counter`` readings.

Per step:

* **bytes**: every input read once plus the output written once, from the
  node's shapes and storage dtype (a reshape counts as the copy it would be;
  a kernel that reads a tensor twice still counts once: this is the traffic
  a perfect kernel would need); a zero-copy step (``Step.view``,
  ``opgraph/buffer_views.py``: a ``Slice`` returning a view, a ``Concat``
  whose inputs were written in place) moves only what it copies, and one
  that copies nothing is of kind ``view``, judged against no limit (counted
  as a copy, GoogLeNet's concats read 500x the copy bandwidth);
* **FLOPs**: ``Op.flops`` (a multiply-add is 2; backward-data and
  backward-filter count the layer's forward FLOPs; data movement 0);
* **achieved** GB/s (10^9 bytes / s) and TFLOP/s;
* **fraction of the limit**: convolutions and GEMMs (families ``conv`` and
  ``linear``) are compute-bound, judged against the matrix-multiply peak of
  the run's precision; every other step is memory-bound, judged against the
  copy bandwidth. Both are measured in the same run
  (:func:`.peak.measure_peaks`, :func:`opgraph.backends.copy_bandwidth.measure_copy_bandwidth`).

Steps are grouped by abstract op type and direction: ``fprop`` / ``dgrad`` /
``wgrad`` for the compute-bound families (the phase of the benchmark's
schedule: forward, backward-data, backward-filter), ``forward`` /
``backward`` for the others. The whole step (every step in order) is timed
twice beside the sum of the steps alone: as one loop of eager calls
(``step_ms``; minus the sum, the dispatch the device could not hide) and,
on a GPU, replayed as CUDA graphs (``graph_step_ms``; minus the sum, the
gaps between kernels and what a step alone measures differently).

Schema version 3 (this one): a node's ``kind`` may be ``view`` and a
zero-copy step's ``bytes`` count what it copies; version 2 counted every
concat and slice as a copy. Since version 2, on a GPU a node's ``ms`` (and
``nodes_ms``) is graph-timed where the step captures; version 1 timed every
step eagerly.
"""

from __future__ import annotations

from collections import defaultdict

import attrs
import numpy as np

import opgraph as og
from opgraph.backends import device as dev
from opgraph.backends.copy_bandwidth import measure_copy_bandwidth
from opgraph.buffer_views import AssembleConcat, SliceView
from opgraph.executable import run_step
from opgraph.op import abstract_of
from opgraph.passes.policy import LoweringPolicy
from opgraph.types import numpy_dtype

from .peak import measure_peaks
from .lowerings import requested_notes
from .protocol import applied_layout, random_feeds, schedule
from .records import warnings_noted
from .step_clock import median_ms, step_clock, timing_summary
from .tables import cache_note


#: Families whose steps are compute-bound (judged against the matmul peak).
COMPUTE_FAMILIES = ("conv", "linear")
#: Benchmark phase -> direction of a compute-bound step.
COMPUTE_DIRECTIONS = {"forward": "fprop", "backward_data": "dgrad", "backward_filter": "wgrad"}
#: Version of the JSON document (:func:`profile_document`).
PROFILE_SCHEMA_VERSION = 3
#: A step whose time in place is above this multiple of its autotuned median
#: (and above it by more than :data:`SLOWER_FLOOR_MS`) is listed in
#: ``slower_than_tuned``: GoogLeNet's fp32 NCHW forward convolutions ran
#: 2.6 ms where autotune had timed 0.44 (their output strides changed after
#: tuning), unseen from the sixth session to the fifteenth.
SLOWER_FACTOR = 1.5
SLOWER_FLOOR_MS = 0.01


def tensor_bytes(t) -> int:
    """Bytes of a ``TensorType`` in its storage dtype (``ml_dtypes`` for bfloat16)."""
    return int(np.prod(t.shape, dtype=np.int64)) * np.dtype(numpy_dtype(t.dtype)).itemsize


def step_traffic(graph, node: int) -> tuple[int, int]:
    """``(bytes moved, FLOPs)`` of a lowered node: its inputs read and its output
    written once (module docstring; an input the op takes for its type only,
    ``Op.unread_inputs``, is not read; an op that reads part of an input says
    what it moves, ``Op.bytes_moved``), and ``Op.flops`` of its types."""
    view = graph.node(node)
    types = tuple(view.input_types)
    op = abstract_of(view.op)
    moved = op.bytes_moved(types, view.type)
    if moved is None:
        moved = sum(tensor_bytes(t) for k, t in enumerate(types) if k not in op.unread_inputs) \
            + tensor_bytes(view.type)
    return moved, int(view.op.flops(types, view.type))


def view_traffic(graph, st) -> int | None:
    """Bytes a zero-copy step moves (module docstring), or None for a step
    that runs its kernel (``st.view`` None, or a producer writing into its
    slice of a concat: :func:`step_traffic` counts it). A ``Slice`` view moves
    nothing; a concat reads and writes each input it copies (the others were
    written in place)."""
    if isinstance(st.view, SliceView):
        return 0
    if isinstance(st.view, AssembleConcat):
        types = graph.node(st.node).input_types
        return sum(2 * tensor_bytes(types[pos]) for pos, *_ in st.view.copies)
    return None


def tuned_ms(report, name: str) -> float | None:
    """The median autotune measured for node ``name``'s chosen candidate
    (timed, or read from the cache), or None."""
    rec = report.nodes.get(name)
    chosen = next((c for c in rec.candidates if c.status == "chosen"), None) if rec is not None else None
    return chosen.time_ms if chosen is not None else None


def profile_cache_note(autotune: dict | None) -> str | None:
    """:func:`.tables.cache_note` in a profile's words: the ``tuned_ms`` of a
    choice read from the cache file were timed by the run that wrote it too."""
    return cache_note(autotune, "node choices (and their tuned_ms)", "this profile's compile")


def slower_than_tuned(nodes) -> list[dict]:
    """``{'name', 'ms', 'tuned_ms'}`` of each profiled step whose time in place
    is above :data:`SLOWER_FACTOR` x its autotuned median, and above it by more
    than :data:`SLOWER_FLOOR_MS`, slowest gap first: autotune times a node
    alone, so a step slower in the schedule (strided operands, another
    engine, cold caches) is a choice made on the wrong figure. Both figures
    are of the same form of the step: a producer the zero-copy plan puts in
    its slice of a concat's buffer is timed by autotune as it runs there
    (its strided write, or its dense result plus the copy into the slice:
    ``passes/autotune_measure.py``), and its step's ``ms`` is that write or
    that kernel plus the copy (``buffer_views.WriteInto``)."""
    out = [{"name": n["name"], "ms": n["ms"], "tuned_ms": n["tuned_ms"]} for n in nodes
           if n.get("tuned_ms") and n["ms"] > SLOWER_FACTOR * n["tuned_ms"]
           and n["ms"] - n["tuned_ms"] > SLOWER_FLOOR_MS]
    return sorted(out, key=lambda r: r["tuned_ms"] - r["ms"])


def direction_of(op, phase: str) -> str:
    """``fprop``/``dgrad``/``wgrad`` for a conv or linear step (by its phase),
    ``forward``/``backward`` for any other."""
    if op.family in COMPUTE_FAMILIES:
        return COMPUTE_DIRECTIONS[phase]
    return "forward" if phase == "forward" else "backward"


def profile_steps(tg, feeds: dict, device: str, policy, timer, *, warmup: int, repeat: int,
                  clock=None) -> dict:
    """The profile of one compiled training graph (module docstring).

    Args:
        tg: a :class:`.protocol.TrainingGraph`; feeds: its sources by name, on ``device``.
        policy: the lowering policy (or dict) to compile with.
        timer: a :mod:`.timer` timer of ``device``; warmup, repeat: calls per step.
        clock: how a step alone and the whole step as a graph are timed
            (:mod:`.step_clock`); None: :func:`.step_clock.step_clock` of ``device``.

    Returns:
        ``{'compile_s', 'notes', 'autotune', 'step_ms', 'graph_step_ms', 'graph_step_capture',
        'nodes_ms', 'timing', 'nodes': [...]}`` (``autotune``: where the compile's
        autotune time went, ``passes/autotune_clock.py``, None without autotune;
        ``notes``: what was asked and not applied, and :func:`profile_cache_note`;
        ``step_ms``: the whole step as one loop of eager calls; ``graph_step_ms``:
        replayed as CUDA graphs, None on the CPU; ``graph_step_capture``: that
        replay's summary; ``timing``: :func:`.step_clock.timing_summary`); each node
        ``{'name', 'op', 'algorithm', 'phase', 'direction', 'kind', 'ms', 'timed',
        'graph_calls', 'eager_reason', 'bytes', 'flops', 'tuned_ms'}`` (``kind``: ``'compute'``,
        ``'memory'`` or ``'view'``, a zero-copy step that copies nothing;
        ``timed``: ``'graph'`` or ``'eager'``, :class:`.step_clock.StepTime`;
        ``tuned_ms``: the median autotune measured for the node's choice, or
        None where autotune did not time it).
    """
    import time

    clock = clock if clock is not None else step_clock(device, timer)
    t0 = time.perf_counter()
    warned: list[str] = []
    with warnings_noted(warned):  # a corrupt autotune cache: in the notes, as a benchmark column's
        exe = og.compile(tg.outputs, device=device, policy=policy)
    compile_s = time.perf_counter() - t0
    asked = policy if isinstance(policy, LoweringPolicy) else LoweringPolicy.from_mapping(policy or {})
    notes = warned + requested_notes(exe, asked.precision, asked.layout, tg.model.dtype, warned)
    notes += filter(None, [profile_cache_note(exe.report.autotune)])
    sched = schedule(exe, tg)
    phase = {st.node: p for p, sts in sched.phases.items() for st in sts}
    slots = exe.feed(feeds)
    steps = [attrs.evolve(st, free=(), inplace=None) for st in exe.steps]  # every value kept, out of place
    for st in steps:
        slots[st.node] = run_step(st, slots)

    def whole():
        for st in steps:
            run_step(st, slots)

    step_ms = median_ms(timer, whole, warmup, repeat)
    graph = clock.whole_graph(steps, slots, warmup=warmup, repeat=repeat)
    nodes = []
    for st in steps:
        op = abstract_of(st.op)
        moved, flops = step_traffic(exe.graph, st.node)
        viewed = view_traffic(exe.graph, st)
        moved = moved if viewed is None else viewed
        timed = clock.step(st, slots, warmup=warmup, repeat=repeat)
        kind = "compute" if op.family in COMPUTE_FAMILIES else "view" if viewed == 0 else "memory"
        nodes.append({"name": st.name, "op": op.name, "algorithm": st.op.algorithm, "phase": phase[st.node],
                      "direction": direction_of(op, phase[st.node]), "kind": kind,
                      **timed.fields(), "bytes": moved, "flops": flops, "tuned_ms": tuned_ms(exe.report, st.name)})
    return {"compile_s": compile_s, "notes": notes, "autotune": exe.report.autotune or None,
            "fusion": exe.report.fusion or None, "step_ms": step_ms, **graph,
            "nodes_ms": sum(n["ms"] for n in nodes), "timing": timing_summary(clock, nodes), "nodes": nodes}


def group_by_op(nodes, matmul_tflops: float | None, copy_gbps: float | None) -> list[dict]:
    """Rows per ``(op, direction)``, slowest first: ``count``, ``eager_steps``
    (of them, steps timed eagerly: node ``timed == 'eager'``), ``ms`` (sum of
    the steps alone), ``bytes``, ``flops``, ``gbps``, ``tflops``, ``kind``,
    ``algorithms`` (steps per algorithm) and ``fraction`` of its limit
    (compute: ``tflops / matmul_tflops``; memory: ``gbps / copy_gbps``; None
    for a view, or without the limit or a time). A group whose steps differ
    in kind (concats some of which copy) is ``memory``."""
    rows: dict[tuple, dict] = {}
    for n in nodes:
        r = rows.setdefault((n["op"], n["direction"]), {
            "op": n["op"], "direction": n["direction"], "kind": n["kind"], "count": 0, "eager_steps": 0,
            "ms": 0.0, "bytes": 0, "flops": 0, "algorithms": defaultdict(int)})
        if n["kind"] != r["kind"]:  # copying and zero-copy steps of one op type: the copies count
            r["kind"] = "memory"
        r["count"] += 1
        r["eager_steps"] += n.get("timed") == "eager"
        r["ms"] += n["ms"]
        r["bytes"] += n["bytes"]
        r["flops"] += n["flops"]
        r["algorithms"][n["algorithm"]] += 1
    out = []
    for r in rows.values():
        seconds = r["ms"] / 1e3
        r["algorithms"] = dict(r["algorithms"])
        r["gbps"] = r["bytes"] / seconds / 1e9 if seconds > 0 and r["kind"] != "view" else None
        r["tflops"] = r["flops"] / seconds / 1e12 if seconds > 0 else None
        limit, achieved = {"compute": (matmul_tflops, r["tflops"]), "memory": (copy_gbps, r["gbps"]),
                           "view": (None, None)}[r["kind"]]
        r["fraction"] = achieved / limit if limit and achieved is not None else None
        out.append(r)
    return sorted(out, key=lambda r: -r["ms"])


def measure_limits(device: str, precisions) -> dict:
    """``{'matmul': {precision: {...}}, 'copy': {...}}``: the matmul peak of
    each precision (:func:`.peak.measure_peaks`) and the copy bandwidth,
    measured now. A failed copy measurement has ``gbps: None`` and ``error``."""
    matmul = measure_peaks(device, list(precisions))
    try:
        copy = measure_copy_bandwidth(device)
    except Exception as e:  # e.g. out of device memory: the fractions are left out
        copy = {"gbps": None, "error": f"{type(e).__name__}: {e}"}
    return {"matmul": matmul, "copy": copy}


def profile_model(tg, lowering, base_policy, device: str, timer, limits: dict, *, warmup: int, repeat: int,
                  seed: int = 0) -> dict:
    """One model's profile record: :func:`profile_steps` on random feeds
    (:func:`.protocol.random_feeds`) with ``lowering``'s policy (recorded as
    ``policy``, as a benchmark column records the one it compiled with), and
    its rows (:func:`group_by_op`) judged against ``limits``
    (:func:`measure_limits`; the matmul peak of ``base_policy.precision``)."""
    model = tg.model
    feeds = {k: dev.to_device(v, device) for k, v in random_feeds(model, seed).items()}
    policy = lowering.policy(base_policy, device)
    prof = profile_steps(tg, feeds, device, policy, timer, warmup=warmup, repeat=repeat)
    peak = limits["matmul"].get(base_policy.precision, {})
    rows = group_by_op(prof["nodes"], peak.get("tflops"), limits["copy"].get("gbps"))
    prof["slower_than_tuned"] = slower_than_tuned(prof["nodes"])
    prof["notes"] += filter(None, [lowering.policy_note(policy)])
    return {"model": model.key, "title": model.title, "batch": model.batch, "dtype": model.dtype,
            "lowering": lowering.name, "precision": base_policy.precision,
            "layout": applied_layout(base_policy.layout, device), "layout_requested": base_policy.layout,
            "policy": policy.to_dict(), **prof, "by_op": rows}


def profile_document(environment: dict, limits: dict, records: list, notes=()) -> dict:
    """The JSON document of a profile run: ``{'tool', 'mode': 'profile',
    'schema_version', 'environment', 'limits', 'notes', 'models'}``."""
    return {"tool": "opgraph-bench", "mode": "profile", "schema_version": PROFILE_SCHEMA_VERSION,
            "environment": environment, "limits": limits, "notes": list(notes), "models": records}


__all__ = ["COMPUTE_FAMILIES", "PROFILE_SCHEMA_VERSION", "tensor_bytes", "step_traffic", "view_traffic", "tuned_ms",
           "profile_cache_note", "slower_than_tuned",
           "SLOWER_FACTOR", "direction_of",
           "profile_steps", "group_by_op", "measure_limits", "profile_model", "profile_document"]
