"""Strided views read in place by the generated kernels (``codegen.launch``):
DenseNet's zero-copy plan hands a batch norm, an activation or a gradient sum
a channel slice of a wider concat buffer. Every case of the expression table
whose operands include a full-size tensor runs with each such operand a
channel slice (at an odd, misaligned channel offset) of a wider buffer in the
case's layout, against the float64 reference of the same values, and no
full-size operand may be copied first (the copy to C order was a transposing
copy plus uncoalesced reads: 59 GB/s for DenseNet-121's gradient sums on the
H200, docs/performance.md)."""

from __future__ import annotations

import numpy as np
import pytest

from codegen_cases import CASES, SHAPES, channels_last
from codegen_emulated import emu, needs_gxx, run_case, seeded  # noqa: F401  (emu: fixture)
from codegen_cases import make_input, type_of
from opgraph import ops
from opgraph.backends.cuda.codegen import launch
from opgraph.types import is_channels_last

pytestmark = needs_gxx

#: (the wider buffer's extra channels, the slice's first channel): "odd" rows
#: start anywhere (element loads), "aligned" ones on 16-byte boundaries at a
#: pitch of whole 16-byte words (DenseNet's slices: 16-byte loads)
SLICES = {"odd": (11, 3), "aligned": (16, 8)}


def channel_slice(a, layout: str, where: str = "odd"):
    """``a``'s values as channels ``START:START + C`` of a wider buffer stored in ``layout``."""
    extra, start = SLICES[where]
    n, c, h, w = a.shape
    wide = np.zeros((n, c + extra, h, w), a.dtype)
    if layout == "NHWC":
        wide = channels_last(wide)
    view = wide[:, start:start + c]
    view[...] = a
    assert not view.flags.c_contiguous and not is_channels_last(view)
    return view


def copied_full_size() -> list:
    """Shapes of the full-size (4-D, not per-channel) inputs that the cached
    plans copy before their launches (``launch._PLANS``: the emulator's
    fixture starts it empty)."""
    return [arrays[k][0] for (op, arrays, *_), (plan, copied, _) in launch._PLANS.items() for k in copied
            if len(arrays[k][0]) == 4 and arrays[k][0][2:] != (1, 1) and arrays[k][0][1] > 1]


VIEWED = [c for c in CASES if "x" in c.kinds]


@pytest.mark.parametrize("where", sorted(SLICES))
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", VIEWED, ids=[c.id for c in VIEWED])
def test_channel_slices_are_read_in_place(emu, case, dtype, layout, where):
    """A channel slice is rows at a pitch (``contexts.pitch_of``): every kernel
    reading it takes the pitch form, and an aligned slice's full-size loads are
    16-byte words (as a dense operand's would be)."""
    shape = SHAPES[layout]
    rng = seeded(case.id, dtype, layout, "view", where)
    dense = [make_input(rng, k, shape, dtype, layout) for k in case.kinds]
    arrays = [channel_slice(a, layout, where) if k == "x" else a for a, k in zip(dense, case.kinds)]
    out, ref, _ = run_case(case.make(shape), case.kinds, shape, dtype, layout, case.exact, arrays=arrays)
    assert not copied_full_size(), f"full-size views copied before the kernel: {copied_full_size()}"
    for k, kind in enumerate(case.kinds):
        if kind != "x":
            continue
        readers = [x["source"] for x in emu.raw_launches if f" in{k}" in x["source"]]
        full = [src for src in readers if f"in{k}[" in src or f"in{k} +" in src]
        assert all(f"PP{k}" in src for src in full), (k, "a slice read as a packed array")
        if where == "aligned":
            assert all(f"reinterpret_cast<const uint4*>(in{k} +" in src for src in full
                       if "uint4" in src), (k, "an aligned slice read an element at a time beside vectors")


def test_an_nhwc_slice_iterates_channels_last(emu):
    """A gradient sum of three channel slices of NHWC buffers writes an NHWC
    result and plans its sweep channels-last (the slices' physical order)."""
    shape = SHAPES["NHWC"]
    rng = seeded("sum3")
    parts = [channel_slice(make_input(rng, "x", shape, "bfloat16", "NHWC"), "NHWC") for _ in range(3)]
    assert all(launch.array_layout(p) == "NHWC" for p in parts)
    from opgraph.ops.fused import FusedElementwise, FusedStep, Program
    op = FusedElementwise(Program(3, (FusedStep(ops.Add(), (0, 1)), FusedStep(ops.Add(), (3, 2))), (4,)))
    out, ref, _ = run_case(op, ("x", "x", "x"), shape, "bfloat16", "NHWC", arrays=parts)
    assert is_channels_last(out) and not copied_full_size()


def test_a_per_channel_view_is_copied_and_the_result_is_right(emu):
    """A strided view loaded as a packed per-channel row cannot be read in
    place (``ir.ViewError``): the launch copies it and plans again."""
    shape = SHAPES["NCHW"]
    rng = seeded("bias-view")
    x = make_input(rng, "x", shape, "float32", "NCHW")
    wide = rng.standard_normal(2 * shape[1]).astype(np.float32)
    bias = wide[::2]  # a strided (C,) view
    assert launch.view_strides(bias) == (2,)
    run_case(ops.BiasAdd(), ("x", "c"), shape, "float32", "NCHW", arrays=[x, bias])
    assert [copied for plan, copied, _ in launch._PLANS.values()] == [(1,)]


ROWS = [c for c in CASES if {"stats", "sums"} & set(c.kinds)]


def column_slice(a, where: str):
    """``a`` (K, C) as columns ``START:START + C`` of a wider (K, C + extra) buffer."""
    extra, start = SLICES[where]
    wide = np.zeros((a.shape[0], a.shape[1] + extra), a.dtype)
    view = wide[:, start:start + a.shape[1]]
    view[...] = a
    return view


@pytest.mark.parametrize("where", sorted(SLICES))
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", ROWS, ids=[c.id for c in ROWS])
def test_row_operands_sliced_from_wider_ones_are_read_at_their_pitch(emu, case, dtype, layout, where):
    """Batch statistics and sums that are column slices of a wider (K, C')
    buffer (``passes/share_bn_stats.py``: a dense layer's statistics are a
    prefix of its block's) are read in place at their row pitch
    (``contexts.RowPitch``): no copy before the launch, and the values
    those of the dense rows."""
    shape = SHAPES[layout]
    rng = seeded(case.id, dtype, layout, "rows", where)
    dense = [make_input(rng, k, shape, dtype, layout) for k in case.kinds]
    arrays = [column_slice(a, where) if k in ("stats", "sums") else a for a, k in zip(dense, case.kinds)]
    op = case.make(shape)
    out, ref, _ = run_case(op, case.kinds, shape, dtype, layout, case.exact, arrays=arrays)
    assert [copied for plan, copied, _ in launch._PLANS.values()] == [()], "a row operand was copied"
    # a row past the first read C elements on, not at the pitch, would read the
    # wider buffer's other columns: the values would differ
    np.testing.assert_array_equal(out, run_case(op, case.kinds, shape, dtype, layout, case.exact, arrays=dense)[0])


@pytest.mark.parametrize("where", sorted(SLICES))
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_batch_statistics_are_written_into_a_column_slice(emu, layout, where):
    """``BatchNormStats`` homed in a zero-copy concat of statistics writes its
    two rows at the buffer's row pitch (``codegen_rules.STRIDED_OUT``): the
    slice gets the dense result, the other columns keep theirs."""
    from opgraph.backends.registry import KernelContext, rules_for
    shape = SHAPES[layout]
    rng = seeded("stats-out", layout, where)
    x = make_input(rng, "x", shape, "bfloat16", layout)
    op = ops.BatchNormStats()
    rule = rules_for(ops.BatchNormStats)["codegen"]
    assert rule.writes_strided_out
    extra, start = SLICES[where]
    wide = np.full((2, shape[1] + extra), -7.0, np.float32)
    view = wide[:, start:start + shape[1]]
    ctx = KernelContext(np, "cuda", {}, op.infer(*[type_of(x, layout)]))
    got = rule.kernel(ctx, op, x, out=view)
    assert got is view
    want = run_case(op, ("x",), shape, "bfloat16", layout, arrays=[x])[0]
    np.testing.assert_array_equal(view, want)
    assert (wide[:, :start] == -7).all() and (wide[:, start + shape[1]:] == -7).all()


def test_an_output_view_other_than_a_column_slice_is_refused(emu):
    from opgraph.backends.cuda.codegen.ir import PlanError
    from opgraph.backends.registry import KernelContext, rules_for
    shape = SHAPES["NCHW"]
    x = make_input(seeded("stats-out-bad"), "x", shape, "float32", "NCHW")
    op = ops.BatchNormStats()
    wide = np.zeros((2, 2 * shape[1]), np.float32)
    ctx = KernelContext(np, "cuda", {}, op.infer(type_of(x, "NCHW")))
    with pytest.raises(PlanError, match="column slice"):
        rules_for(ops.BatchNormStats)["codegen"].kernel(ctx, op, x, out=wide[:, ::2])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_dense_blocks_training_step_reads_the_concat_buffers_in_place(emu, monkeypatch, dtype):
    """The DenseNet block of ``tests/modern_blocks.py`` lowered for cuda, NHWC:
    its batch norms and gradient sums get channel slices of the concat buffers
    (the zero-copy plan) and read them in place; the step meets the fused-step
    criterion of ``tests/fused_training_steps.py``."""
    import opgraph as og
    from codegen_emulated import emulated_cuda_executable
    from fused_training_steps import step_failures, training_step
    from modern_blocks import dense_block

    viewed = []
    real = launch.view_strides
    monkeypatch.setattr(launch, "view_strides", lambda a: viewed.append(real(a)) or viewed[-1])
    outs, feeds, n_grads = training_step(dense_block, np.random.default_rng(0))
    ref = og.compile(outs, pipeline="reference", dtype="float64")(**feeds)
    exe = emulated_cuda_executable(outs, {"layout": "NHWC"}, dtype)
    off = emulated_cuda_executable(outs, {"layout": "NHWC", "exclude": ["fused"]}, dtype)
    got = exe(**feeds)
    # layers 1 and 2 read prefixes of the block buffer: batch-norm statistics and the fused BN-ReLU at least
    assert sum(v is not None for v in viewed) >= 4, "the generated kernels were handed no concat slice"
    assert not copied_full_size(), f"full-size views copied before the kernel: {copied_full_size()}"
    assert not step_failures(got, off(**feeds), ref, n_grads, dtype)


def test_an_output_is_aliased_only_where_its_bytes_overlap_an_input():
    """``launch.aliased``: x itself, or a view of it from its first byte, is an in-place output; a
    buffer of its own, or the other columns of a concat's buffer (interleaved rows), are not (those
    keep every plan: only an output in place of an input refuses a two-kernel layer norm)."""
    import numpy as np
    from opgraph.backends.cuda.codegen.launch import aliased
    buf = np.zeros((4, 16), np.float32)
    x = buf[:, :8]
    assert aliased(x, [x]) and aliased(x[:, ::2], [x]) and aliased(buf, [x]) and aliased(x, [buf, x])
    assert not aliased(np.zeros_like(x), [x]) and not aliased(None, [x])
    assert not aliased(buf[:, 8:], [x]) and not aliased(buf[2:], [buf[:2]])
