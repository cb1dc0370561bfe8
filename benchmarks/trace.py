"""``opgraph-bench --trace PATH``: one training step per column as a Chrome trace.

The file is the JSON trace-event format (``{"traceEvents": [...]}``, the
format of ``chrome://tracing``, which Perfetto's UI opens): one *process*
per benchmark column (``alexnet fp32 gemm``), one complete event (``"ph":
"X"``, microseconds) per scheduled node of one step, in schedule order. An
event is named ``node: Op [algorithm, direction]`` and carries them in
``args`` (``node``, ``op``, ``algorithm``, ``direction``: the phase the node
belongs to, ``options``); its category is the direction, so that Perfetto can
colour or filter forward, backward-data and backward-filter.

* CPU: ``time.perf_counter`` around each step (thread ``cpu``).
* GPU: a pair of CUDA events around each step on the current stream, all
  steps queued back to back and the stream synchronised once, as the timed
  loops do (thread ``gpu (CUDA events)``: device time, from an event
  recorded before the first step); and ``perf_counter`` around each launch
  (thread ``host (launch)``), which shows where Python, not the GPU, is the
  bottleneck.

The step runs on the live values of a column that was just timed
(``PhaseRunner.slots``), outside every timed loop, so tracing changes no
reported time.
"""

from __future__ import annotations

import json
import time

from opgraph.executable import run_step
from opgraph.op import abstract_of

#: Thread ids of the events of one column.
CPU_TID, HOST_TID, GPU_TID = 1, 2, 3


def _describe(st, direction: str) -> tuple[str, dict]:
    op, algo = abstract_of(st.op).name, st.op.algorithm
    args = {"node": st.name, "op": op, "algorithm": algo, "direction": direction,
            "options": {k: str(v) for k, v in st.op.option_dict.items()}}
    return f"{st.name}: {op} [{algo}, {direction}]", args


def _event(name: str, args: dict, pid: int, tid: int, ts_us: float, dur_us: float) -> dict:
    return {"name": name, "cat": args["direction"], "ph": "X", "pid": pid, "tid": tid,
            "ts": round(ts_us, 3), "dur": round(max(dur_us, 0.0), 3), "args": args}


def trace_step(sched, slots: dict, device: str, pid: int) -> list[dict]:
    """The events of one run of every step of ``sched`` (``protocol.Schedule``)
    on ``slots`` (node id -> array, every input present), as process ``pid``.

    Raises:
        whatever a step's kernel raises (the column was timed on the same values).
    """
    direction = {st.node: phase for phase, steps in sched.phases.items() for st in steps}
    if device == "cuda":
        return _trace_cuda(sched.steps, slots, direction, pid)
    events, t_base = [], time.perf_counter()
    for st in sched.steps:
        t0 = time.perf_counter()
        slots[st.node] = run_step(st, slots)
        t1 = time.perf_counter()
        name, args = _describe(st, direction.get(st.node, "forward"))
        events.append(_event(name, args, pid, CPU_TID, (t0 - t_base) * 1e6, (t1 - t0) * 1e6))
    return events


def _trace_cuda(steps, slots, direction, pid) -> list[dict]:
    import cupy

    stream = cupy.cuda.get_current_stream()
    stream.synchronize()
    base = cupy.cuda.Event()
    base.record(stream)
    t_base = time.perf_counter()
    marks = []
    for st in steps:
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        t0 = time.perf_counter()
        start.record(stream)
        slots[st.node] = run_step(st, slots)
        end.record(stream)
        marks.append((st, start, end, t0, time.perf_counter()))
    if marks:
        marks[-1][2].synchronize()
    events = []
    for st, start, end, t0, t1 in marks:
        name, args = _describe(st, direction.get(st.node, "forward"))
        ts = cupy.cuda.get_elapsed_time(base, start) * 1e3  # ms -> microseconds
        dur = cupy.cuda.get_elapsed_time(start, end) * 1e3
        events.append(_event(name, args, pid, GPU_TID, ts, dur))
        events.append(_event(name, args, pid, HOST_TID, (t0 - t_base) * 1e6, (t1 - t0) * 1e6))
    return events


class TraceCollector:
    """The events of every traced column of a run (``Settings.trace``)."""

    def __init__(self):
        self.events: list[dict] = []
        self.columns: list[str] = []

    def add(self, label: str, sched, slots: dict, device: str) -> None:
        """Trace one step of column ``label`` (:func:`trace_step`) as a process of its own."""
        pid = len(self.columns) + 1
        self.columns.append(label)
        self.events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": label}})
        tids = {CPU_TID: "cpu"} if device != "cuda" else {GPU_TID: "gpu (CUDA events)",
                                                          HOST_TID: "host (launch)"}
        for tid, name in tids.items():
            self.events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                                "args": {"name": name}})
        self.events += trace_step(sched, slots, device, pid)

    def render(self) -> str:
        """The trace file's text (JSON trace-event format, times in microseconds)."""
        return json.dumps({"traceEvents": self.events, "displayTimeUnit": "ms",
                           "otherData": {"tool": "opgraph-bench", "columns": self.columns}}) + "\n"


__all__ = ["trace_step", "TraceCollector", "CPU_TID", "HOST_TID", "GPU_TID"]
