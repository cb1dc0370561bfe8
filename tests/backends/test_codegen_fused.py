"""Fused programs (``FusedElementwise``) built by hand, compiled into one
kernel per phase and run on the CPU through the g++ emulator, against the
fused node's reference (the members' own reference kernels in order, on
float64 copies): BN-apply + ReLU, batch statistics + BN + ReLU (a reduction
phase, then the sweep), ReLU-backward + bias gradient (one reduction, nothing
full-size written), SiLU times its squeeze-and-excitation scale, a gradient
sum of three addends, the two per-channel sums of a batch-norm backward
stacked in one output, ReLU-backward into the batch-norm data gradient, and
a residual add of a branch scaled per sample (stochastic depth: an
``(N, 1, 1, 1)`` operand, once read as per-plane, out of bounds)."""

from __future__ import annotations

import numpy as np
import pytest

from codegen_cases import SHAPES, fused_cases
from codegen_emulated import emu, launched, needs_gxx, run_case  # noqa: F401  (emu: fixture)
from opgraph.backends.reference.fused import run_program
from opgraph.backends.registry import KernelContext

pytestmark = needs_gxx

CASES = fused_cases()
#: kernels each program needs (its phases), before any split of a reduction
PHASES = {"bn_relu": ["sweep"], "stats_bn_relu": ["reduce", "sweep"], "relu_bwd_bias_grad": ["reduce"],
          "silu_se_scale": ["reduce", "sweep"], "grad_sum_3": ["sweep"], "bn_backward_sums": ["reduce"],
          "relu_bwd_bn_backward_data": ["reduce", "sweep"], "stochastic_depth_residual": ["sweep"],
          "bias_gelu_backward": ["sweep"], "bias_relu_channel_sums": ["reduce"],
          "bias_se_scale": ["reduce", "sweep"]}


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name,op,kinds", CASES, ids=[c[0] for c in CASES])
def test_fused_program_against_its_members(emu, name, op, kinds, dtype, layout):
    shape = SHAPES[layout]
    out, ref, arrays = run_case(op, kinds, shape, dtype, layout)
    assert launched(emu) == PHASES[name]
    if name == "bn_backward_sums":  # stacked in the statistics dtype
        assert out.shape == (2, shape[1]) and out.dtype == np.float32


def test_one_kernel_writes_no_intermediate(emu):
    """BN + ReLU as one sweep: its only full-size store is the output."""
    name, op, kinds = CASES[0]
    run_case(op, kinds, SHAPES["NHWC"], "bfloat16", "NHWC")
    (sweep,) = emu.raw_launches
    assert sweep["source"].count("reinterpret_cast<uint4*>(out") == 1 and "carry" not in sweep["source"]


def test_the_reference_of_a_program_is_the_members_in_order():
    name, op, kinds = CASES[2]  # ReLU-backward + bias gradient
    rng = np.random.default_rng(0)
    y, gy = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((2, 3, 4, 5))
    values = run_program(KernelContext(np), op.program, [y, gy])
    np.testing.assert_array_equal(values[2], np.where(y > 0, gy, 0))
    np.testing.assert_allclose(values[3], values[2].sum(axis=(0, 2, 3)), rtol=1e-12)


@pytest.mark.parametrize("layout,packed", [("NCHW", True), ("NHWC", False)])
def test_a_trailing_bias_is_a_packed_column_in_c_order(layout, packed):
    """ConvNeXt's bias add + GELU gradient: on a C-order S the ``(W,)`` bias is one packed column
    (one division per vector), not a strided load dividing each lane's index into coordinates;
    on a channels-last S its packed order is not the iteration's, so it stays strided."""
    from opgraph.backends.cuda.codegen import plan
    from opgraph.types import TensorType

    op = dict((c[0], c[1]) for c in CASES)["bias_gelu_backward"]
    full = TensorType((4, 6, 5, 16), "bfloat16", layout)
    built = plan.build(op, (full, TensorType((16,), "bfloat16"), full), full)
    loads = {n.load.input: n.load.kind for n in built.nodes if n.load is not None}
    assert loads[1] == ("col" if packed else "strided") and built.trailing == (1 if packed else 0)


@pytest.mark.parametrize("case,out_shape", [("bias_relu_channel_sums", (6,)), ("bias_se_scale", (4, 6, 5, 16))])
def test_a_channel_or_plane_reduction_beside_a_trailing_bias_reads_it_strided(case, out_shape):
    """The channel- and plane-sum kernels index no columns, whether the program's output is the
    sums or a full-size value computed from them: built again without packing."""
    from opgraph.backends.cuda.codegen import plan
    from opgraph.types import TensorType

    op = dict((c[0], c[1]) for c in CASES)[case]
    full = TensorType((4, 6, 5, 16), "float32", "NCHW")
    built = plan.build(op, (full, TensorType((16,), "float32")), TensorType(out_shape, "float32", "NCHW"))
    assert built.trailing == 0
    assert {n.load.kind for n in built.nodes if n.load is not None and n.load.input == 1} == {"strided"}


def test_a_trailing_bias_that_is_a_strided_view_stays_strided():
    """A packed load of a view would have the launch copy it first: a view is read through its strides."""
    from opgraph.backends.cuda.codegen import plan
    from opgraph.types import TensorType

    op = dict((c[0], c[1]) for c in CASES)["bias_gelu_backward"]
    full = TensorType((4, 6, 5, 16), "float32", "NCHW")
    types = (full, TensorType((16,), "float32"), full)
    kinds = {views: {n.load.kind for n in plan.build(op, types, full, views=views).nodes
                     if n.load is not None and n.load.input == 1} for views in (frozenset(), frozenset({1}))}
    assert kinds == {frozenset(): {"col"}, frozenset({1}): {"strided"}}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_trailing_bias_before_column_sums_is_read_as_words(emu, dtype):
    """A linear layer's bias gradient over its biased output, ``SumTo(x + b, (W,))`` on C-order
    ``(2, 3, 5, 16)``: the column reduction's thread keeps a group of V columns (``Columns.col_run``,
    ``g * V``), so the ``(W,)`` bias is loaded as whole 16-byte words from that column, and the
    sums match the reference (a wrong column base fails it)."""
    from codegen_cases import program
    from opgraph import ops
    op = program([(ops.BroadcastAdd(), (0, 1)), (ops.SumTo(shape=(16,)), (2,))], 2, 3)
    run_case(op, ("x", "last"), (2, 3, 5, 16), dtype, "NCHW")
    assert launched(emu)[0] == "reduce"
    assert emu.raw_launches[0]["source"].count("reinterpret_cast<const uint4*>(in1 + ") >= 1
