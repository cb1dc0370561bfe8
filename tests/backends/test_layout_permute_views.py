"""ConvNeXt's permutes stay views in an NHWC graph (``passes/layout.py``).

A ConvNeXt block (depthwise convolution, permute to (N, H, W, C), layer norm,
Linear, GELU, Linear, layer scale, permute back, residual) compiled for cuda
with the NHWC policy: the permuted values and everything computed from them
up to the permute back are labelled NCHW (the C-contiguous (N, H, W, C) buffer
of the NHWC activation), so both permutes, forward and backward, return a
view of their input, the reshapes around the Linear layers too, no step's
output is copied into another layout by the executor, and each layer-norm row
(over C) is contiguous. The step runs on the generated kernels through the
g++ emulator (``codegen_emulated``) and matches the float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.types import is_channels_last, storage_order
from codegen_emulated import emu, emulated_cuda_executable, needs_gxx  # noqa: F401  (emu: fixture)
from fused_training_steps import step_failures, training_step
import modern_blocks

pytestmark = needs_gxx


def convnext_block():
    """x (2, 8, 5, 6) through a ConvNeXt block with its depthwise convolution (``modern_blocks``)."""
    return modern_blocks.convnext_block("dwconv", (2, 8, 5, 6))


def _run_keeping(exe, feeds):
    """Every step's stored result and inputs, ``{node: (stored, inputs)}``, and the
    names of the steps whose kernel's result the executor copied into NHWC storage."""
    slots, kept, forced = exe.feed(feeds), {}, []  # the output itself seeds the gradients
    for st in exe.steps:
        args = [slots[a] for a in st.args]
        raw = getattr(st.kernel, "__wrapped__", st.kernel)(st.ctx, st.op.op, *args)
        slots[st.node] = st.kernel(st.ctx, st.op.op, *args)
        t = exe.graph.node(st.node).type
        if t.ndim == 4 and t.layout == "NHWC" and t.shape[1] > 1 and t.shape[2] * t.shape[3] > 1 \
                and not is_channels_last(raw):
            forced.append(st.name)
        kept[st.node] = (slots[st.node], args)
    return kept, forced


def test_permuted_values_are_contiguous_views(emu):
    outs, feeds, n_grads = training_step(convnext_block, np.random.default_rng(0))
    exe = emulated_cuda_executable(outs, {"layout": "NHWC"}, "float32")
    graph = exe.graph
    steps = {st.node: st for st in exe.steps}
    transposes = [n for n in steps if steps[n].op.op.name == "Transpose"]
    assert len(transposes) == 4  # forward and backward, each way
    for n in transposes:
        perm, x = steps[n].op.op.perm, graph.node(steps[n].args[0]).type
        assert (x.layout, graph.node(n).type.layout) == (
            ("NHWC", "NCHW") if perm == (0, 2, 3, 1) else ("NCHW", "NHWC")), (perm, x)
    norms = [n for n in steps if steps[n].op.op.name.startswith("LayerNorm")]
    assert norms and all(graph.node(a).type.layout == "NCHW" for n in norms for a in steps[n].args
                         if graph.node(a).type.ndim == 4)
    kept, forced = _run_keeping(exe, feeds)
    assert not forced
    for n in transposes + [n for n in steps if steps[n].op.op.name == "Reshape"]:
        stored, (x,) = kept[n]
        assert np.shares_memory(stored, x), (steps[n].name, "copied")
    for n, (stored, _) in kept.items():
        t = graph.node(n).type
        if t.ndim == 4 and t.shape[1] > 1 and t.shape[2] * t.shape[3] > 1:
            assert storage_order(stored) == t.layout, steps[n].name
    for n in norms:
        x = kept[n][1][0]
        assert x.strides[-1] == x.itemsize and x.flags.c_contiguous  # each row over C contiguous


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_block_step_matches_the_reference(emu, dtype):
    outs, feeds, n_grads = training_step(convnext_block, np.random.default_rng(1))
    ref = og.compile(outs, pipeline="reference", dtype="float64")(**feeds)
    exe = emulated_cuda_executable(outs, {"layout": "NHWC"}, dtype)
    off = emulated_cuda_executable(outs, {"layout": "NHWC", "exclude": ["fused"]}, dtype)
    assert {st.op.algorithm for st in exe.steps if st.op.op.name in ("Transpose", "LayerNorm")} == {"codegen"}
    assert not step_failures(exe(**feeds), off(**feeds), ref, n_grads, dtype)
