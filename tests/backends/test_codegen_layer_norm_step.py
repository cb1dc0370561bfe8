"""A ConvNeXt block's training step lowered for cuda on the CPU: permute to
channels-last, layer norm, two Linear layers with biases and GELU, permute
back, layer scale, residual (torchvision's CNBlock, small), in float32 and
bfloat16 NHWC. Its layer-norm steps and the sums of its Linear biases are
generated kernels (``codegen`` in the report), run through the g++ emulator
in the whole graph (the executor's layout changes around them included), and
the step matches the float64 reference pipeline by the criterion of the other
emulated training steps (``tests/fused_training_steps.py``), with and without the
first Linear's bias add recomputed for the GELU's gradient (``bias-remat``), and with and
without the layer norm's weight gradient filled by its data gradient's kernel
(``ln-backward-sums``)."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from codegen_emulated import emu, emulated_cuda_executable, needs_gxx  # noqa: F401  (emu: fixture)
from fused_training_steps import step_failures, training_step
import modern_blocks

pytestmark = needs_gxx


def convnext_block():
    """x (2, 8, 3, 5), h = s * x through a ConvNeXt block (``modern_blocks``): the scale stands for
    the depthwise convolution (its gradient needs LN's dx)."""
    return modern_blocks.convnext_block("scale", (2, 8, 3, 5))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_convnext_block_trains_on_the_generated_kernels(emu, dtype):
    outs, feeds, n_grads = training_step(convnext_block, np.random.default_rng(0))
    ref = og.compile(outs, pipeline="reference", dtype="float64")(**feeds)
    exe = emulated_cuda_executable(outs, {"layout": "NHWC", "include": ["ln-backward-sums"]}, dtype)
    off = emulated_cuda_executable(outs, {"layout": "NHWC", "exclude": ["fused"]}, dtype)
    apart = emulated_cuda_executable(outs, {"layout": "NHWC"}, dtype)
    # ln-backward-sums (opt-in until run on a GPU): the weight gradient filled by the data gradient's kernel
    fused = {"LayerNorm", "LayerNormBackwardDataSums", "LayerNormBackwardScaleSlot"}
    pair = {"LayerNorm", "LayerNormBackwardData", "LayerNormBackwardScale"}
    for run, ln_ops in ((exe, fused), (off, pair), (apart, pair)):
        algorithms = {st.op.op.name: st.op.algorithm for st in run.steps
                      if st.op.op.name.startswith("LayerNorm") or st.op.op.name == "SumTo"}
        assert ln_ops <= set(algorithms) and not (fused | pair) - ln_ops & set(algorithms), algorithms
        assert set(algorithms.values()) == {"codegen"}, algorithms
        assert not {st.op.algorithm for st in run.steps} & {"reference", "direct"}
    assert exe.report.fusion["ln-backward-sums"] == {"applied": 1, "declined": 0}
    assert apart.report.fusion["ln-backward-sums"] == {"applied": 0, "declined": 0, "opt_in": True}
    assert off.report.fusion["ln-backward-sums"] == {"excluded": True}
    got = exe(**feeds)
    assert {a.dtype.name for a in got[:1 + n_grads]} == {dtype}
    assert not step_failures(got, off(**feeds), ref, n_grads, dtype)
    assert not step_failures(apart(**feeds), off(**feeds), ref, n_grads, dtype)


def recomputed(notes) -> bool:
    return any("recomputed for an element-wise reader fused" in n for n in notes)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_its_first_linear_bias_recomputed_for_the_gelu_gradient_matches_the_reference(emu, dtype):
    """``bias-remat`` (``passes/remat_bias_add.py``) on and off: the GELU's gradient computes the bias
    add again in its own chain, in fp32, where the unfused step read the stored bf16 sum."""
    outs, feeds, n_grads = training_step(convnext_block, np.random.default_rng(0))
    ref = og.compile(outs, pipeline="reference", dtype="float64")(**feeds)
    exe = emulated_cuda_executable(outs, {"layout": "NHWC"}, dtype)
    off = emulated_cuda_executable(outs, {"layout": "NHWC", "exclude": ["bias-remat"]}, dtype)
    assert recomputed(exe.report.notes) and not recomputed(off.report.notes)
    got = exe(**feeds)
    assert not step_failures(got, off(**feeds), ref, n_grads, dtype)
