"""Is a measurement to be trusted? The spread of each timed column and the
sanity of the run's matrix-multiply peak.

What users of pyperf, asv and ``torch.utils.benchmark`` expect beside a
median: its spread, and a warning when the numbers are not stable (pyperf
warns when the standard deviation exceeds 10 % of the mean; asv and
``Measurement.iqr`` report the interquartile range). Here:

* **spread of a loop**: the interquartile range (IQR, ``statistics.quantiles``
  with ``method='inclusive'``: linear interpolation between the calls, so
  3 calls give an IQR too) and its ratio to the median (:func:`spread`);
* **spread of a column**: the sum of its phase loops' IQRs over the sum of
  their medians (:func:`total_spread`; the loops run separately, so a bound);
  a column timed as a whole step only (a ``+graph`` peer): its step loop's;
* a column is **unstable** when that ratio exceeds :data:`SPREAD_LIMIT`
  (10 %, pyperf's threshold), or when its run is; so is a layer's loop of
  the per-layer tables, by its own spread (:func:`unstable_phases`);
* a **run** is unstable when its measured matmul peak is far below what the
  device should reach (:func:`peak_check`: below :data:`PEAK_FLOOR` of
  :func:`expected_peak`), or when the peak measured again at the end of a
  long run moved by more than :data:`PEAK_DRIFT` (the load changed during
  the run: :func:`drift_check`).

A loaded machine shows up both ways: on 2026-11-30 a CPU run under another
process's load reported totals 2-4x too slow with one 0.039 GFLOP layer at
188 ms against 0.43 ms quiet (a spread no median hides), and a matmul peak of
half the quiet value.
"""

from __future__ import annotations

import os
import statistics

#: Relative spread (IQR / median) above which a column is flagged unstable.
SPREAD_LIMIT = 0.10
#: A measured matmul peak below this fraction of :func:`expected_peak` flags the run.
#: CPU: against the nominal AVX2 FMA rate, which OpenBLAS's sgemm reached ~60 % of on a
#: quiet AVX2-kernel core (the 2-core EPYC CI machine in 2026-11: 49 GFLOP/s of 83 on one
#: thread), so 35 % is about half the quiet value there; an AVX-512 core goes above the
#: nominal rate (2026-12-03, the CI's AVX-512 EPYC: 110 GFLOP/s of 83), where the floor
#: is lenient. GPU: against a quiet measurement (cuBLAS varies by 3 % between runs
#: there), so 80 %.
PEAK_FLOOR = {"cpu": 0.35, "cuda": 0.8}
#: A peak measured again at the end of a run that moved by more than this fraction flags it.
PEAK_DRIFT = 0.2
#: Runs shorter than this (seconds) are not measured again at the end: too short to drift.
DRIFT_MIN_SECONDS = 60.0

#: Quiet matmul peaks measured on GPUs (TFLOP/s), by a part of the device's name:
#: shared/design/GPU_NOTES.md for the H200 (cuBLAS fp32 51, tf32 397-409, bf16 779-780);
#: docs/results/h100-2026-12-06 for the SXM H100 (tf32 408, bf16 765-767; fp32 not measured
#: yet; "H100 80GB HBM3" leaves out the PCIe card's lower clocks). fp16 runs on the bf16
#: tensor-core rate.
GPU_PEAKS = {"H200": {"fp32": 51.0, "tf32": 400.0, "bf16": 779.0, "fp16": 779.0},
             "H100 80GB HBM3": {"tf32": 408.0, "bf16": 766.0, "fp16": 766.0}}
#: Where each of :data:`GPU_PEAKS` was measured (the reference's description names it).
GPU_PEAK_SOURCES = {"H200": "GPU_NOTES", "H100 80GB HBM3": "docs/results/h100-2026-12-06"}
#: fp32 FLOPs per cycle and core of a CPU with AVX2 and FMA (two 8-lane FMA
#: pipes; AVX-512 CPUs reach this or twice it, "avx512": two 16-lane pipes, a
#: ceiling only named in the nominal figure's description), else of SSE (two
#: 4-lane pipes, no FMA).
FLOPS_PER_CYCLE = {"avx512": 64, "fma": 32, "sse": 8}


def spread(times_ms) -> dict:
    """``{q1_ms, q3_ms, iqr_ms, max_ms, relative}`` of one loop's per-call
    milliseconds (any iterable of floats, in any order); ``relative`` (IQR /
    median, dimensionless) is None for a single call (``iqr_ms`` too) and for
    a median of 0. Quartiles: ``statistics.quantiles(method='inclusive')``,
    NumPy's default linear percentile.

    Raises:
        statistics.StatisticsError: no times.
    """
    times = sorted(times_ms)
    med = statistics.median(times)
    if len(times) < 2:
        return {"q1_ms": times[0], "q3_ms": times[0], "iqr_ms": None, "max_ms": times[-1], "relative": None}
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return {"q1_ms": q1, "q3_ms": q3, "iqr_ms": q3 - q1, "max_ms": times[-1],
            "relative": (q3 - q1) / med if med > 0 else None}


def total_spread(times: dict) -> dict | None:
    """The spread of a column's total: the sum of its phase loops' IQRs
    (``times``: phase -> ``{times_ms: [...]}`` or None) and its ratio to the
    sum of their medians; None when a loop has a single call. The loops are
    timed separately (their calls do not pair up), so the IQRs are added: a
    bound on the spread of the sum, never an understatement."""
    loops = [spread(t["times_ms"]) for t in times.values() if t and t.get("times_ms")]
    medians = sum(statistics.median(t["times_ms"]) for t in times.values() if t and t.get("times_ms"))
    if not loops or any(sp["iqr_ms"] is None for sp in loops):
        return None
    iqr = sum(sp["iqr_ms"] for sp in loops)
    return {"iqr_ms": iqr, "relative": iqr / medians if medians > 0 else None}


def unstable_phases(row: dict) -> dict[str, float]:
    """Phase -> relative spread (IQR / median) of each loop of a per-layer row
    (``records.layer_records``: ``ms`` and ``iqr_ms`` by phase) whose spread
    exceeds :data:`SPREAD_LIMIT`, as a column's does when it is flagged
    unstable: a layer's loop is short (3 calls on the CPU), and on a loaded
    machine one call descheduled for a scheduler tick or more moves its median
    by that much, with nothing else to show it."""
    out = {}
    for phase, median in row.get("ms", {}).items():
        iqr = row.get("iqr_ms", {}).get(phase)
        if iqr is not None and median and iqr / median > SPREAD_LIMIT:
            out[phase] = iqr / median
    return out


def _cpu_cores() -> tuple[int, str]:
    """Physical cores this process may use, and how that was counted."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    info = _cpuinfo()
    siblings, cores = info.get("siblings"), info.get("cpu cores")
    if siblings and cores and siblings.isdigit() and cores.isdigit() and int(siblings) > int(cores):
        smt = int(siblings) // int(cores)
        return max(1, usable // smt), f"{usable} usable CPUs / {smt} threads per core"
    return usable, f"{usable} usable CPUs"


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of ``/proc/cpuinfo`` (empty elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            text = f.read().split("\n\n", 1)[0]
    except OSError:
        return {}
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


def expected_peak(device: str, device_name: str | None, precision: str) -> tuple[float, str] | None:
    """The reference a measured matmul peak of ``precision`` is held against
    (TFLOP/s), and what that figure is; None when there is no basis for one.

    GPU: the quiet measurement of :data:`GPU_PEAKS` for a known model. CPU:
    the *nominal* fp32 FMA rate, cores x clock x :data:`FLOPS_PER_CYCLE` of
    AVX2 (every precision computes in fp32 there), from ``/proc/cpuinfo``'s
    ``cpu MHz`` and ``flags``. Not a ceiling: an AVX-512 core (up to twice
    the FLOPs per cycle) and a turbo clock above ``cpu MHz`` go above it
    (110 GFLOP/s of a nominal 83 on one AVX-512 EPYC core), and the
    description says so; an AVX2 BLAS reaches ~60 % of it on a quiet core.
    """
    if device != "cpu":
        for model, peaks in GPU_PEAKS.items():
            if device_name and model in device_name and precision in peaks:
                return peaks[precision], f"{model} {precision} quiet measurement ({GPU_PEAK_SOURCES[model]})"
        return None
    info = _cpuinfo()
    try:
        ghz = float(info["cpu MHz"]) / 1e3
    except (KeyError, ValueError):
        return None
    flags = info.get("flags", "").split()
    kind = "fma" if "fma" in flags and "avx2" in flags else "sse"
    cores, counted = _cpu_cores()
    tflops = cores * ghz * FLOPS_PER_CYCLE[kind] / 1e3
    above = (f"this CPU's AVX-512 (up to {FLOPS_PER_CYCLE['avx512']} FLOP/cycle) and a turbo clock go"
             if "avx512f" in flags and kind == "fma" else "a turbo clock goes")
    return tflops, (f"nominal: {counted} x {ghz:.2f} GHz (/proc/cpuinfo) x {FLOPS_PER_CYCLE[kind]} fp32 "
                    f"FLOP/cycle ({'AVX2 FMA' if kind == 'fma' else 'SSE'}); not a ceiling: {above} "
                    "above it")


def peak_check(peak: dict, device: str, device_name: str | None) -> list[str]:
    """Why the run's measured peaks (``{precision: {tflops, ...}}``) cast doubt
    on its timings: each one below :data:`PEAK_FLOOR` of :func:`expected_peak`."""
    reasons = []
    floor = PEAK_FLOOR.get(device, PEAK_FLOOR["cuda"])
    for precision, d in peak.items():
        want = expected_peak(device, device_name, precision)
        got = d.get("tflops")
        if want is None or got is None or got >= floor * want[0]:
            continue
        reasons.append(f"the measured {precision} matmul peak, {got:.3g} TFLOP/s, is {got / want[0]:.0%} "
                       f"of the reference {want[0]:.3g} ({want[1]}): the machine may be "
                       "loaded by another process")
    return reasons


def drift_check(before: dict, after: dict) -> list[str]:
    """Why two peak measurements of one run (start, end) disagree: a change
    of more than :data:`PEAK_DRIFT` in any precision."""
    reasons = []
    for precision, d in before.items():
        a, b = d.get("tflops"), (after.get(precision) or {}).get("tflops")
        if a and b and abs(b - a) > PEAK_DRIFT * a:
            reasons.append(f"the {precision} matmul peak moved from {a:.3g} to {b:.3g} TFLOP/s during the "
                           "run: the machine's load changed")
    return reasons


def mark_columns(results: list[dict], run_reasons: list[str]) -> None:
    """Give every timed record of ``results`` its ``stability`` entry
    (:func:`column_stability`), again when the run's reasons changed."""
    for rec in results:
        if rec.get("status") == "ok" and (rec.get("times") or rec.get("step")):
            rec["stability"] = column_stability(rec, run_reasons)


def run_stability(peak: dict, device: str, device_name: str | None, after: dict | None = None) -> dict:
    """The document's ``stability``: ``unstable``, ``reasons`` (:func:`peak_check`,
    and :func:`drift_check` against ``after``, the peaks measured at the end)
    and ``expected_peak`` (precision -> ``{tflops, how}`` where known)."""
    reasons = peak_check(peak, device, device_name) + (drift_check(peak, after) if after else [])
    expected = {}
    for precision in peak:
        want = expected_peak(device, device_name, precision)
        if want is not None:
            expected[precision] = {"tflops": want[0], "how": want[1]}
    return {"unstable": bool(reasons), "reasons": reasons, "expected_peak": expected,
            "spread_limit": SPREAD_LIMIT, "peak_floor": PEAK_FLOOR.get(device, PEAK_FLOOR["cuda"])}


def column_stability(rec: dict, run_reasons: list[str]) -> dict:
    """The ``stability`` entry of a timed record: ``spread`` (the relative IQR
    of its total, :func:`total_spread`; of its whole ``step`` loop when it has
    no phase loops; or None), ``unstable`` and its ``reasons`` (a spread above
    :data:`SPREAD_LIMIT`, a loop of one call, the run's)."""
    times = {p: t for p, t in (rec.get("times") or {}).items() if t}
    total = total_spread(times) if times else total_spread({"step": rec.get("step")})
    rel = total["relative"] if total else None
    reasons = []
    if rel is not None and rel > SPREAD_LIMIT:
        reasons.append(f"spread {rel:.1%} of the median (the phases' IQRs summed) exceeds "
                       f"{SPREAD_LIMIT:.0%}")
    out = {"spread": rel, "iqr_ms": total["iqr_ms"] if total else None, "unstable": bool(reasons),
           "reasons": reasons}
    if run_reasons:
        out.update(unstable=True, reasons=reasons + [f"run: {r}" for r in run_reasons])
    return out


__all__ = ["SPREAD_LIMIT", "PEAK_FLOOR", "PEAK_DRIFT", "DRIFT_MIN_SECONDS", "GPU_PEAKS", "GPU_PEAK_SOURCES",
           "FLOPS_PER_CYCLE", "spread", "total_spread", "unstable_phases", "expected_peak", "peak_check",
           "drift_check", "mark_columns", "run_stability", "column_stability"]
