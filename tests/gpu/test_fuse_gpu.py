"""The fusion table's generated chains on the GPU (``passes/fuse_elementwise.py``):
a training step of the ResNet bottleneck, the MBConv block and a fan-out whose
gradient is an n-ary sum, compiled for cuda with fusion on, against the float64
reference pipeline and against the same compile with ``exclude=['fused']``, in
float32 and bfloat16 storage and both layouts (SEMANTICS.md tolerances); each
fused node checked alone by the benchmark's per-node check. Nothing is timed."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.backends.device import cuda_status

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_status()[0], reason=f"no GPU: {cuda_status()[1]}")]

TOLERANCE = {"float32": 1e-3, "bfloat16": 3e-2}


def fan_out():
    """``relu(x)`` read by four branches ``relu(x * s_k)``: x's gradient sums four terms."""
    g = og.Graph("fan_out")
    x = g.input("x", (4, 16, 12, 12))
    h = og.relu(x)
    scales = [g.param(f"s{k}", (4, 16, 12, 12)) for k in range(4)]
    y = og.concat([og.flatten(og.relu(og.mul(h, s))) for s in scales], axis=1)
    return y, scales, []


def rel_err(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / (np.linalg.norm(b) or 1.0))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_fused_training_steps_match_the_reference(cp, rng, layout, dtype):
    from modern_blocks import bottleneck, mbconv
    for make in (bottleneck, mbconv, fan_out):
        y, params, extra = make()
        outs = [y, *og.grad(y, params, grad_outputs=[y]), *extra]
        feeds = {s.name: rng.standard_normal(s.type.shape) * (0.2 if s.op.role == "param" else 1.0)
                 for s in y.graph.sources() if s.op.role in ("input", "param")}
        ref = og.compile(outs, pipeline="reference", dtype="float64")(**feeds)
        exe = og.compile(outs, device="cuda", policy={"layout": layout}, dtype=dtype)
        off = og.compile(outs, device="cuda", policy={"layout": layout, "exclude": ["fused"]}, dtype=dtype)
        fused = [st for st in exe.steps if st.op.op.name == "FusedElementwise"]
        assert fused and {st.op.algorithm for st in fused} == {"codegen"}, make.__name__
        assert not any(st.op.op.fused for st in off.steps)
        assert "reference" not in exe.report.by_algorithm()
        got, unfused = exe(**feeds), off(**feeds)
        floor = 1e-3 * max(np.linalg.norm(r) for r in ref)  # a gradient that is 0 but for rounding
        for k, (a, b, r) in enumerate(zip(got, unfused, ref)):
            a, b = cp.asnumpy(a).astype(np.float64), cp.asnumpy(b).astype(np.float64)
            scale = max(np.linalg.norm(r), floor)
            assert np.linalg.norm(a - r) / scale < TOLERANCE[dtype], (make.__name__, k)
            assert np.linalg.norm(a - b) / scale < TOLERANCE[dtype], (make.__name__, k)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_each_fused_node_passes_the_per_node_check(rng, dtype):
    from opgraph.benchmarks import check
    from opgraph.benchmarks.models import build
    from opgraph.benchmarks.protocol import random_feeds, training_graph

    for key in ("resnet50", "densenet121", "efficientnet_b0", "googlenet"):
        tg = training_graph(build(key, batch=2))
        feeds = random_feeds(tg.model, seed=3)
        ref = check.Reference(tg, feeds, "cuda")
        exe = og.compile(tg.outputs, device="cuda", policy={"layout": "NHWC"}, dtype=dtype)
        assert any(st.op.op.name == "FusedElementwise" for st in exe.steps), key
        res = check.check_lowering(exe, ref)
        assert res.passed, (key, res.failures[:5])
