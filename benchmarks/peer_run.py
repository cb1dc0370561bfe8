"""The PyTorch peers: eager, CUDA graph, ``torch.compile``, and both, checked and timed.

``--compare`` takes the four variants a performance engineer picks today
(:data:`VARIANTS`), each run on *our* model (:class:`.peer_torch.TorchModel`):

* ``torch``: eager, ``cudnn.benchmark = True``;
* ``torch+graph``: the whole training step (forward and ``autograd.grad``,
  the protocol's step) captured once in a CUDA graph after warm-up and
  replayed (:meth:`.peer_device.CudaPeerDevice.capture`);
* ``torch-compile``: ``torch.compile(dynamic=False)`` of the model function
  (Inductor, default mode; its backward is AOTAutograd's compiled one);
* ``torch-compile+graph``: the compiled step captured the same way.

The variants of one base (eager or compiled) share one model and one first
call, so ``torch-compile`` and ``torch-compile+graph`` share one compilation.
On the CPU the ``+graph`` variants are ``unavailable`` (no CUDA graphs).

Protocol, as close to the seed's as autograd allows: the model output passed
back as its output gradient (``torch.autograd.grad(y, params,
grad_outputs=y)``) with the image not requiring a gradient, so the first
convolution computes no input gradient (L1-L5: the image's gradient is asked
for too, as in opgraph's graph); one first call (timed: ``first_call_s``,
``torch.compile``'s compilation included); ``warmup`` steps; then, for the
variants without a graph, forward timed alone (autograd recording on, as in
training) and backward timed alone (``autograd.grad`` of a retained graph):
PyTorch computes a layer's input and weight gradients in one pass, so its
backward-data / backward-filter split is n/a. Every variant times the whole
step in one loop too (:mod:`.whole_step`): that is what the ratios compare.

Checks before timing, so that a wrong converter never times the wrong model:

1. **converter check** (:func:`converter_check`, once per model and
   precision): the peer in float64 on the run's device and layout, output
   and gradients against the float64 reference within
   :data:`CONVERTER_TOLERANCE` (float64 against float64: only summation
   order differs, while a wrong converter is off by far more);
2. the timed configuration's end-to-end errors are recorded, and a
   non-finite value is a mismatch;
3. a captured step, replayed once, must match its eager run's errors
   (:func:`.graph_column.graph_check`, as opgraph's ``+graph`` columns).
"""

from __future__ import annotations

import time

import attrs

from . import check as chk
from .graph_column import graph_check
from .peer_device import peer_device
from .peer_torch import TorchModel, autocast, import_torch, storage_dtype, tf32_flags, to_xp
from .records import error_fields
from .timer import Timing
from .whole_step import time_step

#: Largest relative error (output, each gradient) of the peer run in float64
#: against the float64 reference (see the module docstring).
CONVERTER_TOLERANCE = 1e-6


@attrs.frozen
class Variant:
    """One peer: ``name``, whether it runs ``torch.compile``d code, and whether
    its step is replayed as a CUDA graph."""

    name: str
    compiled: bool
    graph: bool

    def describe(self) -> str:
        base = ("torch.compile(dynamic=False) of the model function (Inductor, default mode)"
                if self.compiled else "PyTorch eager, cudnn.benchmark")
        return base + ("; the whole step captured once in a CUDA graph and replayed" if self.graph else "")


VARIANTS = {v.name: v for v in (Variant("torch", False, False), Variant("torch+graph", False, True),
                                Variant("torch-compile", True, False),
                                Variant("torch-compile+graph", True, True))}
PEERS = tuple(VARIANTS)


def _outputs(y, grads, device: str) -> list:
    return [to_xp(y, device), *(to_xp(g, device) for g in grads)]


def converter_check(model, feeds, reference, device: str, channels_last: bool, input_grad: bool) -> dict:
    """The peer in float64 against the float64 reference (module docstring).

    Returns:
        ``{"end_to_end": check.end_to_end(...), "tolerance", "passed", "why"}``.

    Raises:
        PeerError: PyTorch missing or an op without a converter.
    """
    torch = import_torch()
    tm = TorchModel(model, feeds, device, dtype=torch.float64, channels_last=channels_last,
                    input_grad=input_grad)
    y = tm.forward()
    e2e = chk.end_to_end(reference.xp, _outputs(y, tm.grads(y), device), reference)
    why = None
    if not e2e["finite"]:
        why = f"non-finite values in {', '.join(e2e['non_finite'][:3])}"
    else:
        for key, what in (("output", "the output"), ("max_grad", f"gradient {e2e['worst_grad']}")):
            if e2e[key] is not None and not e2e[key] <= CONVERTER_TOLERANCE:
                why = f"{what}: relative error {e2e[key]:.3g} > {CONVERTER_TOLERANCE:g}"
                break
    return {"end_to_end": e2e, "tolerance": CONVERTER_TOLERANCE, "passed": why is None, "why": why}


def compile_function(torch, fn):
    """``torch.compile(fn, dynamic=False)``. The backward loop reuses one
    forward's graph (``retain_graph=True``), which AOTAutograd's donated
    buffers forbid, so they are turned off; shapes never change here, so no
    dynamic-shape recompiles (they failed in Inductor on the H200)."""
    import torch._functorch.config as functorch_config

    functorch_config.donated_buffer = False
    return torch.compile(fn, dynamic=False)


def _drop_compiled(torch) -> None:
    """Drop what ``torch.compile`` built (Dynamo's caches, Inductor's graphs) and
    collect it, so that the columns timed after the peers in this process do
    not hold its memory. It was also a guess at why opgraph's host-bound eager
    ``auto`` column ran slower after the compiled peers (H200, 2026-12-02); it
    was not the cause: PyTorch's own eager column, first in its process, was
    as noisy (docs/performance.md, fourth session)."""
    import gc

    try:
        torch._dynamo.reset()
    except Exception:  # an older or stripped PyTorch: nothing to drop
        pass
    gc.collect()


def run_peers(model, feeds: dict, names, *, device: str, precision: str = "fp32", layout: str = "NCHW",
              warmup: int = 1, repeat: int = 3, reference=None, input_grad: bool = False,
              pdev=None) -> dict[str, dict]:
    """Run, check and time the peers ``names`` (:data:`PEERS`) on ``model``.

    Args:
        pdev: the peer device (:func:`.peer_device.peer_device` of ``device``
            when None; tests pass a stand-in).

    Returns:
        name -> outcome: ``status`` (``ok``, ``unavailable``, ``mismatch``,
        ``error``) and ``reason``; timed ones add ``times`` (``forward``,
        ``backward``: ``Timing.as_dict()``; None for a ``+graph`` variant),
        ``step`` (:func:`.whole_step.step_record`), ``first_call_s``
        (``capture_s`` too for a ``+graph`` variant), ``check``, ``memory``
        (``measured_peak_bytes``, ``reserved_peak_bytes``; cuda only) and
        ``versions``; ``converter_check`` where a reference was given.

    Raises:
        PeerError: PyTorch missing, or the model has an op without a converter.
    """
    torch = import_torch()
    pdev = pdev or peer_device(torch, device)
    out: dict[str, dict] = {}
    for name in names:
        why = pdev.graph_unavailable() if VARIANTS[name].graph else None
        if why is not None:
            out[name] = {"status": "unavailable", "reason": why}
    wanted = [n for n in names if n not in out]
    channels_last = layout.upper() == "NHWC"
    conv = None
    if wanted and reference is not None:
        conv = converter_check(model, feeds, reference, device, channels_last, input_grad)
        if not conv["passed"]:
            for n in wanted:
                out[n] = {"status": "mismatch", "converter_check": conv,
                          "reason": f"not timed: the peer in float64 differs from the reference: {conv['why']}"}
            wanted = []
        pdev.release()
    for compiled in (False, True):
        group = [n for n in wanted if VARIANTS[n].compiled == compiled]
        if not group:
            continue
        try:
            results = _session(torch, pdev, model, feeds, group, compiled, device=device,
                               precision=precision, channels_last=channels_last, warmup=warmup,
                               repeat=repeat, reference=reference, input_grad=input_grad)
        except Exception as e:  # e.g. compilation failed: the other base's variants still run
            results = {n: error_fields(e) for n in group}
        finally:
            if compiled:
                _drop_compiled(torch)
            pdev.release()
        for n, r in results.items():
            if conv is not None:
                r["converter_check"] = conv
            out[n] = r
    return {n: out[n] for n in names}


def _session(torch, pdev, model, feeds, group, compiled: bool, *, device, precision, channels_last,
             warmup, repeat, reference, input_grad) -> dict[str, dict]:
    """The variants ``group`` of one base (eager or compiled): one model, one
    first call, then each variant checked and timed (module docstring)."""
    # the running-statistics updates too: PyTorch's train() step updates them, as ours computes them
    tm = TorchModel(model, feeds, device, dtype=storage_dtype(torch, model.dtype),
                    channels_last=channels_last, input_grad=input_grad,
                    outputs=getattr(model, "forward_outputs", None))

    def forward():
        with autocast(torch, precision, device):
            return tm.forward()

    fwd = compile_function(torch, forward) if compiled else forward

    def step():
        y = fwd()
        return (y, *tm.grads(y))

    timer, results = pdev.timer, {}
    with tf32_flags(torch, precision):
        t0 = time.perf_counter()
        first = step()
        timer.synchronize()
        first_call_s = time.perf_counter() - t0
        e2e = chk.end_to_end(reference.xp, _outputs(first[0], first[1:], device), reference) \
            if reference is not None else None
        del first
        if e2e is not None and not e2e["finite"]:
            reason = f"not timed: non-finite values in {', '.join(e2e['non_finite'][:3])}"
            return {n: {"status": "mismatch", "reason": reason, "check": {"end_to_end": e2e, "passed": False}}
                    for n in group}
        common = {"status": "ok", "reason": None, "first_call_s": first_call_s, "versions": pdev.versions(),
                  "check": None if e2e is None else {"end_to_end": e2e, "passed": True}}
        memory = pdev.measure_memory(step)
        for _ in range(warmup):
            step()
        timer.synchronize()
        for name in sorted(group, key=lambda n: VARIANTS[n].graph):  # captures last: they keep memory
            if VARIANTS[name].graph:
                results[name] = _graphed(pdev, tm, step, common, e2e, reference, device, repeat)
                continue
            results[name] = {**common, "memory": memory, "times": _phases(timer, fwd, tm, name, repeat),
                             "step": time_step(timer, step, repeat, f"{name}/step")}
    return results


def _phases(timer, fwd, tm, name: str, repeat: int) -> dict:
    """Forward timed alone, then backward alone (``autograd.grad`` of one retained graph)."""
    t_fwd = Timing(timer.measure(fwd, label=f"{name}/forward", repeat=repeat))
    y = fwd()
    gy = y.detach()
    t_bwd = Timing(timer.measure(lambda: tm.grads(y, gy, retain_graph=True), label=f"{name}/backward",
                                 repeat=repeat))
    return {"forward": t_fwd.as_dict(), "backward": t_bwd.as_dict()}


def _graphed(pdev, tm, step, common: dict, e2e, reference, device: str, repeat: int) -> dict:
    """A ``+graph`` variant: ``step`` captured (:meth:`CudaPeerDevice.capture`),
    replayed once and checked against the eager run, then timed."""
    replay = static = None
    try:
        replay, static, capture_s, memory = pdev.capture(step)
        replay()
        pdev.timer.synchronize()
        rec = {**common, "times": None, "capture_s": capture_s, "memory": memory}
        if reference is not None:
            g_e2e = chk.end_to_end(reference.xp, _outputs(static[0], static[1:], device), reference)
            passed, why = graph_check(e2e, g_e2e)
            rec["check"] = {"end_to_end": g_e2e, "passed": passed}
            if not passed:
                return {**rec, "status": "mismatch", "reason": f"CUDA-graph replay: {why}"}
        rec["step"] = time_step(pdev.timer, replay, repeat, "step (CUDA graph)")
        return rec
    except Exception as e:  # the variants without a graph stand; say why this one did not
        return error_fields(e, "CUDA-graph capture failed: ")
    finally:
        del replay, static


__all__ = ["CONVERTER_TOLERANCE", "Variant", "VARIANTS", "PEERS", "converter_check", "compile_function",
           "run_peers"]
