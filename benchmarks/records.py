"""The result record of one benchmark column, and what fills it: the
record's skeleton, phase totals, FLOPs, throughput and the per-layer rows
(the document's schema: ``report.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .protocol import main_step

if TYPE_CHECKING:
    from .driver import Settings
    from .models import Model


def release_device(device: str) -> None:
    """Give a finished column's device memory back: collect the cycles that
    may still hold arrays (compiled graphs, CUDA-graph replays), then the
    pool's cached blocks. (The GoogLeNet bf16 ``fft`` column ran out of memory
    on 2026-11-30 after eighteen CUDA-graph columns, with 37.6 GB in the default
    pool of the 139 GB device: something held the rest.)"""
    if device == "cuda":
        import gc

        import cupy

        gc.collect()
        cupy.get_default_memory_pool().free_all_blocks()


def new_record(model: Model, precision: str, s: Settings, lowering: str, kind: str) -> dict:
    # ``layout`` is what ran (merging keys on it); the request stays visible beside it
    return {"model": model.key, "batch": model.batch, "dtype": model.dtype, "precision": precision,
            "layout": s.applied_layout, "layout_requested": s.layout, "device": s.device,
            "lowering": lowering, "kind": kind,
            "status": "ok", "reason": None, "notes": []}


def phase_totals(times: dict) -> dict:
    med = {p: (t["median_ms"] if t else None) for p, t in times.items()}
    mins = {p: (t["min_ms"] if t else None) for p, t in times.items()}
    back = [p for p in times if p != "forward"]
    bwd = sum(med[p] or 0.0 for p in back)
    bwd_min = sum(mins[p] or 0.0 for p in back)
    return {"forward_ms": med["forward"], "backward_ms": bwd, "total_ms": med["forward"] + bwd,
            "total_min_ms": mins["forward"] + bwd_min}


def fill_throughput(rec: dict, peak: dict | None) -> None:
    """Fill ``tflops`` (per phase, backward and total, at the median times) and
    ``peak_fraction`` (total TFLOP/s over the measured matmul peak) of a timed record."""
    tot, times = rec["totals"], rec["times"]
    ms = {"forward": tot["forward_ms"], "backward": tot["backward_ms"], "total": tot["total_ms"]}
    for p in ("backward_data", "backward_filter"):
        if times.get(p):
            ms[p] = times[p]["median_ms"]
    rec["tflops"] = {p: (f / (ms[p] * 1e9) if ms.get(p) else None) for p, f in rec["flops"].items()}
    top = (peak or {}).get("tflops")
    total = rec["tflops"].get("total")
    rec["peak_fraction"] = total / top if top and total else None


def model_flops(tg) -> dict:
    """FLOPs of one iteration per phase, plus ``backward`` and ``total``: the
    conv/linear layers' forward FLOPs, counted again for backward-filter (every
    layer) and backward-data (every layer but those reading the image)."""
    fwd = sum(tg.layer_flops.values())
    data = sum(tg.layer_flops[k] for k in tg.data_grad_layers)
    return {"forward": fwd, "backward_data": data, "backward_filter": fwd,
            "backward": data + fwd, "total": 2 * fwd + data}


def layer_records(tg, sched, layer_times: dict, na: dict, report) -> list[dict]:
    nodes = getattr(report, "nodes", {}) or {}
    rows = []
    for layer, by_phase in sched.layers.items():
        f = tg.layer_flops[layer]
        row = {"layer": layer, "op": tg.layers[layer], "flops": f, "algorithm": {}, "ms": {},
               "min_ms": {}, "tflops": {}, "workspace_bytes": {}, "not_applicable": {},
               "fused_relu": False}
        for p, steps in by_phase.items():
            main = main_step(steps)
            if main is not None:
                row["algorithm"][p] = main.op.algorithm
                row["fused_relu"] |= main.op.op.fused and main.op.family == "conv"
                rec = nodes.get(main.name)
                row["workspace_bytes"][p] = int(rec.workspace) if rec is not None else 0
                if main.name in na:
                    row["not_applicable"][p] = na[main.name]
            t = layer_times.get(layer, {}).get(p)
            if t is not None:
                row["ms"][p], row["min_ms"][p] = t.median_ms, t.min_ms
                row["tflops"][p] = f / (t.median_ms * 1e9) if t.median_ms > 0 else None
        rows.append(row)
    return rows


__all__ = ["release_device", "new_record", "phase_totals", "fill_throughput", "model_flops", "layer_records"]
