"""The peers' columns (:mod:`.peer_run`: PyTorch eager, ``+graph``, ``torch.compile``,
``torch.compile+graph``) and the ratios of every opgraph column to them.

Ratios (:func:`add_ratios`) divide opgraph's time by a peer's of the same
model and precision, measured in the same run:

* ``vs_<peer>`` (``vs_torch``, ``vs_torch_graph``, ``vs_torch_compile``,
  ``vs_torch_compile_graph``): ``step`` is the whole step timed as one loop
  on both sides (:mod:`.whole_step`), the like-for-like figure the tables
  show; ``forward``, ``backward`` and ``total`` divide the seed protocol's
  per-phase medians, where the peer has phases (a ``+graph`` peer has not);
* ``vs_best_peer``: ``ratio`` is opgraph's whole step over the fastest
  peer's (``peer``, ``peer_step_ms``) among those timed in the run.

Threads (:func:`aligned_threads`): on the CPU opgraph's convolutions and
matrix products run on NumPy's BLAS, whose thread count
``OPENBLAS_NUM_THREADS`` (or ``MKL_NUM_THREADS``, ``OMP_NUM_THREADS``) may
limit, while PyTorch runs its own OpenMP thread count, which those variables
do not all reach (README advises ``OPENBLAS_NUM_THREADS=1`` on a busy
machine: one thread for opgraph, every core for PyTorch, a ratio off by the
core count). Where the BLAS's count is known
(:func:`.environment.blas_threads`) and differs from PyTorch's, the peers run
with ``torch.set_num_threads`` of it, PyTorch's own count restored after;
their records say so (``threads``, a note), and so does the run, in one
wording (:func:`thread_alignment`; where the BLAS's count is unknown, both say
that the peers ran with PyTorch's own).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, NamedTuple

from .peer_run import PEERS, VARIANTS
from .records import error_fields, fill_throughput, model_flops, new_record, release_device

if TYPE_CHECKING:
    from .driver import Settings

#: The split the peers do not have: PyTorch's backward is one autograd pass.
ONE_PASS_NOTE = ("PyTorch autograd computes input and weight gradients in one backward pass: "
                 "backward-data / backward-filter split n/a")
GRAPH_NOTE = ("forward and backward captured in one CUDA graph: whole step only (total = the "
              "step; first call + capture in capture_s)")


def ratio_key(peer: str) -> str:
    """The record key of the ratios to ``peer``: ``'vs_torch_compile_graph'``."""
    return "vs_" + peer.replace("-", "_").replace("+", "_")


class ThreadAlignment(NamedTuple):
    """What :func:`thread_alignment` decides: ``threads``, the intra-op count the PyTorch peers run
    with (None: PyTorch's own is unknown); ``note``, why it is not PyTorch's own count, or why
    the two could not be compared (None where they agree)."""

    threads: int | None
    note: str | None


def thread_alignment(blas: int | None, source: str | None, own: int | None) -> ThreadAlignment:
    """The one comparison of NumPy's BLAS threads (``blas``, read from ``source``:
    :func:`.environment.blas_threads`) with PyTorch's own intra-op count ``own``, and its one
    wording, for the run's note (:func:`threads_note`) and the peers' records
    (:func:`aligned_threads`): the BLAS's count where it is known and differs, else PyTorch's."""
    if own is None or blas == own:
        return ThreadAlignment(own, None)
    if blas is None:
        return ThreadAlignment(own, (
            f"threads: NumPy's BLAS thread count is {source}, so the PyTorch peers run with PyTorch's own "
            f"{own}: the ratios may compare different thread counts (set OPENBLAS_NUM_THREADS, or install "
            "threadpoolctl, to have them aligned)"))
    return ThreadAlignment(blas, (
        f"threads: NumPy's BLAS runs {blas} thread(s) ({source}), PyTorch's own {own}: the PyTorch peers "
        f"run with torch.set_num_threads({blas}), so that the ratios compare like thread counts"))


def threads_note(threads: dict) -> str | None:
    """The run's note on the PyTorch peers' threads on the CPU (``threads``:
    :func:`.environment.thread_counts`): :func:`thread_alignment`'s."""
    return thread_alignment(threads.get("blas"), threads.get("blas_source"), threads.get("torch")).note


@contextlib.contextmanager
def aligned_threads(device: str):
    """On the CPU, PyTorch's intra-op thread count set to NumPy's BLAS's
    (module docstring, :func:`thread_alignment`) while the peers run, restored
    after; yields the count the peers run with and the alignment's note (None,
    None on a GPU). NumPy's count is read before PyTorch is imported; it is
    NumPy's own library's in any case (:func:`.environment.numpy_blas_entry`),
    not the first BLAS that threadpoolctl lists.

    Raises:
        PeerError: PyTorch is not installed.
    """
    if device != "cpu":
        yield None, None
        return
    from .environment import blas_threads
    from .peer_torch import import_torch

    blas, source = blas_threads()
    torch = import_torch()
    own = torch.get_num_threads()
    threads, note = thread_alignment(blas, source, own)
    if threads == own:
        yield own, note
        return
    torch.set_num_threads(threads)
    try:
        yield threads, note
    finally:
        torch.set_num_threads(own)


def peer_records(tg, feeds: dict, ref, names, precision: str, s: Settings, peak: dict | None) -> list[dict]:
    """The records of the peers ``names`` for one model and precision, in that order."""
    from .peer_run import run_peers
    from .peer_torch import PeerError

    recs = {n: new_record(tg.model, precision, s, n, n) for n in names}
    threads = note = None
    try:
        # the layout opgraph applied, so that the ratios compare like with like
        with aligned_threads(s.device) as (threads, note):
            outs = run_peers(tg.model, feeds, names, device=s.device, precision=precision,
                             layout=s.applied_layout, warmup=s.warmup, repeat=s.repeat, reference=ref,
                             input_grad=tg.input_grad is not None)
    except PeerError as e:
        outs = {n: {"status": "unavailable", "reason": str(e)} for n in names}
    except Exception as e:
        outs = {n: error_fields(e) for n in names}
    finally:
        release_device(s.device)
    for name, rec in recs.items():
        _fill(rec, outs[name], tg, peak)
        if threads is not None:
            rec["threads"] = threads  # PyTorch's intra-op threads while the peers ran (CPU)
        if note is not None:
            rec["notes"].append(note)
    return list(recs.values())


def _fill(rec: dict, out: dict, tg, peak: dict | None) -> None:
    rec.update(status=out["status"], reason=out.get("reason"))
    if out.get("error") is not None:  # type, message, innermost frames (records.error_record)
        rec["error"] = out["error"]
    if out.get("converter_check") is not None:
        rec["converter_check"] = out["converter_check"]
    if out["status"] != "ok":
        if out.get("check") is not None:
            rec["check"] = out["check"]
        return
    step = out["step"]
    if out["times"] is None:  # one CUDA graph: no phases
        rec["times"] = {"forward": None, "backward": None, "backward_data": None, "backward_filter": None}
        rec["totals"] = {"forward_ms": None, "backward_ms": None, "total_ms": step["median_ms"],
                         "total_min_ms": step["min_ms"]}
        rec["capture_s"] = out["capture_s"]
        rec["notes"].append(GRAPH_NOTE)
    else:
        times = out["times"]
        rec["times"] = {"forward": times["forward"], "backward": times["backward"],
                        "backward_data": None, "backward_filter": None}
        fwd, bwd = times["forward"]["median_ms"], times["backward"]["median_ms"]
        rec["totals"] = {"forward_ms": fwd, "backward_ms": bwd, "total_ms": fwd + bwd,
                         "total_min_ms": times["forward"]["min_ms"] + times["backward"]["min_ms"]}
        rec["notes"].append(ONE_PASS_NOTE)
    rec["step"] = step
    rec["flops"] = {k: v for k, v in model_flops(tg).items() if k in ("forward", "backward", "total")}
    fill_throughput(rec, peak)
    rec["first_call_s"] = out["first_call_s"]
    rec["memory"] = out["memory"]
    rec["versions"] = out["versions"]
    if out["check"] is not None:
        rec["check"] = out["check"]


def _quotient(a, b):
    return a / b if a is not None and b else None


def add_ratios(results: list[dict]) -> None:
    """``vs_<peer>`` and ``vs_best_peer`` on every timed opgraph record (module
    docstring); a peer or a record without a whole-step time gives no step ratio."""
    peers: dict[tuple, dict] = {}
    for r in results:
        if r["kind"] in VARIANTS and r["status"] == "ok":
            peers[(r["model"], r["precision"], r["kind"])] = r
    for r in results:
        if r["kind"] != "opgraph" or r["status"] != "ok":
            continue
        mine = (r.get("step") or {}).get("median_ms")
        best = None
        for kind in PEERS:
            p = peers.get((r["model"], r["precision"], kind))
            if p is None:
                continue
            theirs = (p.get("step") or {}).get("median_ms")
            ratios = {"step": _quotient(mine, theirs)}
            if p["totals"]["forward_ms"] is not None:
                ratios.update({k: _quotient(r["totals"][k + "_ms"], p["totals"][k + "_ms"])
                               for k in ("forward", "backward", "total")})
            r[ratio_key(kind)] = ratios
            if theirs and (best is None or theirs < best[1]):
                best = (kind, theirs)
        if best is not None:
            r["vs_best_peer"] = {"ratio": _quotient(mine, best[1]), "peer": best[0], "peer_step_ms": best[1]}


__all__ = ["ONE_PASS_NOTE", "GRAPH_NOTE", "ratio_key", "ThreadAlignment", "thread_alignment", "threads_note",
           "aligned_threads", "peer_records", "add_ratios"]
