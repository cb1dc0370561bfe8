"""compile(dtype=...) on a graph declared in float32: values run in the override,
except batch statistics, which stay float32 under half storage (SEMANTICS.md,
training BatchNorm: statistics in fp32; opgraph/run_types.py)."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.run_types import run_types

from modern_blocks import mbconv


def _training_step():
    y, params, extra = mbconv()
    grads = og.grad(y, params, grad_outputs=[y])
    return y, params, [y, *grads, *extra]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_statistics_run_in_float32_under_half_storage(dtype):
    y, _, outs = _training_step()
    g = y.graph
    types = run_types(g, g.ancestors(outs), dtype)
    stats = [n for n in types if g.node(n).op.name == "BatchNormStats"]
    assert stats and all(types[n].dtype == "float32" for n in stats)
    convs = [n for n in types if g.node(n).op.name == "Conv2d"]
    assert convs and all(types[n].dtype == dtype for n in convs)
    assert run_types(g, g.ancestors(outs), None)[stats[0]] == g.node(stats[0]).type


def test_a_fused_training_step_under_a_bfloat16_override_runs_and_keeps_float32_statistics():
    """The kernels get the run types (KernelContext.out_type): the fused programs'
    members check their inputs, and a bf16 statistics array was refused on the H200
    ('stats must be float32[2, 32] ..., got bfloat16[2, 32]')."""
    y, params, outs = _training_step()
    rng = np.random.default_rng(0)
    feeds = {s.name: rng.standard_normal(s.type.shape) * (0.2 if s.op.role == "param" else 1.0)
             for s in y.graph.sources() if s.op.role in ("input", "param")}
    exe = og.compile(outs, policy={"include": ["fused-reference"]}, dtype="bfloat16")
    assert any(st.op.op.name == "FusedElementwise" for st in exe.steps)
    stats = [st for st in exe.steps if st.op.op.name == "BatchNormStats"]
    assert stats and all(st.ctx.out_type.dtype == "float32" for st in stats)
    got = exe(**feeds)
    ref = og.compile(outs, pipeline="reference", dtype="float64")(**feeds)
    # the running means and variances (the last outputs) against float64, on bf16's scale
    for a, b in zip(got[-8:], ref[-8:]):
        a = np.asarray(a, dtype=np.float64)
        assert np.abs(a - b).max() <= 2e-2 * max(1.0, np.abs(b).max())
