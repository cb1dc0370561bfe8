#!/usr/bin/env python3
"""Render ``opgraph-bench`` JSON results as the Markdown tables of ``docs/results-h200.md``.

Usage::

    python scripts/results_to_markdown.py RUN.json [RUN.json ...] [--plot ALL.png] > tables.md

Several files (e.g. one per stage of ``scripts/h200_results.sh``) are merged
in the order given (``opgraph.benchmarks.markdown.merge``): one end-to-end
table per precision over every model, then the per-layer and memory tables.
Files that are missing or not timing runs are reported on stderr and skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from opgraph.benchmarks.markdown import merge, render_markdown


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", type=Path, help="opgraph-bench --format json outputs")
    p.add_argument("--plot", metavar="PATH.png", help="also draw the merged bar chart")
    p.add_argument("--level", type=int, default=3, help="heading level of each table (default 3)")
    args = p.parse_args(argv)
    docs = []
    for path in args.files:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            print(f"results_to_markdown: skipping {path}: {e}", file=sys.stderr)
            continue
        if doc.get("mode") != "benchmark":
            print(f"results_to_markdown: skipping {path}: not a timing run", file=sys.stderr)
            continue
        docs.append(doc)
    if not docs:
        print("results_to_markdown: no timing run to render", file=sys.stderr)
        return 1
    doc = merge(docs)
    sys.stdout.write(render_markdown(doc, level=args.level))
    if args.plot:
        from opgraph.benchmarks.plot import plot

        plot(doc, args.plot)
        print(f"results_to_markdown: wrote {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
