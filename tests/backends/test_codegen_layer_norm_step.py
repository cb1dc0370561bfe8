"""A ConvNeXt block's training step lowered for cuda on the CPU: permute to
channels-last, layer norm, two Linear layers with biases and GELU, permute
back, layer scale, residual (torchvision's CNBlock, small), in float32 and
bfloat16 NHWC. Its layer-norm steps and the sums of its Linear biases are
generated kernels (``codegen`` in the report), run through the g++ emulator
in the whole graph (the executor's layout changes around them included), and
the step matches the float64 reference pipeline by the criterion of the other
emulated training steps (``tests/fused_training_steps.py``)."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph import ops
from codegen_emulated import emu, emulated_cuda_executable, needs_gxx  # noqa: F401  (emu: fixture)
from fused_training_steps import step_failures, training_step

pytestmark = needs_gxx


def convnext_block():
    """x (2, 8, 3, 5), h = s * x -> h + gamma * permute(fc2(gelu(fc1(LN(permute(h)))))), biases
    broadcast (the scale s stands for the depthwise convolution: its gradient needs LN's dx)."""
    g = og.Graph("cnblock")
    x = g.input("x", (2, 8, 3, 5))
    p = {name: g.param(name, shape) for name, shape in [("ln.w", (8,)), ("ln.b", (8,)), ("fc1.w", (8, 16)),
                                                        ("fc1.b", (16,)), ("fc2.w", (16, 8)), ("fc2.b", (8,)),
                                                        ("gamma", (8, 1, 1)), ("s", (8, 1, 1))]}

    def linear(h, w, b, cout):
        flat = og.reshape(h, (-1, h.type.shape[-1]))
        y = og.reshape(og.matmul(flat, w), (*h.type.shape[:-1], cout))
        return g.apply(ops.BroadcastAdd, {}, [y, b])

    x = og.mul(p["s"], x)
    h = og.layer_norm(og.permute(x, (0, 2, 3, 1)), 8, p["ln.w"], p["ln.b"], eps=1e-6)
    h = linear(og.gelu(linear(h, p["fc1.w"], p["fc1.b"], 16)), p["fc2.w"], p["fc2.b"], 8)
    y = og.add(x, og.mul(p["gamma"], og.permute(h, (0, 3, 1, 2))))
    return y, list(p.values()), []


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_convnext_block_trains_on_the_generated_kernels(emu, dtype):
    outs, feeds, n_grads = training_step(convnext_block, np.random.default_rng(0))
    ref = og.compile(outs, pipeline="reference", dtype="float64")(**feeds)
    exe = emulated_cuda_executable(outs, {"layout": "NHWC"}, dtype)
    off = emulated_cuda_executable(outs, {"layout": "NHWC", "exclude": ["fused"]}, dtype)
    for run in (exe, off):
        algorithms = {st.op.op.name: st.op.algorithm for st in run.steps
                      if st.op.op.name.startswith("LayerNorm") or st.op.op.name == "SumTo"}
        assert {"LayerNorm", "LayerNormBackwardData", "LayerNormBackwardScale"} <= set(algorithms)
        assert set(algorithms.values()) == {"codegen"}, algorithms
        assert not {st.op.algorithm for st in run.steps} & {"reference", "direct"}
    got = exe(**feeds)
    assert {a.dtype.name for a in got[:1 + n_grads]} == {dtype}
    assert not step_failures(got, off(**feeds), ref, n_grads, dtype)
