"""The bias gradient's methods on every bias gradient of a model's training step, channels-last.

For each distinct gradient shape of ``--model`` (default: GoogLeNet at batch 128 and VGG-A at
batch 64; the shapes are read from the autodiff graph's ``BiasAddBackward`` nodes, not listed
here), in ``--dtype`` (default bfloat16):

* ``columns``: ``colsum.bias_add_backward(method='columns')``, the two-pass kernel of 2-byte loads;
* ``vector``: ``method='vector'`` (``colsum_vector``: 16-byte loads), at its default
  ``LOADS_PER_THREAD`` and, with ``--sweep``, at 4 and 16;
* ``codegen``: the generated kernel's rule (``codegen_rules``), as autotune runs it.

The summary's ``best before`` / ``best now`` sum the fastest method per shape without and with
``vector`` at its default loads (what autotune would pick per node: the sweep's other loads are
not offered to it). A shape ``vector`` declines (``colsum_vector.declines``) says why in its
``vector_declines`` field, and its ``vector`` rows time the ``columns`` kernel it falls back to.

Each is first checked against the float64 sums of the same values (within one bfloat16 ulp, or
2^-20 of the sum of magnitudes for float32), then timed: ``--calls`` launches captured into one
CUDA graph, the graph replayed through ``opgraph.benchmarks.timer.replayed_ms_per_call`` (CUDA
events, median of 20 after 3 warm-ups), divided by the calls: each step as the profile times it
("replayed alone"). Bytes: the gradient read once and C values written. The copy bandwidth is
measured in the run (``copy_bandwidth.measure_copy_bandwidth``); the target is 60 %.

Output: one JSON object per line (``"what": "run"``, then ``"what": "shape"`` per shape and method,
then ``"what": "summary"`` per model: the summed ms of each method over the model's bias
gradients, each shape counted as often as the model has it, and the fraction of the copy
bandwidth). Exit status 1 if any result is off. About 30 s on an H200.

    python scripts/bias_grad_bench.py [--model googlenet:128,vgg_a:64] [--sweep] [--json out.jsonl]
"""

from __future__ import annotations

import argparse
import collections
import difflib
import json
import sys


def bias_shapes(model: str, batch: int) -> collections.Counter:
    """``{(N, C, H, W): count}`` of the 4-D ``BiasAddBackward`` inputs of ``model``'s training step
    (forward plus parameter gradients, as ``opgraph-bench`` runs it)."""
    import opgraph as og
    from opgraph import ops
    from opgraph.benchmarks.models import build
    from opgraph.op import abstract_of
    m = build(model, batch=batch)
    outs = [m.output, *og.grad(m.output, m.params, grad_outputs=[m.output])]
    shapes = collections.Counter()
    for v in m.output.graph.nodes_in_order(outs):
        if isinstance(abstract_of(v.op), ops.BiasAddBackward) and len(v.inputs[0].type.shape) == 4:
            shapes[tuple(v.inputs[0].type.shape)] += 1
    return shapes


def model_specs(ap, text: str) -> list[tuple[str, int]]:
    """``--model``'s ``model:batch,...`` as ``[(model, batch)]``; a part without ``:batch``, an
    unknown model or a batch that is no positive whole number is ``ap.error`` (exit 2), naming it."""
    from opgraph.benchmarks.models import MODELS
    specs = []
    for part in text.split(","):
        model, sep, batch = part.strip().partition(":")
        if not sep or not batch.strip().isdigit() or int(batch) < 1:
            ap.error(f"--model {part!r}: give model:batch, the batch a positive whole number (googlenet:128)")
        if model not in MODELS:
            near = difflib.get_close_matches(model, MODELS, n=1)
            ap.error(f"--model {part!r}: no model {model!r}" + (f": did you mean {near[0]}?" if near else
                                                              f" (one of {', '.join(MODELS)})"))
        specs.append((model, int(batch)))
    return specs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="googlenet:128,vgg_a:64", help="model:batch,... (default googlenet:128,vgg_a:64)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--calls", type=int, default=20, help="launches per captured graph (default 20)")
    ap.add_argument("--sweep", action="store_true", help="also time vector at 4 and 16 loads per thread")
    ap.add_argument("--json", help="also write the lines to this file")
    args = ap.parse_args(argv)
    specs = model_specs(ap, args.model)
    if args.calls < 1:
        ap.error(f"--calls {args.calls}: must be at least 1")
    try:
        import cupy as cp
    except ImportError as e:
        ap.exit(2, f"{ap.prog}: error: it times CUDA kernels: it needs an NVIDIA GPU and CuPy "
                   f"(pip install -e \".[bench,cuda13]\", or cuda12); here: {e}\n")
    import numpy as np

    from opgraph import ops
    from opgraph.backends.copy_bandwidth import measure_copy_bandwidth
    from opgraph.backends.cuda import colsum, colsum_vector
    from opgraph.backends.cuda.storage import bits
    from opgraph.backends.registry import KernelContext, rules_for
    from opgraph.benchmarks.timer import replayed_ms_per_call
    from opgraph.types import TensorType, numpy_dtype

    lines = []

    def emit(rec):
        lines.append(rec)
        print(json.dumps(rec), flush=True)

    copy_gbps = measure_copy_bandwidth("cuda")["gbps"]
    emit({"what": "run", "dtype": args.dtype, "copy_gbps": copy_gbps, "calls": args.calls,
          "fields": "ms per call (graph replay / calls); of_copy = bytes / ms / copy bandwidth; "
                    "bytes = the gradient read once + C values written"})
    loads = [4, 16] if args.sweep else []
    codegen = rules_for(ops.BiasAddBackward)["codegen"]
    ok = True
    for model, batch in specs:
        shapes = bias_shapes(model, batch)
        totals = collections.defaultdict(float)
        moved = 0
        for shape, count in sorted(shapes.items()):
            n, c, h, w = shape
            rs = cp.random.RandomState(sum(shape))
            host = rs.standard_normal((n, h, w, c), dtype=cp.float32)
            if args.dtype == "bfloat16":
                u = (host.view(cp.uint32) >> 16).astype(cp.uint16)  # truncated: exact bfloat16 values
                gy = u.view(numpy_dtype("bfloat16")).transpose(0, 3, 1, 2)
                values = (u.astype(cp.uint32) << 16).view(cp.float32)
            else:
                gy = host.transpose(0, 3, 1, 2)
                values = host
            want = cp.asnumpy(values.astype(cp.float64).sum(axis=(0, 1, 2)))
            scale = cp.asnumpy(cp.abs(values.astype(cp.float64)).sum(axis=(0, 1, 2)))
            nbytes = gy.nbytes + c * gy.itemsize
            moved += count * nbytes
            out_type = TensorType((c,), args.dtype)
            ctx = KernelContext(cp, "cuda", {}, out_type)
            rows = gy.transpose(0, 2, 3, 1).reshape(-1, c)  # the (N*H*W, C) view bias_add_backward sums
            declines = colsum_vector.declines(rows)
            methods = [("columns", lambda: colsum.bias_add_backward(cp, gy, method="columns")),
                       ("vector", lambda: colsum.bias_add_backward(cp, gy, method="vector"))]
            if declines is None:  # the sweep: other loads per thread than the default autotune runs
                methods += [(f"vector@{k}", lambda k=k: colsum_vector.column_sums(cp, rows, loads_per_thread=k))
                            for k in loads if k != colsum_vector.LOADS_PER_THREAD]
            methods += [("codegen", lambda: codegen.kernel(ctx, ops.BiasAddBackward(), gy))]
            shape_ms = {}
            for label, fn in methods:
                got = fn()
                g = cp.asnumpy(bits(cp, got).astype(cp.uint32) << 16).view(np.float32) \
                    if args.dtype == "bfloat16" else cp.asnumpy(got)
                err = np.abs(g.astype(np.float64) - want)
                tol = (np.abs(want) * 2.0 ** -8 if args.dtype == "bfloat16" else 0) + scale * 2.0 ** -20 + 1e-30
                good = bool((err <= tol).all())
                ok &= good
                ms = replayed_ms_per_call(fn, args.calls)
                totals[label] += count * ms
                shape_ms[label] = ms
                emit({"what": "shape", "model": model, "shape": list(shape), "count": count, "method": label,
                      "ms": ms, "bytes": nbytes, "of_copy": nbytes / ms / 1e6 / copy_gbps, "correct": good,
                      "max_err_over_tol": float((err / tol).max()), "vector_declines": declines})
            # what autotune would pick per node: before (columns or codegen) and with the vector method
            totals["best before"] += count * min(shape_ms["columns"], shape_ms["codegen"])
            totals["best now"] += count * min(shape_ms[m] for m in ("columns", "vector", "codegen"))
        emit({"what": "summary", "model": model, "batch": batch, "gradients": sum(shapes.values()),
              "bytes": moved, "ms": dict(totals), "of_copy": {k: moved / v / 1e6 / copy_gbps for k, v in totals.items()}})
    if args.json:
        with open(args.json, "w") as f:
            f.writelines(json.dumps(x) + "\n" for x in lines)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
