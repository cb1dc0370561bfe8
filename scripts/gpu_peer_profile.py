"""Where the PyTorch peer's training step spends its device time, by kernel.

``opgraph-bench --profile`` says where *our* step's time goes per op type;
this script says the same of the strongest peer, ``torch.compile`` (Inductor,
default mode), on the same model, so that a gap can be put in the
convolutions or in the memory-bound steps before anything is changed
(docs/performance.md). The peer is the one ``opgraph-bench --compare`` times
(:class:`opgraph.benchmarks.peer_torch.TorchModel`, compiled by
:func:`opgraph.benchmarks.peer_run.compile_function`: forward, then
``autograd.grad`` of the parameters with the output as its own gradient,
running statistics updated).

After the first call (the compile) and ``--warmup`` steps, ``--steps`` steps
run under ``torch.profiler`` (CUDA activity only; the step is *not* captured
in a CUDA graph, so every kernel is seen by name; the kernels are the same
ones ``torch-compile+graph`` replays). Each kernel's device time is summed
and divided by the steps, then grouped (:func:`kernel_group`):

* ``library``: cuDNN, cuBLAS and CUTLASS kernels (convolutions, GEMMs and
  their layout transforms), the compute-bound side;
* ``triton``: Inductor's generated kernels (its fused element-wise chains,
  batch-norm reductions, pooling), the memory-bound side;
* ``other``: PyTorch's own ATen kernels (copies, fills, pooling it did not
  generate).

Usage (on a GPU machine with PyTorch)::

    python scripts/gpu_peer_profile.py --model densenet121 --json out.json
    python scripts/gpu_peer_profile.py --model vgg_a --dtype float32 --precision tf32
    python scripts/gpu_peer_profile.py --model tests/onnx/models/convnext_tiny.onnx --batch 128
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import defaultdict

#: Name fragments of library (cuDNN / cuBLAS / CUTLASS) kernels, lower case.
LIBRARY_KERNEL = re.compile(r"cudnn|cublas|cutlass|xmma|gemm|implicit|conv|wgrad|dgrad|fprop|sm\d\d_")


def kernel_group(name: str) -> str:
    """``'triton'``, ``'library'`` or ``'other'`` for a CUDA kernel's name
    (module docstring). Inductor names its kernels ``triton_...``; a Triton
    matmul template is still Inductor's, so ``triton`` is tested first."""
    low = name.lower()
    if low.startswith("triton") or "triton_" in low:
        return "triton"
    return "library" if LIBRARY_KERNEL.search(low) else "other"


def summarise(kernels, steps: int, top: int = 40) -> dict:
    """Group ``kernels`` (``(name, total_us, calls)`` over ``steps`` steps) per step.

    Returns:
        ``step_ms`` (the kernels' summed device time per step), ``groups``
        (group -> ``ms`` per step, ``share``, ``kernels`` launched per step)
        and ``top`` (the ``top`` kernels by time: name, group, ``ms`` and
        ``calls`` per step).

    Raises:
        ValueError: ``steps`` < 1.
    """
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    groups: dict[str, dict] = defaultdict(lambda: {"ms": 0.0, "kernels": 0.0})
    rows = []
    for name, total_us, calls in kernels:
        ms, per_step = total_us / 1e3 / steps, calls / steps
        g = kernel_group(name)
        groups[g]["ms"] += ms
        groups[g]["kernels"] += per_step
        rows.append({"name": name, "group": g, "ms": ms, "calls": per_step})
    total = sum(g["ms"] for g in groups.values())
    for g in groups.values():
        g["share"] = g["ms"] / total if total else 0.0
    rows.sort(key=lambda r: -r["ms"])
    return {"step_ms": total, "groups": dict(groups), "top": rows[:top]}


def _kernel_rows(prof, torch):
    """``(name, device us, calls)`` of every CUDA kernel the profiler saw."""
    cuda = torch.autograd.DeviceType.CUDA
    out = []
    for e in prof.key_averages():
        if getattr(e, "device_type", None) != cuda:
            continue
        us = getattr(e, "self_device_time_total", None)
        if us is None:  # PyTorch < 2.4 names it after CUDA
            us = e.self_cuda_time_total
        if us > 0:
            out.append((e.key, float(us), int(e.count)))
    return out


def build_model(name: str, dtype: str, batch: int | None):
    """opgraph-bench's model ``name``, or, for a name ending in ``.onnx``, that
    file imported as ``opgraph-bench --onnx`` imports it (``batch``: the
    file's when None); ``batch`` also overrides a built-in model's."""
    from opgraph.benchmarks.models import build
    from opgraph.benchmarks.onnx_model import load_model

    if name.endswith(".onnx"):
        return load_model(name, batch=batch, dtype=dtype)
    return build(name, batch=batch, dtype=dtype)


def profile_peer(model, dtype: str, precision: str, layout: str, warmup: int, steps: int) -> dict:
    """The record of ``model`` (:func:`build_model`'s, in ``dtype``): the peer built,
    compiled (its first call timed: ``first_call_s``, seconds), ``warmup`` steps,
    then ``steps`` steps profiled; :func:`summarise`'s fields (ms per step) and
    the versions. Needs CUDA and PyTorch (their errors propagate)."""
    import torch

    from opgraph.benchmarks.peer_device import peer_device
    from opgraph.benchmarks.peer_run import compile_function
    from opgraph.benchmarks.peer_torch import TorchModel, autocast, storage_dtype, tf32_flags
    from opgraph.benchmarks.protocol import random_feeds

    peer_device(torch, "cuda")  # configured as opgraph-bench's peers are (cudnn.benchmark on)
    tm = TorchModel(model, random_feeds(model), "cuda", dtype=storage_dtype(torch, model.dtype),
                    channels_last=layout.upper() == "NHWC", outputs=model.forward_outputs)

    def forward():
        with autocast(torch, precision, "cuda"):
            return tm.forward()

    fwd = compile_function(torch, forward)

    def step():
        y = fwd()
        return (y, *tm.grads(y))

    with tf32_flags(torch, precision):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        first_call_s = time.perf_counter() - t0
        for _ in range(warmup):
            step()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
    summary = summarise(_kernel_rows(prof, torch), steps)
    return {"model": model.key, "batch": model.batch, "dtype": dtype, "precision": precision,
            "layout": layout.upper(), "peer": "torch-compile", "first_call_s": first_call_s,
            "steps": steps, "versions": {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                                         "device": torch.cuda.get_device_name()}, **summary}


def build_models(names, dtype: str, batch: int | None) -> list:
    """``names`` (``--model``'s items) built at ``batch`` in ``dtype``
    (:func:`build_model`), all before the first is profiled, so that a typo in
    the last one is not found after the others ran.

    Raises:
        ValueError: an item that does not build (an unknown name, an unreadable
            file, a dtype a model does not take), named in the message.
    """
    models = []
    for name in names:
        try:
            models.append(build_model(name, dtype, batch))
        except Exception as e:
            raise ValueError(f"--model {name}: {str(e).strip() or type(e).__name__}") from None
    return models


def no_cuda() -> str | None:
    """Why PyTorch cannot profile on a GPU here, or None."""
    try:
        import torch
    except ImportError:
        return "needs PyTorch (with CUDA): it is not installed"
    if not torch.cuda.is_available():
        return f"needs a CUDA GPU and a CUDA build of PyTorch; torch {torch.__version__} sees none"
    return None


def main(argv=None) -> int:
    from opgraph.precision import PRECISIONS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + " Needs a CUDA GPU and PyTorch built for it.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="densenet121",
                   help="comma-separated model names (opgraph-bench's) or ONNX files (ending in .onnx)")
    p.add_argument("--batch", type=int, help="mini-batch (default: the model's; an ONNX file's own)")
    p.add_argument("--dtype", default="bfloat16", help="storage dtype")
    p.add_argument("--precision", default="bf16", choices=PRECISIONS)
    p.add_argument("--layout", default="NHWC", choices=["NHWC", "NCHW", "nhwc", "nchw"])
    p.add_argument("--warmup", type=int, default=3, help="steps run before the profiled ones")
    p.add_argument("--steps", type=int, default=5, help="profiled steps")
    p.add_argument("--top", type=int, default=25, help="kernels printed per model")
    p.add_argument("--json", help="write the records here")
    a = p.parse_args(argv)
    if a.steps < 1 or a.warmup < 0:
        p.error(f"--steps must be >= 1 and --warmup >= 0, got {a.steps} and {a.warmup}")
    if a.batch is not None and a.batch < 1:
        p.error(f"--batch must be >= 1, got {a.batch}")
    try:
        models = build_models(a.model.split(","), a.dtype, a.batch)
    except ValueError as e:
        p.error(str(e))
    why = no_cuda()
    if why:
        p.error(why)
    records = []
    for model in models:
        r = profile_peer(model, a.dtype, a.precision, a.layout, a.warmup, a.steps)
        records.append(r)
        print(f"== {r['model']} b{r['batch']} {a.dtype} {a.precision} {r['layout']} torch-compile: "
              f"kernels {r['step_ms']:.3f} ms/step, first call {r['first_call_s']:.1f} s")
        for g, v in sorted(r["groups"].items(), key=lambda kv: -kv[1]["ms"]):
            print(f"  {g:8s} {v['ms']:8.3f} ms {v['share']:6.1%} {v['kernels']:7.1f} kernels")
        for k in r["top"][:a.top]:
            print(f"  {k['ms']:8.3f} ms {k['calls']:6.1f}x {k['group']:8s} {k['name'][:110]}")
        if a.json:  # rewritten after every model, so a call cut short keeps what it did
            from opgraph.atomic_file import write_atomic
            write_atomic(a.json, json.dumps({"tool": "gpu_peer_profile", "records": records}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
