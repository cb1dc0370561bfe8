"""The GPU test of the fused training steps (``tests/gpu/test_fuse_gpu.py``) on
the CPU: the bottleneck, MBConv and fan-out steps lowered for cuda in float32
and bfloat16 storage, both layouts, their generated kernels run through the
g++ emulator (the GEMM convolutions and cuBLAS products as the reference in
float32, rounded to the storage type), with fusion on and with
``exclude=['fused']``, against the float64 reference pipeline by the same
criterion (``tests/fused_training_steps.py``: why bf16 gradients are held to
the unfused run's error, not to a fixed tolerance)."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from codegen_emulated import emu, emulated_cuda_executable, needs_gxx  # noqa: F401  (emu: fixture)
from fused_training_steps import MAKERS, step_failures, training_step

pytestmark = needs_gxx


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", list(MAKERS))
def test_fused_training_step_on_the_emulated_kernels(emu, case, dtype, layout):
    outs, feeds, n_grads = training_step(MAKERS[case], np.random.default_rng(0))
    ref = og.compile(outs, pipeline="reference", dtype="float64")(**feeds)
    exe = emulated_cuda_executable(outs, {"layout": layout}, dtype)
    off = emulated_cuda_executable(outs, {"layout": layout, "exclude": ["fused"]}, dtype)
    fused = [st for st in exe.steps if st.op.op.name == "FusedElementwise"]
    assert fused and {st.op.algorithm for st in fused} == {"codegen"}
    assert not any(st.op.op.fused for st in off.steps)
    got, unfused = exe(**feeds), off(**feeds)
    assert {a.dtype.name for a in got[:1 + n_grads]} == {dtype}
    assert not step_failures(got, unfused, ref, n_grads, dtype)
