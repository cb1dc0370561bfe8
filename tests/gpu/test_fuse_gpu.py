"""The fusion table's generated chains on the GPU (``passes/fuse_elementwise.py``):
a training step of the ResNet bottleneck, the MBConv block and a fan-out whose
gradient is an n-ary sum, compiled for cuda with fusion on, against the float64
reference pipeline and against the same compile with ``exclude=['fused']``, in
float32 and bfloat16 storage and both layouts; each
fused node checked alone by the benchmark's per-node check. Nothing is timed.
The steps and the criterion are ``tests/fused_training_steps.py``'s."""

from __future__ import annotations

import pytest

import opgraph as og
from opgraph.backends.device import cuda_status
from fused_training_steps import MAKERS, step_failures, training_step

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_status()[0], reason=f"no GPU: {cuda_status()[1]}")]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_fused_training_steps_match_the_reference(cp, rng, layout, dtype):
    """``tests/fused_training_steps.py`` gives the criterion (bf16 gradients
    against the unfused run's own error: a ReLU mask flipped by bf16 rounding
    and the batch-norm backward's cancellation leave them ~0.3 from the float64
    values with or without fusion); the same steps run on the CPU emulator in
    ``tests/backends/test_codegen_training_steps.py``."""
    for case, make in MAKERS.items():
        outs, feeds, n_grads = training_step(make, rng)
        ref = og.compile(outs, pipeline="reference", dtype="float64")(**feeds)
        exe = og.compile(outs, device="cuda", policy={"layout": layout}, dtype=dtype)
        off = og.compile(outs, device="cuda", policy={"layout": layout, "exclude": ["fused"]}, dtype=dtype)
        fused = [st for st in exe.steps if st.op.op.name == "FusedElementwise"]
        assert fused and {st.op.algorithm for st in fused} == {"codegen"}, case
        assert not any(st.op.op.fused for st in off.steps)
        assert "reference" not in exe.report.by_algorithm()
        got, unfused = [cp.asnumpy(a) for a in exe(**feeds)], [cp.asnumpy(b) for b in off(**feeds)]
        bad = step_failures(got, unfused, ref, n_grads, dtype)
        assert not bad, (case, bad)


@pytest.mark.parametrize("key", ["resnet50", "densenet121", "efficientnet_b0", "mobilenet_v2", "googlenet"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_each_fused_node_passes_the_per_node_check(rng, dtype, key):
    """One model per test (DenseNet-121's ~2,000 nodes take most of a minute), so a
    device call's time limit cuts between models, not inside one test."""
    from opgraph.benchmarks import check
    from opgraph.benchmarks.models import build
    from opgraph.benchmarks.protocol import random_feeds, training_graph

    tg = training_graph(build(key, batch=2))
    feeds = random_feeds(tg.model, seed=3)
    ref = check.Reference(tg, feeds, "cuda")
    exe = og.compile(tg.outputs, device="cuda", policy={"layout": "NHWC"}, dtype=dtype)
    assert any(st.op.op.name == "FusedElementwise" for st in exe.steps), key
    res = check.check_lowering(exe, ref)
    assert res.passed, (key, res.failures[:5])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("bias", [True, False])
def test_a_folded_inference_batch_norm_matches_the_reference(cp, layout, dtype, bias):
    """``bn-fold`` on the GPU: conv -> inference batch norm -> ReLU forward (and the
    convolution's gradients under the frozen batch norm) folded, the folded
    convolution in cuDNN's conv + bias + ReLU graph, the folding ops generated,
    against the float64 reference pipeline."""
    import numpy as np
    from inference_blocks import conv_bn_relu
    g, y, params, feeds = conv_bn_relu(bias)
    outs = [y, *og.grad(y, params[:1 + bias], grad_outputs=[y])]
    exe = og.compile(outs, device="cuda", policy={"layout": layout}, dtype=dtype)
    assert any("folded into the weights) fused" in n for n in exe.report.notes), exe.report.notes
    assert "reference" not in exe.report.by_algorithm()
    tol = 2e-2 if dtype == "bfloat16" else 1e-4
    # the oracle reads the inputs as the compiled graph stores them: without a bias this
    # block's weight gradient cancels, and rounding x alone to bf16 moves it by 3.5 % of
    # its largest entry in float64 (the H200 failed it at 3.6 %, as does the CPU with or
    # without bn-fold); against the rounded inputs the bf16 run is within 0.9 %
    stored = {k: og.types.as_dtype(np, v, dtype).astype(np.float32) for k, v in feeds.items()}
    for got, want in zip(exe(**feeds), og.compile(outs, pipeline="reference", dtype="float64")(**stored)):
        got = cp.asnumpy(got).astype(np.float64)
        assert np.abs(got - want).max() <= tol * np.abs(want).max()
