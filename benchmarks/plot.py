"""``--plot PATH.png``: a bar chart of the end-to-end times (matplotlib, Agg backend).

One panel per (precision, model), each with its own y scale (models differ
by 10x in work): one bar per column that was timed (the lowerings, then the
PyTorch peer(s) in another colour family), forward at the bottom and
backward (backward-data + backward-filter; PyTorch's one backward pass)
stacked on top, in milliseconds per mini-batch (medians); a ``+graph`` peer,
whose step is one CUDA graph, gets one bar of its whole step. A column that was
not timed (n/a, mismatch, error) gets no bar and its status written at the
bar's place, so the absence is visible.
"""

from __future__ import annotations

import math

from .tables import ordered, precisions

FORWARD, BACKWARD = "#4C72B0", "#DD8452"
PEER_FORWARD, PEER_BACKWARD = "#55A868", "#C44E52"
#: A peer whose whole step is one CUDA graph (``+graph``): one bar, no phases.
PEER_STEP = "#8172B3"
#: Narrowest figure, inches: one model's panel leaves the title and legend room.
MIN_WIDTH = 6.4
#: Resolution of the PNG, dots per inch.
DPI = 110


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
    """Write the chart of benchmark document ``doc`` to ``path`` (PNG, :data:`DPI`
    dots per inch); returns ``path``.

    Raises:
        ImportError: matplotlib is missing (the message says how to install it).
        ValueError: ``doc`` is not a timing run.
    """
    plt = _import_pyplot()
    fig = figure(doc)
    try:
        fig.savefig(path, dpi=DPI)
    finally:
        plt.close(fig)
    return path


def figure(doc: dict):
    """The matplotlib figure of benchmark document ``doc`` (module docstring):
    at least :data:`MIN_WIDTH` inches wide, the legend listing only the kinds
    of column that have a bar (no PyTorch entries without ``--compare``).

    Raises:
        ImportError: matplotlib is missing (the message says how to install it).
        ValueError: ``doc`` is not a timing run.
    """
    if doc.get("mode") != "benchmark":
        raise ValueError("--plot needs a timing run (not --summary)")
    plt = _import_pyplot()
    precs = precisions(doc) or ["fp32"]
    models = [m["model"] for m in doc["models"]] or ["-"]
    # constrained layout makes room for the title and the legend outside the panels
    fig, axes = plt.subplots(len(precs), len(models), squeeze=False, layout="constrained",
                             figsize=(max(MIN_WIDTH, 3.2 * len(models)), 3.4 * len(precs)))
    for i, prec in enumerate(precs):
        for j, model in enumerate(models):
            ax = axes[i][j]
            res = [r for r in ordered(doc, prec) if r["model"] == model]
            _panel(ax, res)
            ax.set_title(f"{model}, {prec}", fontsize=10)
            if j == 0:
                ax.set_ylabel("ms per mini-batch")
    ok = [r for r in doc.get("results", ()) if r["status"] == "ok"]
    entries = []
    if any(r["kind"] == "opgraph" for r in ok):
        entries += [(FORWARD, "forward"), (BACKWARD, "backward")]
    if any(r["kind"] != "opgraph" and r["totals"]["forward_ms"] is not None for r in ok):
        entries += [(PEER_FORWARD, "PyTorch forward"), (PEER_BACKWARD, "PyTorch backward")]
    if any(r["kind"] != "opgraph" and r["totals"]["forward_ms"] is None for r in ok):
        entries += [(PEER_STEP, "PyTorch whole step (CUDA graph)")]
    if entries:
        fig.legend([plt.Rectangle((0, 0), 1, 1, color=c) for c, _ in entries], [t for _, t in entries],
                   loc="outside lower center", ncol=len(entries), fontsize=8, frameon=False)
    env = doc.get("environment", {})
    # the device on a line of its own (a CPU's name can be long); wrap what is still too wide
    fig.suptitle(f"opgraph-bench on {env.get('device_name') or env.get('device')}\n"
                 "forward + backward (median)", fontsize=11, wrap=True)
    return fig


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
        if fwd is None:  # a peer's step captured in one CUDA graph: no phases, one bar
            total = r["totals"]["total_ms"]
            ax.bar(x, total, color=PEER_STEP)
            ax.text(x, total, _short(total), ha="center", va="bottom", fontsize=7)
            continue
        ax.bar(x, fwd, color=PEER_FORWARD if peer else FORWARD)
        ax.bar(x, bwd, bottom=fwd, color=PEER_BACKWARD if peer else BACKWARD)
        ax.text(x, fwd + bwd, _short(fwd + bwd), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(names, rotation=45, ha="right", fontsize=8)
    ax.set_ylim(0, top * 1.15 if math.isfinite(top) and top > 0 else 1.0)


def _short(ms: float) -> str:
    return f"{ms:.0f}" if ms >= 10 else f"{ms:.1f}"


__all__ = ["plot", "figure", "MIN_WIDTH", "DPI"]
