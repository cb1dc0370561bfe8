"""No step of a benchmark model runs the ``reference`` (or ``direct``) kernel on the GPU.

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

import pytest

import opgraph as og
from opgraph.benchmarks.models import MODELS, build
from opgraph.op import Lowered
from opgraph.passes.base import PassContext
from opgraph.passes.pipelines import default
from opgraph.passes.policy import LoweringPolicy

from modern_blocks import bottleneck, mbconv

FORBIDDEN = {"reference", "direct"}


def _steps(output, params, extra, layout, dtype):
    """Algorithm per op type of every lowered step of the training step."""
    grads = og.grad(output, params, grad_outputs=[output])
    outs = [output, *grads, *extra]
    pol = LoweringPolicy(layout=layout)
    ctx = PassContext(device="cuda", policy=pol, dtype=dtype)
    graph, louts = default(pol).run(output.graph, outs, ctx)
    steps = collections.Counter()
    for view in graph.nodes_in_order(louts):
        if isinstance(view.op, Lowered):
            steps[view.op.op.name, view.op.algorithm] += 1
    return steps, ctx.report


CASES = [pytest.param(lambda key=key: (lambda m: (m.output, m.params, []))(build(key, batch=2)), id=key)
         for key in MODELS] + [pytest.param(bottleneck, id="bottleneck"), pytest.param(mbconv, id="mbconv")]


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("make", CASES)
def test_no_step_runs_the_reference_on_the_gpu(make, layout, dtype):
    steps, report = _steps(*make(), layout, dtype)
    bad = {k: n for k, n in steps.items() if k[1] in FORBIDDEN}
    assert not bad, f"steps on the oracle on cuda: {bad}"
    generated = sum(n for (_, alg), n in steps.items() if alg == "codegen")
    assert generated and report.by_algorithm()["codegen"] == generated
    assert "codegen" in report.format()


def test_the_modern_blocks_use_the_generated_batch_norm_and_activations():
    steps, _ = _steps(*mbconv(), "NHWC", "bfloat16")
    for op in ("BatchNormStats", "BatchNormTraining", "BatchNormTrainingBackwardData",
               "BatchNormTrainingBackwardScale", "BatchNormRunningUpdate", "Silu", "SiluBackward", "Sigmoid",
               "Mul", "Mean", "MeanBackward", "Hardswish", "HardtanhBackward", "Dropout", "Add"):
        assert steps[op, "codegen"], (op, {k: n for k, n in steps.items() if k[0] == op})
