"""Every op of the code generator's expression table, on the CPU through the g++
emulator, against its float64 reference: float32 and bfloat16 in both layouts,
float16 and float64 on a representative set; the paths a shape selects
(vector sweeps with hoisted or uniform channels, per-lane indices and tails,
split reductions and their finishing kernel, 64-bit indices, misaligned
views), in-place outputs, mixed layouts, SEMANTICS.md's edges (NaN, inf,
empty batches) and the plan cache. The GPU runs the same cases
(tests/gpu/test_codegen_gpu.py)."""

from __future__ import annotations

import numpy as np
import pytest

from codegen_cases import CASES, ODD_SHAPE, SHAPES, channels_last, make_input
from codegen_emulated import emu, launched, needs_gxx, run_case, seeded, steps_per_thread  # noqa: F401  (emu: fixture)
from opgraph import ops
from opgraph.backends.cuda import codegen_rules
from opgraph.backends.cuda.codegen import launch, plan
from opgraph.backends.reference.dropout import keep_mask
from opgraph.backends.registry import KernelContext, rules_for
from opgraph.types import TensorType

pytestmark = needs_gxx

_IDS = [c.id for c in CASES]
#: the cases also run in float16 (channels-last) and float64 (NCHW)
REPRESENTATIVE = ["Silu()", "GeluBackward(approximate='tanh', order=2)", "BatchNormStats()", "BiasAddBackward()",
                  "GlobalAvgPool2d()", "BatchNormTrainingBackwardData(eps=1e-05)", "Mul()",
                  "Dropout(p=0.3, training=True, seed=11)", "BroadcastTo", "BatchNormRunningUpdate",
                  "BatchNormTrainingBackwardSums(eps=1e-05)", "BatchNormTrainingBackwardDataFromSums(eps=1e-05)"]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=_IDS)
def test_every_op_against_the_reference(emu, case, dtype, layout):
    shape = SHAPES[layout]
    run_case(case.make(shape), case.kinds, shape, dtype, layout, case.exact)


@pytest.mark.parametrize("dtype,layout", [("float16", "NHWC"), ("float64", "NCHW")])
@pytest.mark.parametrize("case", [c for c in CASES if c.id in REPRESENTATIVE], ids=REPRESENTATIVE)
def test_other_storage_dtypes(emu, case, dtype, layout):
    shape = SHAPES[layout]
    run_case(case.make(shape), case.kinds, shape, dtype, layout, case.exact)
    if dtype == "float64":
        assert all("typedef double CT;" in x["source"] for x in emu.raw_launches)


def _ops_by_id(*ids):
    return [c for c in CASES if c.id in ids]


SLOW_PATH_CASES = _ops_by_id("BiasAdd()", "Mul()", "Mul(per-sample)", "Dropout(p=0.3, training=True, seed=11)",
                             "BiasAddBackward()", "BatchNormTrainingBackwardData(eps=1e-05)", "SumTo(plane)",
                             "BatchNormStats()", "BatchNormTrainingBackwardSums(eps=1e-05)")


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", SLOW_PATH_CASES, ids=[c.id for c in SLOW_PATH_CASES])
def test_odd_shapes_take_per_lane_indices_and_tails(emu, case, dtype, layout):
    run_case(case.make(ODD_SHAPE), case.kinds, ODD_SHAPE, dtype, layout, case.exact)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", _ops_by_id("BiasAddBackward()", "BatchNormStats()", "GlobalAvgPool2d()",
                                            "BatchNormTrainingBackwardData(eps=1e-05)"),
                         ids=lambda c: c.id)
@pytest.mark.parametrize("finish_bytes", [0, 32 * 1024], ids=["finalize-launch", "last-block"])
def test_split_reductions_add_their_partial_sums(emu, monkeypatch, case, layout, finish_bytes):
    """Split over blocks, the partial sums are added by a second launch or by the
    last block of each tile (``plan.FINISH_BYTES``), each within tolerance of the reference."""
    monkeypatch.setattr(plan, "TARGET_BLOCKS", 48)
    monkeypatch.setattr(plan, "MIN_PER_THREAD", 1)
    monkeypatch.setattr(plan, "FINISH_BYTES", finish_bytes)
    shape = (1, 8, 64, 64) if case.id == "GlobalAvgPool2d()" else (8, 16, 16, 24)  # few entries: split
    run_case(case.make(shape), case.kinds, shape, "bfloat16", layout)
    kinds = launched(emu)
    assert ("finalize" in kinds) == (finish_bytes == 0), kinds
    p = next(iter(launch._PLANS.values()))[0]
    assert any(x.grid[1] > 1 for x in p.launches), "the reduction was not split"
    if finish_bytes:  # every launch left its counters at zero for the next
        assert p.tickets and not launch._TICKET_BUFFERS[-1].any()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("channels", [72, 200])
@pytest.mark.parametrize("case", _ops_by_id("BatchNormStats()", "GlobalAvgPool2d()",
                                            "BatchNormTrainingBackwardData(eps=1e-05)"), ids=lambda c: c.id)
def test_narrow_tiles_each_add_their_own_partial_sums(emu, monkeypatch, case, channels, dtype):
    """Channels-last reductions over several 128-byte tiles of channels (the
    last one partial), each split over blocks: each tile's last block adds
    its tile's partial sums (per channel, and per image for the global pool),
    for every reduction phase of the program, and leaves its counter at zero."""
    monkeypatch.setattr(plan, "TARGET_BLOCKS", 24)
    monkeypatch.setattr(plan, "MIN_PER_THREAD", 1)
    monkeypatch.setattr(plan, "FINISH_BYTES", 32 * 1024)  # off by default (plan.py says why)
    shape = (3, channels, 7, 9)
    run_case(case.make(shape), case.kinds, shape, dtype, "NHWC")
    (p, _, _), = launch._PLANS.values()
    reductions = [x for x in p.launches if x.name.split("_")[2] == "reduce"]
    assert reductions and all(x.grid[0] > 1 and x.grid[1] > 1 for x in reductions), [x.grid for x in p.launches]
    assert "finalize" not in launched(emu)
    assert not launch._TICKET_BUFFERS[-1].any()


@pytest.mark.parametrize("case", _ops_by_id("BatchNormStats()", "BiasAddBackward()"), ids=lambda c: c.id)
def test_the_last_block_and_a_finalize_launch_add_in_the_same_order(emu, monkeypatch, case):
    """Who adds a tile's partial sums does not change the bits (a plan first
    made inside a capture takes the finalize form)."""
    shape = (8, 264, 14, 14)
    x = make_input(seeded("order", case.id), "x", shape, "float32", "NHWC")
    outs = []
    for finish in (0, 1 << 20):
        monkeypatch.setattr(plan, "FINISH_BYTES", finish)
        launch._PLANS.clear()
        outs.append(run_case(case.make(shape), case.kinds, shape, "float32", "NHWC", arrays=[x])[0])
    assert outs[0].tobytes() == outs[1].tobytes()
    assert "finalize" in launched(emu)


@pytest.mark.parametrize("layout,dtype,shape,rows", [
    ("NHWC", "float32", (3, 64, 7, 9), 2), ("NHWC", "bfloat16", (5, 72, 5, 7), 2), ("NHWC", "float32", (3, 62, 7, 9), 4),
    ("NCHW", "float32", (3, 6, 8, 8), 2), ("NCHW", "bfloat16", (5, 4, 8, 8), 2), ("NCHW", "float32", (3, 6, 7, 9), 4)],
    ids=["nhwc-f32-vectors", "nhwc-bf16-vectors", "nhwc-f32-scalars", "nchw-f32-vectors", "nchw-bf16-vectors",
         "nchw-f32-scalars"])
@pytest.mark.parametrize("case", _ops_by_id("BatchNormStats()", "BiasAddBackward()",
                                            "BatchNormTrainingBackwardSums(eps=1e-05)"), ids=lambda c: c.id)
def test_rows_loaded_per_iteration_do_not_change_the_bits(emu, monkeypatch, case, layout, dtype, shape, rows):
    """A reduction's thread loads ``ROW_LOAD_BYTES`` of its run per iteration
    (several rows of channels-last data, or vectors of a C-order run, where one
    is a single 16-byte word), then the run's last ones one at a time: each sum
    adds the same terms in the same order as one step per iteration, so the
    output is the same bit for bit, for runs of every length (split so that
    runs end mid-iteration)."""
    monkeypatch.setattr(plan, "TARGET_BLOCKS", 2)
    monkeypatch.setattr(plan, "MIN_PER_THREAD", 8)  # long runs: the steps taken together run, then the last ones
    arrays = None
    outs, sources = [], []
    for row_bytes in (0, plan.ROW_LOAD_BYTES):
        monkeypatch.setattr(plan, "ROW_LOAD_BYTES", row_bytes)
        launch._PLANS.clear()
        out, _, arrays = run_case(case.make(shape), case.kinds, shape, dtype, layout, arrays=arrays)
        outs.append(out)
        sources.append(next(x["source"] for x in emu.raw_launches[::-1] if "_reduce_" in x["name"]))
    assert outs[0].tobytes() == outs[1].tobytes()
    assert steps_per_thread() > plan.MAX_ROWS_PER_ITERATION  # at least one iteration of the most steps, then one alone
    step = "ar += {} * RB" if layout == "NHWC" else "jr += {} * TE"
    assert "r += " not in sources[0]
    # 16-byte vectors: one word a step of each of x (and dy for the sums); 62
    # channels or 63 pixels are read one element a lane: at most MAX_ROWS_PER_ITERATION
    if rows == 2 and case.id.startswith("BatchNormTrainingBackwardSums"):
        rows = 1  # two words a step already
    assert (step.format(rows) in sources[1]) == (rows > 1) and (step.format(2) in sources[1]) == (rows == 2)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_steps_taken_together_load_first_and_declare_their_occupancy(layout, dtype):
    """In an iteration of several steps every step's loads come before any value
    computed from a load (ptxas issued a second load written after the first
    step's arithmetic only once that arithmetic's load had returned), and the
    kernel declares 4 blocks of 256 threads an SM (without it ptxas held 32
    registers by issuing the loads one at a time: both seen in the SASS);
    with one step an iteration the kernel is as before, undeclared."""
    x = TensorType((128, 256, 56, 56), dtype, layout)
    op = ops.BatchNormStats()
    source = plan.lower(op, [x], op.infer(x)).launches[0].source
    assert "__launch_bounds__(256, 4)" in source
    loop = source[source.index("r += 2 * "):].split("\n        }\n", 1)[0].splitlines()
    loads = [i for i, line in enumerate(loop) if "in0 + i0_s" in line]
    computed = [i for i, line in enumerate(loop) if line.strip().startswith("const CT ")]
    assert len(loads) == 2 and computed and max(loads) < min(computed), loop[:12]
    sums = ops.BatchNormTrainingBackwardSums(eps=1e-5)
    stats = TensorType((2, 256), "float32", None)
    assert "__launch_bounds__" not in plan.lower(sums, [x, stats, x], sums.infer(x, stats, x)).launches[0].source


def test_a_plan_made_while_a_stream_captures_adds_its_partial_sums_in_a_second_launch(emu, monkeypatch):
    """Ticket counters are allocated and zeroed outside any capture: a plan
    first made inside one takes none (a ``finalize`` launch instead)."""
    from types import SimpleNamespace
    monkeypatch.setattr(plan, "TARGET_BLOCKS", 24)
    monkeypatch.setattr(plan, "MIN_PER_THREAD", 1)
    monkeypatch.setattr(plan, "FINISH_BYTES", 32 * 1024)
    stream = SimpleNamespace(is_capturing=lambda: True)
    capturing = SimpleNamespace(cuda=SimpleNamespace(get_current_stream=lambda: stream))
    x = make_input(seeded("capture"), "x", (3, 200, 7, 9), "bfloat16", "NHWC")
    op = ops.BatchNormStats()
    out = op.infer(TensorType(x.shape, "bfloat16"))
    made, _, _ = launch._cached(op, [x], out, None, capturing)
    assert made.tickets == 0 and made.launches[-1].name.split("_")[2] == "finalize"
    launch._PLANS.clear()
    assert launch._cached(op, [x], out, None, np)[0].tickets > 0


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_64_bit_indices(emu, monkeypatch, layout):
    monkeypatch.setattr(plan, "INT32_LIMIT", 100)
    shape = SHAPES[layout]
    for case in _ops_by_id("BatchNormTrainingBackwardData(eps=1e-05)", "Dropout(p=0.3, training=True, seed=11)",
                           "GlobalAvgPool2d()", "Mul()"):
        run_case(case.make(shape), case.kinds, shape, "float32", layout)
    assert all("typedef long long IDX;" in x["source"] for x in emu.raw_launches)


def test_vector_paths_and_the_scalar_fallback_of_a_misaligned_view(emu):
    shape = SHAPES["NHWC"]
    x = make_input(seeded(1), "x", shape, "bfloat16", "NHWC")
    b = make_input(seeded(1), "c", shape, "bfloat16", "NHWC")
    run_case(ops.BiasAdd(), ("x", "c"), shape, "bfloat16", "NHWC", arrays=[x, b])
    assert "uint4" in emu.raw_launches[-1]["source"] and "cbase" in emu.raw_launches[-1]["source"]  # hoisted
    shape = SHAPES["NCHW"]
    run_case(ops.BiasAdd(), ("x", "c"), shape, "bfloat16", "NCHW")
    assert "uint4" in emu.raw_launches[-1]["source"] and "qv" in emu.raw_launches[-1]["source"]  # uniform
    flat = make_input(seeded(2), "x", (1, 1, 1, 1001), "float32", "NCHW").reshape(-1)
    view = flat[1:]  # 4 bytes past a 16-byte boundary
    run_case(ops.Relu(), ("x",), view.shape, "float32", "NCHW", exact=True, arrays=[view])
    assert "uint4" not in emu.raw_launches[-1]["source"]


def test_in_place_output(emu):
    shape = SHAPES["NHWC"]
    rng = seeded(3)
    x, gy = (make_input(rng, "x", shape, "bfloat16", "NHWC") for _ in range(2))
    want = np.where(x.astype(np.float32) > 0, gy.astype(np.float32), 0)
    rule = rules_for(ops.ReluBackward)["codegen"]
    assert rule.inplace == (1,)
    out_t = TensorType(shape, "bfloat16", "NHWC")
    got = rule.kernel(KernelContext(np, "cuda", {}, out_t), ops.ReluBackward(), x, gy, out=gy)
    assert got is gy
    np.testing.assert_array_equal(gy.astype(np.float32), want)
    assert "__restrict__" not in emu.raw_launches[-1]["source"]


def test_operands_in_another_layout_are_read_through_their_strides(emu):
    shape = SHAPES["NHWC"]
    rng = seeded(4)
    a = make_input(rng, "x", shape, "float32", "NHWC")
    b = np.ascontiguousarray(make_input(rng, "x", shape, "float32", "NCHW"))
    out, _, _ = run_case(ops.Add(), ("x", "x"), shape, "float32", "NHWC", arrays=[a, b])
    np.testing.assert_allclose(out, a + b, rtol=1e-6)
    assert "ST1_" in emu.raw_launches[-1]["source"]  # b by its strides


@pytest.mark.parametrize("case", _ops_by_id("Relu()", "BiasAdd()", "Dropout(p=0.3, training=True, seed=11)",
                                            "BiasAddBackward()", "Threshold(threshold=0.25, value=-1.0)"),
                         ids=lambda c: c.id)
def test_two_dimensional_classifier_values(emu, case):
    run_case(case.make((6, 40)), case.kinds, (6, 40), "bfloat16", "NCHW", case.exact)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_dropout_mask_is_the_reference_mask_bit_for_bit(emu, layout):
    shape = SHAPES[layout]
    x = make_input(seeded(5), "x", shape, "float32", layout) + np.float32(10)  # never 0
    op = ops.Dropout(p=0.4, training=True, seed=2 ** 40 + 7)
    out, _, _ = run_case(op, ("x",), shape, "float32", layout, arrays=[x])
    np.testing.assert_array_equal(out != 0, keep_mask(np, shape, seed=op.seed, p=op.p))


def test_nan_inf_and_signed_zero_edges(emu):
    x = np.array([[np.nan, np.inf, -np.inf, 0.0, -0.0, 3.0, -2.0, 7.0]], np.float32)
    gy = np.array([[1.0, 1.0, 1.0, np.inf, 1.0, 2.0, np.inf, 1.0]], np.float32)
    for op, args in [(ops.Relu(), [x]), (ops.ReluBackward(), [x, gy]),
                     (ops.Hardtanh(min_val=0.0, max_val=6.0), [x]),
                     (ops.HardtanhBackward(min_val=0.0, max_val=6.0), [x, gy]), (ops.Sigmoid(), [x]),
                     (ops.Dropout(p=1.0, training=True), [x])]:
        out, ref, _ = run_case(op, ("x",) * len(args), x.shape, "float32", "NCHW", arrays=args, compare=False)
        np.testing.assert_allclose(out, ref, rtol=1e-6)  # NaN where the reference has NaN, infinities equal


def test_empty_batch(emu):
    x = np.zeros((0, 8, 3, 3), np.float32)
    for op in (ops.BatchNormStats(), ops.BiasAddBackward(), ops.Relu()):
        run_case(op, ("x",), x.shape, "float32", "NCHW", arrays=[x])


def test_plans_and_kernels_are_cached_per_signature(emu):
    shape = SHAPES["NHWC"]
    x = make_input(seeded(6), "x", shape, "bfloat16", "NHWC")
    t = TensorType(shape, "bfloat16", "NHWC")
    launch.run(np, ops.Silu(), [x], t)
    plans, compiled = len(launch._PLANS), launch.compiled.cache_info().misses
    launch.run(np, ops.Silu(), [x], t)
    assert len(launch._PLANS) == plans and launch.compiled.cache_info().misses == compiled
    launch.run(np, ops.Silu(), [channels_last(np.ascontiguousarray(x[:2]))], t.with_shape((2, *shape[1:])))
    assert len(launch._PLANS) == plans + 1


def test_the_rule_declines_what_the_generator_does_not_cover():
    check = codegen_rules.check
    x = TensorType((2, 4, 3, 3))
    assert "int64" in check(ops.Add(), (TensorType((2, 3), "int64"),) * 2, "cuda")
    assert "per channel, per plane or total" in check(ops.Mean(axes=(1,)), (x,), "cuda")
    assert "per channel, per plane, per trailing index or total" in check(ops.SumTo(shape=(2, 1, 3, 3)), (x,), "cuda")
    assert check(ops.Mean(axes=(0, 1, 2, 3)), (x,), "cuda") is None
    # average pooling: only a window covering the whole plane with no padding (a global pool)
    assert check(ops.AvgPool2d(kernel_size=3, stride=2), (x,), "cuda") is None
    assert "whole (3, 3) plane" in check(ops.AvgPool2d(kernel_size=2, stride=1), (x,), "cuda")
    padded = ops.AvgPool2d(kernel_size=3, stride=1, padding=1)
    assert "no padding" in check(padded, (x,), "cuda")
    gy = padded.infer(x)
    assert "no padding" in check(ops.AvgPool2dBackward(**padded.pool_params(), input_shape=x.shape), (gy,), "cuda")
    assert rules_for(ops.Relu)["codegen"].tags >= {"codegen", "generated", "gpu"}
    assert "fused" in rules_for(ops.FusedElementwise)["codegen"].tags


def test_sums_are_read_by_axis_position_not_by_matching_extents(emu):
    """With N = C = W a per-sample sum ``(N, 1, 1, 1)`` and a ``(W,)`` one (SumTo
    aligns trailing axes) have the extents of a per-channel sum; the generator
    once summed them per channel. It declines the per-sample one; the true
    per-channel ones and the ``(W,)`` one (a sum over the leading axes, per
    trailing index) run against the reference."""
    shape = (3, 3, 4, 3)
    x = TensorType(shape)
    assert "is not per channel, per plane" in codegen_rules.check(ops.SumTo(shape=(3, 1, 1, 1)), (x,), "cuda")
    arrays = [make_input(seeded(7), "x", shape, "float32", "NCHW")]
    for kept in ((1, 3, 1, 1), (3, 1, 1), (3,)):
        run_case(ops.SumTo(shape=kept), None, shape, "float32", "NCHW", arrays=arrays)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_batch_norm_sums_of_half_storage_are_float32_sums(emu, dtype, layout):
    """The sums the bn-backward-sums rule shares are accumulated and stored in
    float32: against the float64 sums of the same stored values, float32
    rounding (not the storage's 2^-9 or 2^-12)."""
    (case,) = _ops_by_id("BatchNormTrainingBackwardSums(eps=1e-05)")
    shape = SHAPES[layout]
    out, ref, _ = run_case(case.make(shape), case.kinds, shape, dtype, layout, compare=False)
    assert out.dtype == np.float32
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5


def test_a_signed_zero_parameter_is_its_own_kernel(emu):
    """``Threshold(value=-0.0)`` compared and hashed equal to ``value=0.0``, so the
    plan cache (keyed by op) ran the first one's kernel for the second: its zeros
    came out +0.0 (review). Each now gets its own plan, and its zeros their sign."""
    from opgraph import ops

    x = np.linspace(-1.0, 1.0, 2 * 4 * 3 * 3, dtype=np.float32).reshape(2, 4, 3, 3)
    plus, minus = ops.Threshold(threshold=0.5, value=0.0), ops.Threshold(threshold=0.5, value=-0.0)
    assert plus != minus and hash(plus) != hash(minus)
    for op, negative in ((plus, False), (minus, True)):
        out, ref, _ = run_case(op, ("any",), x.shape, "float32", "NCHW", exact=True, arrays=[x])
        zeros = np.asarray(out)[x <= 0.5]
        assert zeros.size and not zeros.any() and np.all(np.signbit(zeros) == negative), op
        assert np.array_equal(np.signbit(np.asarray(out)), np.signbit(ref)), op
    assert len(launch._PLANS) == 2
