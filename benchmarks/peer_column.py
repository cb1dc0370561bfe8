"""The peers' columns (PyTorch eager and ``torch.compile``, :mod:`.peer_torch`)
and the ratios of every opgraph column to them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .records import fill_throughput, model_flops, new_record, release_device

if TYPE_CHECKING:
    from .driver import Settings


def run_peer_entry(tg, feeds: dict, ref, peer: str, precision: str, s: Settings,
                   peak: dict | None) -> dict:
    """The PyTorch peer's record for one model and precision."""
    from .peer_torch import PeerError, run_peer

    rec = new_record(tg.model, precision, s, peer, peer)
    try:
        # the layout opgraph applied, so that the ratios compare like with like
        out = run_peer(tg.model, feeds, device=s.device, precision=precision, layout=s.applied_layout,
                       warmup=s.warmup, repeat=s.repeat, compiled=peer == "torch-compile",
                       reference=ref, input_grad=tg.input_grad is not None)
    except PeerError as e:
        rec.update(status="unavailable", reason=str(e))
        return rec
    except Exception as e:
        rec.update(status="error", reason=f"{type(e).__name__}: {e}")
        return rec
    finally:
        release_device(s.device)
    times = out["times"]
    rec["times"] = {"forward": times["forward"], "backward": times["backward"],
                    "backward_data": None, "backward_filter": None}
    fwd, bwd = times["forward"]["median_ms"], times["backward"]["median_ms"]
    rec["totals"] = {"forward_ms": fwd, "backward_ms": bwd, "total_ms": fwd + bwd,
                     "total_min_ms": times["forward"]["min_ms"] + times["backward"]["min_ms"]}
    rec["flops"] = {k: v for k, v in model_flops(tg).items() if k in ("forward", "backward", "total")}
    fill_throughput(rec, peak)
    rec["first_call_s"] = out["first_call_s"]
    rec["memory"] = out["memory"]
    rec["versions"] = out["versions"]
    rec["notes"].append("PyTorch autograd computes input and weight gradients in one backward "
                        "pass: backward-data / backward-filter split n/a")
    if out["check"] is not None:
        rec["check"] = {"end_to_end": out["check"], "passed": out["check"]["finite"]}
    return rec


def add_ratios(results: list[dict]) -> None:
    """``vs_torch`` / ``vs_torch_compile`` on every timed opgraph record: its
    forward, backward and total median over the peer's (same model, precision)."""
    peers = {(r["model"], r["precision"], r["kind"]): r for r in results
             if r["kind"] != "opgraph" and r["status"] == "ok"}
    for r in results:
        if r["kind"] != "opgraph" or r["status"] != "ok":
            continue
        for kind in ("torch", "torch-compile"):
            p = peers.get((r["model"], r["precision"], kind))
            if p is None:
                continue
            r["vs_" + kind.replace("-", "_")] = {
                k: r["totals"][k + "_ms"] / p["totals"][k + "_ms"] if p["totals"][k + "_ms"] else None
                for k in ("forward", "backward", "total")}


__all__ = ["run_peer_entry", "add_ratios"]
