"""``--plot PATH.png``: a bar chart of the end-to-end times (matplotlib, Agg backend).

One panel per (precision, model), each with its own y scale (models differ
by 10x in work): one bar per column that was timed (the lowerings, then the
PyTorch peer(s) in another colour family), forward at the bottom and
backward (backward-data + backward-filter; PyTorch's one backward pass)
stacked on top, in milliseconds per mini-batch (medians). A column that was
not timed (n/a, mismatch, error) gets no bar and its status written at the
bar's place, so the absence is visible.
"""

from __future__ import annotations

import math

from .tables import ordered, precisions

FORWARD, BACKWARD = "#4C72B0", "#DD8452"
PEER_FORWARD, PEER_BACKWARD = "#55A868", "#C44E52"


def _import_pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ImportError("--plot needs matplotlib: pip install -e \".[bench]\" (or pip install "
                          "matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(doc: dict, path: str) -> str:
    """Write the chart of benchmark document ``doc`` to ``path`` (PNG); returns ``path``.

    Raises:
        ImportError: matplotlib is missing (the message says how to install it).
        ValueError: ``doc`` is not a timing run.
    """
    if doc.get("mode") != "benchmark":
        raise ValueError("--plot needs a timing run (not --summary)")
    plt = _import_pyplot()
    precs = precisions(doc) or ["fp32"]
    models = [m["model"] for m in doc["models"]] or ["-"]
    fig, axes = plt.subplots(len(precs), len(models), squeeze=False,
                             figsize=(max(4.0, 3.2 * len(models)), 3.4 * len(precs)))
    for i, prec in enumerate(precs):
        for j, model in enumerate(models):
            ax = axes[i][j]
            res = [r for r in ordered(doc, prec) if r["model"] == model]
            _panel(ax, res)
            ax.set_title(f"{model}, {prec}", fontsize=10)
            if j == 0:
                ax.set_ylabel("ms per mini-batch")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in (FORWARD, BACKWARD, PEER_FORWARD, PEER_BACKWARD)]
    fig.legend(handles, ["forward", "backward", "PyTorch forward", "PyTorch backward"],
               loc="lower center", ncol=4, fontsize=8, frameon=False)
    env = doc.get("environment", {})
    fig.suptitle(f"opgraph-bench on {env.get('device_name') or env.get('device')}: forward + backward "
                 "(median)", fontsize=11)
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _panel(ax, results: list[dict]) -> None:
    names = [r["lowering"] for r in results]
    xs = range(len(names))
    top = max((r["totals"]["total_ms"] for r in results if r["status"] == "ok"), default=1.0)
    for x, r in zip(xs, results):
        peer = r["kind"] != "opgraph"
        if r["status"] != "ok":
            ax.text(x, 0.02 * top, r["status"], rotation=90, ha="center", va="bottom", fontsize=7)
            continue
        fwd, bwd = r["totals"]["forward_ms"], r["totals"]["backward_ms"]
        ax.bar(x, fwd, color=PEER_FORWARD if peer else FORWARD)
        ax.bar(x, bwd, bottom=fwd, color=PEER_BACKWARD if peer else BACKWARD)
        ax.text(x, fwd + bwd, _short(fwd + bwd), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(names, rotation=45, ha="right", fontsize=8)
    ax.set_ylim(0, top * 1.15 if math.isfinite(top) and top > 0 else 1.0)


def _short(ms: float) -> str:
    return f"{ms:.0f}" if ms >= 10 else f"{ms:.1f}"


__all__ = ["plot"]
