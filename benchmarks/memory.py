"""Memory of one lowering: planned, observed and (on a GPU) measured peak.

Three figures, each with what it includes:

* **planned** (``passes/memory.py``, in the ``LoweringReport``): the liveness
  plan of the schedule: live outputs plus the running node's workspace
  (``Rule.workspace`` of the implementation chosen), maximised over steps;
  sources (input, parameters) apart. Given with and without workspace.
* **live** (:func:`run_and_measure`, every device): the executor's own
  buffers during one real run: after each step, the bytes of the distinct
  arrays held for later steps (views of one buffer counted once), sources
  excluded. No workspace, no kernel temporaries: what liveness promises.
* **measured** (CUDA only): the most bytes CuPy's memory pools had handed
  out at once during one real run (block sizes, as allocated), workspace and
  temporaries included, counted by a ``cupy.cuda.MemoryHook`` on every
  allocation and free of the run (:class:`AllocationCounter`). This is what
  ``torch.cuda.max_memory_allocated`` counts for the PyTorch column, so the
  two compare like with like.
* **reserved** (CUDA only): the pool's own high-water mark over the same run.
  The pool is emptied of cached blocks first, so the bytes it holds at the
  end are the most it needed at once (``total_bytes``: fragmentation and
  cached free blocks included); minus the bytes in use before the run
  (inputs, parameters, the float64 reference). PyTorch's counterpart is
  ``torch.cuda.max_memory_reserved``. (Results before 2026-11-30's third
  session called this figure "measured".)

On the CPU ``tracemalloc`` slows NumPy code several-fold, so the CPU reports
the planned and live figures only (the output says so).

Per node, the workspace of its chosen implementation comes from the report
(``NodeReport.workspace``); :func:`workspace_summary` adds them up.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np

from opgraph.executable import Executable, run_step


def _buffer(array) -> tuple[int, int]:
    """(identity, bytes) of the memory behind ``array``: its base buffer, so a
    view (``Flatten``, ``Reshape``) does not count twice."""
    # CuPy: the allocation (NumPy's .data is a memoryview, which bfloat16 cannot make)
    mem = None if isinstance(array, np.ndarray) else getattr(getattr(array, "data", None), "mem", None)
    if mem is not None and hasattr(mem, "ptr"):
        return int(mem.ptr), int(mem.size)
    base = array
    while getattr(base, "base", None) is not None and hasattr(base.base, "nbytes"):
        base = base.base
    return id(base), int(getattr(base, "nbytes", 0))


def _live_bytes(slots: dict, sources: set) -> int:
    seen: dict[int, int] = {}
    for node, array in slots.items():
        if node in sources or not hasattr(array, "nbytes"):
            continue
        key, size = _buffer(array)
        seen[key] = size
    return sum(seen.values())


class AllocationCounter:
    """Bytes allocated and not yet freed (``in_use``) and their high-water mark
    (``peak``), from the pool's allocation events: ``malloc(ptr, bytes)`` and
    ``free(ptr)`` (a pointer allocated before counting began is ignored when
    freed). Sizes are the pool's block sizes, as CuPy reports them."""

    def __init__(self):
        self._live: dict[int, int] = {}
        self.in_use = 0
        self.peak = 0

    def malloc(self, ptr: int, size: int) -> None:
        self._live[ptr] = size
        self.in_use += size
        self.peak = max(self.peak, self.in_use)

    def free(self, ptr: int) -> None:
        self.in_use -= self._live.pop(ptr, 0)


def counting_hook(counter: AllocationCounter):
    """A ``cupy.cuda.MemoryHook`` feeding ``counter`` (use as ``with hook:``;
    CuPy calls it on every pool allocation and free of this thread)."""
    import cupy

    class _Hook(cupy.cuda.MemoryHook):
        name = "opgraph_allocation_counter"

        def malloc_postprocess(self, **kw):
            counter.malloc(kw["mem_ptr"], kw["mem_size"])

        def free_postprocess(self, **kw):
            counter.free(kw["mem_ptr"])

    return _Hook()


def run_and_measure(exe: Executable, feeds: dict, device: str) -> tuple[list, dict]:
    """Run ``exe`` once on ``feeds`` as the executor does (buffers freed after
    their last reader) and measure memory (module docstring).

    Returns:
        The outputs (device arrays, ``exe.outputs`` order) and a dict with
        ``live_peak_bytes`` and, on cuda, ``allocated_peak_bytes`` (the most
        bytes the pools had handed out at once during the run),
        ``pool_peak_bytes`` (the pool's held bytes at the end, its high-water
        mark, minus the bytes in use before the run) and ``pool_resident_bytes``
        (in use before), plus ``run_s`` (wall seconds of the run).
    """
    pool = None
    counter = AllocationCounter()
    hook = contextlib.nullcontext()
    if device == "cuda":
        import cupy

        cupy.cuda.get_current_stream().synchronize()
        pool = cupy.get_default_memory_pool()
        pool.free_all_blocks()
    slots = exe.feed(feeds)
    sources = set(slots)
    resident = pool.used_bytes() if pool is not None else None
    if pool is not None:
        hook = counting_hook(counter)
    t0 = time.perf_counter()
    live_peak = 0
    with hook:
        for st in exe.steps:
            slots[st.node] = run_step(st, slots)
            live_peak = max(live_peak, _live_bytes(slots, sources))
            for f in st.free:
                slots.pop(f, None)
    outputs = [slots[v.node] for v in exe.outputs]
    info = {"live_peak_bytes": live_peak}
    if pool is not None:
        import cupy

        cupy.cuda.get_current_stream().synchronize()
        info["allocated_peak_bytes"] = counter.peak
        info["pool_peak_bytes"] = max(0, pool.total_bytes() - resident)
        info["pool_resident_bytes"] = resident
    info["run_s"] = time.perf_counter() - t0
    return outputs, info


def workspace_summary(report) -> dict:
    """Workspace bytes of the chosen implementations, from a ``LoweringReport``:
    per node (non-zero only), their sum and their maximum."""
    per_node = {name: int(r.workspace) for name, r in report.nodes.items() if r.workspace}
    return {"per_node": per_node, "total_bytes": sum(per_node.values()),
            "max_bytes": max(per_node.values(), default=0)}


def memory_record(report, measured: dict, device: str) -> dict:
    """The ``memory`` entry of a result: planned (with and without workspace),
    live, measured (cuda) and workspace figures, with the method of each."""
    plan = dict(getattr(report, "memory", {}) or {})
    ws = workspace_summary(report)
    rec = {
        "planned_peak_bytes": plan.get("planned_peak_bytes"),
        "planned_peak_without_workspace_bytes": plan.get("activation_peak_bytes"),
        "workspace_peak_bytes": plan.get("workspace_peak_bytes", ws["max_bytes"]),
        "workspace_total_bytes": ws["total_bytes"],
        "workspace_per_node": ws["per_node"],
        "source_bytes": plan.get("source_bytes"),
        "live_peak_bytes": measured.get("live_peak_bytes"),
        "measured_peak_bytes": measured.get("allocated_peak_bytes"),
        "reserved_peak_bytes": measured.get("pool_peak_bytes"),
        "peak_step": plan.get("peak_step"),
        "inplace_steps": plan.get("inplace"),
        "inplace_bytes": plan.get("inplace_bytes"),
    }
    rec["method"] = ("planned: liveness plan of the schedule + chosen workspace (passes/memory.py), "
                     "peaking at peak_step, with inplace_steps steps writing into an input that dies "
                     "there (inplace_bytes not allocated); "
                     "live: executor buffers during one run (no workspace); " +
                     ("measured: most bytes CuPy's pools had allocated at once during one run "
                      "(a MemoryHook; PyTorch: torch.cuda.max_memory_allocated); reserved: the pool's "
                      "high-water mark minus resident bytes (fragmentation and cache included; "
                      "PyTorch: max_memory_reserved)"
                      if device == "cuda" else
                      "measured: not available on the CPU (no cheap allocation counter for NumPy)"))
    return rec


__all__ = ["AllocationCounter", "counting_hook", "run_and_measure", "workspace_summary", "memory_record"]
