"""No step of a benchmark model runs the ``reference`` (or ``direct``) kernel on
the GPU, and every step's rule declares that it can be captured into a CUDA
graph (``Rule.capturable``; ``opgraph/graph_replay.py`` reads it), so that the
whole training step can be one graph.

Every built-in model (``opgraph.benchmarks.models.MODELS``) and small graphs of
the modern-convnet ops (a ResNet bottleneck and an MBConv block with training
batch norm, squeeze-and-excitation, dropout and a classifier head) go through
the default pipeline's passes for device ``cuda``, without a GPU: the passes
only ask the rules, and a ``PassContext(device='cuda')`` needs no device
(``og.compile`` would refuse cuda here). cuDNN declines for lack of a GPU, so
convolutions take ``gemm``; every other step must find a GPU kernel, in both
layouts and in float32 and bfloat16 storage.
"""

from __future__ import annotations

import collections
import functools

import pytest

import opgraph as og
from opgraph.benchmarks.models import MODELS, build
from opgraph.backends.registry import lookup
from opgraph.op import Lowered
from opgraph.passes.base import PassContext
from opgraph.passes.pipelines import default
from opgraph.passes.policy import LoweringPolicy

from modern_blocks import bottleneck, mbconv

FORBIDDEN = {"reference", "direct"}


def _steps(output, params, extra, layout, dtype, members=False):
    """Algorithm per op type of every lowered step of the training step
    (``members``: a fused chain's member ops counted too, on its algorithm), the
    lowering report, and why each (op type, algorithm) would not be captured
    into a CUDA graph on a machine with the cuda extra (the rule's
    declaration: ``Rule.capture_blocker(installed=False)``)."""
    grads = og.grad(output, params, grad_outputs=[output])
    outs = [output, *grads, *extra]
    pol = LoweringPolicy(layout=layout)
    ctx = PassContext(device="cuda", policy=pol, dtype=dtype)
    graph, louts = default(pol).run(output.graph, outs, ctx)
    steps, blockers = collections.Counter(), {}
    for view in graph.nodes_in_order(louts):
        if isinstance(view.op, Lowered):
            key = view.op.op.name, view.op.algorithm
            steps[key] += 1
            for name in getattr(view.op.op, "members", ()) if members else ():
                steps[name, view.op.algorithm] += 1
            why = lookup(type(view.op.op), view.op.algorithm).capture_blocker(view.op.option_dict, installed=False)
            if why is not None:
                blockers[key] = why
    return steps, ctx.report, blockers


MAKERS = {**{key: (lambda key=key: (lambda m: (m.output, m.params, []))(build(key, batch=2))) for key in MODELS},
          "bottleneck": bottleneck, "mbconv": mbconv}


@functools.lru_cache(maxsize=None)
def _lowered(case: str, layout: str, dtype, members: bool = False):
    """:func:`_steps` of one case, computed once for the tests that read it."""
    return _steps(*MAKERS[case](), layout, dtype, members)


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", list(MAKERS))
def test_no_step_runs_the_reference_on_the_gpu(case, layout, dtype):
    steps, report, _ = _lowered(case, layout, dtype)
    bad = {k: n for k, n in steps.items() if k[1] in FORBIDDEN}
    assert not bad, f"steps on the oracle on cuda: {bad}"
    generated = sum(n for (_, alg), n in steps.items() if alg == "codegen")
    assert generated and report.by_algorithm()["codegen"] == generated
    assert "codegen" in report.format()


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", list(MAKERS))
def test_every_step_declares_itself_capturable(case, layout, dtype):
    _, _, blockers = _lowered(case, layout, dtype)
    # Without a GPU cuDNN declines and convolutions take gemm, which is left to the
    # replay's trial capture (backends/algorithms/rules.py says why); on a GPU they are cuDNN's.
    blockers = {k: why for k, why in blockers.items() if k[1] != "gemm"}
    assert not blockers, f"steps a CUDA graph could not capture on cuda: {blockers}"


def test_the_modern_blocks_use_the_generated_batch_norm_and_activations():
    steps, _, _ = _lowered("mbconv", "NHWC", "bfloat16", members=True)  # alone or in a fused chain
    for op in ("BatchNormStats", "BatchNormTraining", "BatchNormTrainingBackwardSums",
               "BatchNormBackwardSumsRow", "BatchNormTrainingBackwardDataFromSums", "BatchNormRunningUpdate", "Silu", "SiluBackward", "Sigmoid",
               "Mul", "Mean", "MeanBackward", "Hardswish", "HardtanhBackward", "Dropout", "Add"):
        assert steps[op, "codegen"], (op, {k: n for k, n in steps.items() if k[0] == op})


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_mobilenet_v2s_relu6_runs_inside_its_batch_norms_kernel(layout):
    """``Hardtanh.vjp`` reads the ReLU6's output (the same mask), so the batch
    norm's output has no reader but the ReLU6 and the two fuse: no ReLU6 runs
    as a step of its own, and every one runs inside a fused chain: its forward
    one and, recomputed (``bn-gradient-remat``), both passes of its batch
    norm's backward, so that its gradient is no step either."""
    alone, _, _ = _lowered("mobilenet_v2", layout, "bfloat16")
    members, _, _ = _lowered("mobilenet_v2", layout, "bfloat16", members=True)
    assert not [k for k in alone if k[0] == "Hardtanh"], alone
    assert members["Hardtanh", "codegen"] == 3 * 35  # every ReLU6 of torchvision's MobileNet-v2
    assert not [k for k in alone if k[0] == "HardtanhBackward"], alone
