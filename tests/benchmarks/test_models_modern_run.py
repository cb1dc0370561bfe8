"""The modern convnets run end to end on the CPU through ``og.compile``'s
default pipeline (GEMM convolutions, fusion, memory plan) and agree with the
float64 reference executor, at batch 2 on a 64x64 image (global pooling lets
every model take it), with the benchmark's own feeds (``protocol.random_feeds``:
He-normal weights, batch-norm scales one) and training graph
(``protocol.training_graph``: the output is its own gradient, the new running
statistics are outputs too).

Two runs of the default pipeline: in float64, where the output, every
parameter gradient and every running statistic must equal the reference's
to rounding, which pins the lowerings themselves; and in float32, the
benchmark's dtype, where the output must agree to 1e-4 and every step the
lowering decides must pass the benchmark's per-node check. Whole-model
float32 gradients are not compared: through 50-120 layers of batch norm over
a few values per channel (2 x 2 x 2 in the last stage here) they compound
rounding to 1e-2 relative and more (0.06 on MobileNet-v2 with GEMM, 0.04 on
ResNet-50 with the reference kernels), which says nothing about a lowering.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import opgraph as og
from opgraph.benchmarks import check
from opgraph.benchmarks import models as M
from opgraph.benchmarks.protocol import random_feeds, training_graph

pytestmark = pytest.mark.slow

TOL64, OUTPUT_TOL32 = 1e-9, 1e-4
#: A value whose reference norm is below this fraction of its group's norm (all
#: gradients, all running statistics) is compared on that scale. Some are 0 in exact
#: arithmetic and both runs hold rounding noise, 1e-16 of the group in float64 (a
#: batch-norm bias read only through a convolution and another training-form batch norm:
#: the batch mean removes any per-channel shift; the running mean of a bias-free
#: convolution of such a norm's output).
FLOOR = 1e-6


def _errors(names, got, want) -> dict[str, float]:
    """Relative error of each array, on at least FLOOR of the group's norm."""
    scale = FLOOR * math.sqrt(sum(float(np.square(w).sum()) for w in want))
    return {n: float(np.linalg.norm(g - w) / max(np.linalg.norm(w), scale))
            for n, g, w in zip(names, got, want)}


@pytest.mark.parametrize("name", M.MODERN)
def test_default_pipeline_agrees_with_the_float64_reference(name):
    model = M.MODELS[name](batch=2, image=64)
    tg = training_graph(model)
    feeds = random_feeds(model, seed=3)
    ref = check.Reference(tg, feeds, "cpu")
    n, k = len(tg.grads), len(tg.state)
    assert k == len(model.state_updates) > 0 and len(ref.outputs) == 1 + n + k

    got = og.compile(tg.outputs, device="cpu", dtype="float64")(**feeds)
    errors = _errors(tg.output_names, got, ref.outputs)
    worst = max(errors, key=errors.get)
    assert errors[worst] < TOL64, (worst, errors[worst])

    exe = og.compile(tg.outputs, device="cpu")
    got = exe(**feeds)
    assert all(a.dtype == np.float32 and np.isfinite(a).all() for a in got)
    assert check.relative_error(np, got[0], ref.outputs[0]) < OUTPUT_TOL32
    res = check.check_lowering(exe, ref)
    assert res.passed and res.nodes_checked > 50, res.failures
