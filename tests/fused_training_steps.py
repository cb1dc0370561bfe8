"""Training steps of small graphs whose fused chains the fusion table makes
(``passes/fuse_elementwise.py``), their feeds and the check of a fused run
against the float64 reference and the same compile with ``exclude=['fused']``;
shared by the GPU test (``tests/gpu/test_fuse_gpu.py``) and the same steps run
on the CPU through the g++ emulator (``tests/backends/test_codegen_training_steps.py``).

**bfloat16 storage: why gradients have no fixed tolerance.** Measured on the
CPU (emulated kernels; the reference kernels in float32 with every value
rounded once to bf16 give the same numbers), the bottleneck's parameter
gradients differ from the float64 reference by up to 0.12 to 0.36 relative
(the worst gradient, over seven seeds), with fusion on and off alike (seed 0:
a.w 0.28 fused, 0.28 unfused; the MBConv's head.w 0.049 and 0.045), while every node alone
is within 5e-3 of its reference on bf16-rounded inputs. Two things compound:
the forward values carry bf16 rounding (5e-3), so the ReLU masks of the
backward differ where a pre-activation is near 0 (15 of 8402 active elements
at the last ReLU), and a flipped mask passes a whole gradient element (there
the gradient's error jumps from 4e-3 to 5.5e-2: the square root of the
fraction flipped, not the rounding unit); the training batch norm's backward
then removes the per-channel mean and the ``xhat`` component of its
gradient, which a gradient that is constant per plane (global average
pooling) mostly is (16x smaller than its input on the projection), so the
flipped elements' share of what remains grows to 0.14, then 0.31 through
the next block. The fused and unfused runs flip different elements (their
rounding differs: the fused chain keeps BN + ReLU in float32), so they differ
from each other by as much (5e-2). The forward output and the running
statistics have no mask upstream of a cancelling sum: 5e-3.

So in bf16 the output and the state are held to :data:`TOLERANCE`, and each
gradient of the fused run to the unfused run's own distance from the float64
reference (:data:`BF16_GRADIENT_SLACK` times it, plus :data:`TOLERANCE`): a
fused chain that computes a wrong value moves a gradient by its whole size
(relative error ~1), beyond that allowance; a fused node's rounding is
checked alone, at 1e-2, by the per-node checks (``tests/backends/test_codegen_fused.py``,
``test_fuse_gpu.py::test_each_fused_node_passes_the_per_node_check``).
"""

from __future__ import annotations

import numpy as np

import opgraph as og
from opgraph.passes.fuse import OPT_IN_RULES
from modern_blocks import bottleneck, convnext_block, dense_block, mbconv

#: relative error allowed against the float64 reference (scaled as in :func:`step_errors`)
TOLERANCE = {"float32": 1e-3, "bfloat16": 3e-2}
#: bf16: a fused gradient's error may be this many times the unfused one's (module docstring;
#: measured at most 1.9: the MBConv's bn0.gamma, 1.3e-2 fused against 6.9e-3 unfused)
BF16_GRADIENT_SLACK = 2.0


def fan_out():
    """``relu(x)`` read by four branches ``relu(x * s_k)``: x's gradient sums four terms."""
    g = og.Graph("fan_out")
    x = g.input("x", (4, 16, 12, 12))
    h = og.relu(x)
    scales = [g.param(f"s{k}", (4, 16, 12, 12)) for k in range(4)]
    y = og.concat([og.flatten(og.relu(og.mul(h, s))) for s in scales], dim=1)
    return y, [x, *scales], []


def pooled():
    """conv + bias + ReLU, a 2x2 max pooling, conv + bias + ReLU: the first ReLU's gradient reads
    the pooling's gradient, a buffer of its own that dies there (with ``pool-relu-backward``
    excluded, which would route the ReLU's mask through the pooling's gather instead), so a
    ReLU gradient may overwrite it in place; both bias gradients sum a ReLU gradient."""
    g = og.Graph("pooled")
    x = g.input("x", (2, 3, 8, 8))
    w1, b1 = g.param("w1", (8, 3, 3, 3)), g.param("b1", (8,))  # 8 channels: whole 16-byte loads
    w2, b2 = g.param("w2", (8, 8, 3, 3)), g.param("b2", (8,))
    r1 = og.relu(og.conv2d(x, w1, b1, padding=1, name="conv1"), name="relu1")
    p1 = og.max_pool2d(r1, 2, name="pool1")
    y = og.relu(og.conv2d(p1, w2, b2, padding=1, name="conv2"), name="relu2")
    return y, [x, w1, b1, w2, b2], []


def convnext():
    """A small ConvNeXt block (``modern_blocks.convnext_block``, a per-channel scale for its
    depthwise convolution): layer norm, the Linear layers' bias adds, GELU (``bias-remat``)."""
    return convnext_block("scale", (2, 8, 3, 5))


MAKERS = {"bottleneck": bottleneck, "mbconv": mbconv, "fan_out": fan_out, "dense_block": dense_block,
          "convnext": convnext}


def training_step(make, rng):
    """``(outputs, feeds, n_grads)``: the output, the gradients of the
    parameters (seeded with the output itself) and the extra outputs (running
    statistics) of ``make()``, feeds drawn from ``rng`` (parameters x0.2) and
    how many of the outputs are gradients (after the first)."""
    y, params, extra = make()
    outs = [y, *og.grad(y, params, grad_outputs=[y]), *extra]
    feeds = {s.name: rng.standard_normal(s.type.shape) * (0.2 if s.op.role == "param" else 1.0)
             for s in y.graph.sources() if s.op.role in ("input", "param")}
    return outs, feeds, len(params)


def step_errors(fused, unfused, ref) -> list[tuple[float, float, float]]:
    """Per output: ``(fused - ref, unfused - ref, fused - unfused)`` norms over
    ``max(||ref||, 1e-3 * the largest ||ref||)`` (the floor: a gradient that is
    0 but for rounding). Host float arrays of any float dtype."""
    floor = 1e-3 * max(np.linalg.norm(r) for r in ref)
    out = []
    for a, b, r in zip(fused, unfused, ref):
        a, b, r = (np.asarray(v).astype(np.float64) for v in (a, b, r))
        scale = max(np.linalg.norm(r), floor)
        out.append((np.linalg.norm(a - r) / scale, np.linalg.norm(b - r) / scale, np.linalg.norm(a - b) / scale))
    return out


def rule_on_and_off(make, rule: str, seed: int = 0, without: tuple = ()):
    """``(on, off, errors)``: the training step of ``make()`` compiled on the
    CPU's oracle with the fused chains opted in (``include=['fused-reference']``),
    with and without fusion rule ``rule`` (both without the rules ``without``:
    a later rule that would rewrite what ``rule`` makes), and
    :func:`step_errors` of their outputs against the float64 reference; a rule of
    ``fuse.OPT_IN_RULES`` is named in the first compile's include."""
    outs, feeds, _ = training_step(make, np.random.default_rng(seed))
    ref = og.compile(outs, pipeline="reference", dtype="float64")(**feeds)
    include = ["fused-reference"]
    opt_in = [rule] if rule in OPT_IN_RULES else []  # a rule not yet run on a GPU runs when named
    on = og.compile(outs, device="cpu", policy={"include": include + opt_in, "exclude": list(without)})
    off = og.compile(outs, device="cpu", policy={"include": include, "exclude": [rule, *without]})
    return on, off, step_errors(on(**feeds), off(**feeds), ref)


def step_failures(fused, unfused, ref, n_grads: int, dtype: str) -> list[str]:
    """What fails the module docstring's criterion, one line per output
    (output 0, gradients 1..n_grads, then state); empty when all pass."""
    tol, bad = TOLERANCE[dtype], []
    for k, (fe, ue, fu) in enumerate(step_errors(fused, unfused, ref)):
        grad = 1 <= k <= n_grads
        if dtype == "bfloat16" and grad:
            ok = fe < BF16_GRADIENT_SLACK * ue + tol
        else:
            ok = fe < tol and ue < tol and fu < tol
        if not ok:
            bad.append(f"output {k} ({'gradient' if grad else 'output' if k == 0 else 'state'}): "
                       f"fused {fe:.3g}, unfused {ue:.3g}, fused-unfused {fu:.3g}")
    return bad


__all__ = ["TOLERANCE", "BF16_GRADIENT_SLACK", "fan_out", "pooled", "MAKERS", "training_step", "step_errors",
           "rule_on_and_off", "step_failures"]
