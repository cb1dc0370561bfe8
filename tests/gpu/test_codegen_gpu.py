"""The generated memory-bound kernels (``backends/cuda/codegen``) on the GPU,
against the float64 reference on the same stored inputs: every op of the
expression table and every hand-built fused program in float32, bfloat16,
float16 and float64 and in both layouts (SEMANTICS.md tolerances; selects and
copies exactly), the strided copies bit for bit, split reductions on model
sizes, 64-bit index arithmetic (forced, and on a tensor over 2^31 elements),
in-place outputs, a generated step captured and replayed in a CUDA graph, and
two modern-convnet blocks compiled for the GPU with no step on the reference.
Nothing is timed here (scripts/gpu_profile.py measures)."""

from __future__ import annotations

import numpy as np
import pytest

from opgraph.backends.device import cuda_status

from codegen_cases import (CASES, ODD_SHAPE, SHAPES, TOLERANCE, fused_cases, make_input, out_type, reference,
                           rel_err)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_status()[0], reason=f"no GPU: {cuda_status()[1]}")]

DTYPES = ["float32", "bfloat16", "float16", "float64"]
_HALF = ("bfloat16", "float16")


def dev(cp, a):
    """Host array ``a`` on the device in the same dtype and memory order
    (half precision through its uint16 bits; channels-last stays channels-last)."""
    from opgraph.types import is_channels_last
    cl = a.ndim == 4 and is_channels_last(a)
    logical = np.ascontiguousarray(a)
    d = cp.asarray(logical.view(np.uint16) if a.dtype.name in _HALF else logical)
    if cl:
        d = cp.ascontiguousarray(d.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    return d.view(a.dtype) if a.dtype.name in _HALF else d


def host(cp, a):
    """A device array on the host, in its dtype (half precision through its bits)."""
    if a.dtype.name in _HALF:
        return cp.asnumpy(a.view(cp.uint16)).view(a.dtype)
    return cp.asnumpy(a)


def run(cp, op, arrays, layout, out=None):
    """The ``codegen`` kernel of ``op`` on the device copies of host ``arrays``."""
    from opgraph.backends.registry import KernelContext, rules_for
    t = out_type(op, arrays, layout)
    kw = {} if out is None else {"out": out}
    got = rules_for(type(op))["codegen"].kernel(KernelContext(cp, "cuda", {}, t), op,
                                                *(dev(cp, a) for a in arrays), **kw)
    assert got.dtype.name == t.dtype and tuple(got.shape) == t.shape
    if t.layout == "NHWC":
        from opgraph.types import is_channels_last
        assert is_channels_last(got)
    return got


def check(cp, op, arrays, layout, dtype, exact=False):
    got = host(cp, run(cp, op, arrays, layout))
    ref = reference(op, arrays)
    if exact:
        np.testing.assert_array_equal(np.asarray(got, np.float64), ref)
    else:
        assert rel_err(got, ref) < TOLERANCE[dtype], (op, dtype, layout, rel_err(got, ref))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_every_op(cp, rng, case, dtype, layout):
    for shape in (SHAPES[layout], ODD_SHAPE):
        op = case.make(shape)
        check(cp, op, [make_input(rng, k, shape, dtype, layout) for k in case.kinds], layout, dtype, case.exact)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name,op,kinds", fused_cases(), ids=[c[0] for c in fused_cases()])
def test_every_fused_program(cp, rng, name, op, kinds, dtype, layout):
    shape = SHAPES[layout]
    check(cp, op, [make_input(rng, k, shape, dtype, layout) for k in kinds], layout, dtype)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", [c for c in CASES if c.id in (
    "BiasAddBackward()", "BatchNormStats()", "GlobalAvgPool2d()", "BatchNormTrainingBackwardData(eps=1e-05)",
    "BatchNormTrainingBackwardScale(eps=1e-05)", "Mean(axes=(0, 2, 3), keepdim=False)")], ids=lambda c: c.id)
@pytest.mark.parametrize("shape", [(32, 64, 56, 56), (128, 1280, 7, 7), (64, 24, 112, 112)])
def test_reductions_on_model_sizes(cp, rng, case, shape, layout):
    """Split reductions (partial sums, then the finishing kernel) on ResNet /
    EfficientNet sizes, bfloat16 storage."""
    op = case.make(shape)
    check(cp, op, [make_input(rng, k, shape, "bfloat16", layout) for k in case.kinds], layout, "bfloat16")


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", [c for c in CASES if c.id in (
    "BatchNormStats()", "BiasAddBackward()", "GlobalAvgPool2d()", "BatchNormTrainingBackwardSums(eps=1e-05)")],
    ids=lambda c: c.id)
@pytest.mark.parametrize("shape", [(32, 64, 56, 56), (8, 62, 28, 27)], ids=["vectors", "scalars"])
def test_steps_loaded_per_iteration_do_not_change_the_bits(cp, rng, monkeypatch, case, dtype, layout, shape):
    """Several steps of a thread's run loaded per iteration (``plan.ROW_LOAD_BYTES``)
    against one at a time: the same bits as NVRTC compiles them (its products
    may be fused into the sums' adds: the CPU emulator cannot show that), and
    within tolerance of the float64 reference."""
    from opgraph.backends.cuda.codegen import launch, plan
    op = case.make(shape)
    arrays = [make_input(rng, k, shape, dtype, layout) for k in case.kinds]
    outs = []
    for row_bytes in (0, plan.ROW_LOAD_BYTES):
        monkeypatch.setattr(plan, "ROW_LOAD_BYTES", row_bytes)
        monkeypatch.setattr(launch, "_PLANS", {})
        outs.append(host(cp, run(cp, op, arrays, layout)))
    assert outs[0].tobytes() == outs[1].tobytes()
    assert rel_err(outs[1], reference(op, arrays)) < TOLERANCE[dtype]


@pytest.mark.parametrize("case", [c for c in CASES if c.id in (
    "BatchNormStats()", "BatchNormTrainingBackwardData(eps=1e-05)")], ids=lambda c: c.id)
@pytest.mark.parametrize("shape", [(64, 1024, 7, 7), (64, 200, 14, 14), (16, 72, 28, 28)])
def test_last_block_reductions_repeat_and_replay(cp, rng, monkeypatch, case, shape, captured_replay):
    """Channels-last reductions whose tiles' last blocks add the partial sums
    (DenseNet-121's short, wide batch norms): three launches in a row give the
    same bits and match the float64 reference (each launch left its ticket
    counters at zero), and so does a CUDA-graph replay on new input."""
    from opgraph.backends.cuda.codegen import launch, plan as codegen_plan
    from opgraph.backends.registry import KernelContext, rules_for
    monkeypatch.setattr(codegen_plan, "FINISH_BYTES", 1 << 20)  # off by default (plan.py says why)
    monkeypatch.setattr(launch, "_PLANS", {})
    op = case.make(shape)
    arrays = [make_input(rng, k, shape, "bfloat16", "NHWC") for k in case.kinds]
    dev_arrays = [dev(cp, a) for a in arrays]
    t = out_type(op, arrays, "NHWC")

    def call():
        return rules_for(type(op))["codegen"].kernel(KernelContext(cp, "cuda", {}, t), op, *dev_arrays)
    runs = [host(cp, call()) for _ in range(3)]
    plan = launch.plan_for(op, dev_arrays, t)
    assert plan.tickets and not any(x.name.split("_")[2] == "finalize" for x in plan.launches), plan.launches
    for got in runs[1:]:
        assert got.tobytes() == runs[0].tobytes()  # fixed-order sums: the same bits
    assert rel_err(runs[0], reference(op, arrays)) < TOLERANCE["bfloat16"]
    assert not launch._TICKET_BUFFERS[cp.cuda.runtime.getDevice()].any()
    fresh = make_input(rng, "x", shape, "bfloat16", "NHWC")

    def change():  # through the uint16 bits: CuPy copies those
        dev_arrays[0].view(cp.uint16)[...] = dev(cp, fresh).view(cp.uint16)
    out, keep = captured_replay(call, change)
    assert rel_err(host(cp, out), reference(op, [fresh, *arrays[1:]])) < TOLERANCE["bfloat16"]


def dev_slice(cp, a, layout: str, extra: int, start: int):
    """Host ``a``'s values as channels ``[start, start + C)`` of a device buffer
    of ``C + extra`` channels stored in ``layout`` (a zero-copy concat slice)."""
    from codegen_cases import channels_last
    n, c, h, w = a.shape
    wide = np.zeros((n, c + extra, h, w), a.dtype)
    wide[:, start:start + c] = a
    return dev(cp, channels_last(wide) if layout == "NHWC" else wide)[:, start:start + c]


VIEWED = [c for c in CASES if "x" in c.kinds]


@pytest.mark.parametrize("slice_at", [(11, 3), (16, 8), (32, 0)], ids=["odd", "aligned", "prefix"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", VIEWED, ids=[c.id for c in VIEWED])
def test_channel_slices_read_in_place(cp, rng, case, dtype, layout, slice_at):
    """Every op reading full-size operands that are channel slices of wider
    buffers (read in place at their pitch; 16-byte loads where the slice
    starts on a 16-byte boundary: ``aligned``, and DenseNet's ``prefix``),
    on a model size whose reductions split, against the float64 reference."""
    from opgraph.backends.registry import KernelContext, rules_for
    shape = (8, 64, 14, 14) if layout == "NHWC" else (8, 24, 12, 16)
    op = case.make(shape)
    arrays = [make_input(rng, k, shape, dtype, layout) for k in case.kinds]
    device = [dev_slice(cp, a, layout, *slice_at) if k == "x" else dev(cp, a) for a, k in zip(arrays, case.kinds)]
    t = out_type(op, arrays, layout)
    got = host(cp, rules_for(type(op))["codegen"].kernel(KernelContext(cp, "cuda", {}, t), op, *device))
    ref = reference(op, arrays)
    if case.exact:
        np.testing.assert_array_equal(np.asarray(got, np.float64), ref)
    else:
        assert rel_err(got, ref) < TOLERANCE[dtype], (op, dtype, layout, slice_at, rel_err(got, ref))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_forced_64_bit_indices(cp, rng, monkeypatch, layout):
    from opgraph.backends.cuda.codegen import launch, plan
    monkeypatch.setattr(plan, "INT32_LIMIT", 1000)
    monkeypatch.setattr(launch, "_PLANS", {})
    shape = SHAPES[layout]
    for case in CASES:
        if case.id in ("BatchNormTrainingBackwardData(eps=1e-05)", "Dropout(p=0.3, training=True, seed=11)",
                       "GlobalAvgPool2d()", "Mul()", "BiasAddBackward()"):
            op = case.make(shape)
            check(cp, op, [make_input(rng, k, shape, "bfloat16", layout) for k in case.kinds], layout, "bfloat16")


def test_a_tensor_over_two_to_the_31_elements(cp):
    """bfloat16 ones of (64, 8, 2048, 2050) (2^31 + 2 M elements): x + x is 2 and
    every plane's mean 1 (exact: each plane sums fewer than 2^24 ones), checked
    on the device."""
    from opgraph import ops
    from opgraph.backends.cuda.codegen import launch
    from opgraph.types import TensorType, numpy_dtype
    shape = (64, 8, 2048, 2050)
    assert np.prod(shape) > 2 ** 31
    bf16 = numpy_dtype("bfloat16")
    bits = {v: int(np.asarray(v, dtype=bf16).view(np.uint16)) for v in (1.0, 2.0)}
    x = cp.full(shape, bits[1.0], dtype=cp.uint16).view(bf16)
    y = launch.run(cp, ops.Add(), [x, x], TensorType(shape, "bfloat16", "NCHW"))
    assert int((y.view(cp.uint16) != bits[2.0]).sum()) == 0
    del y
    m = launch.run(cp, ops.GlobalAvgPool2d(), [x], TensorType((64, 8, 1, 1), "bfloat16"))
    assert int((m.view(cp.uint16) != bits[1.0]).sum()) == 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_copies_bit_for_bit(cp, rng, dtype, layout):
    from opgraph import ops
    from opgraph.backends.registry import KernelContext, rules_for
    from opgraph.types import TensorType

    def both(op, arrays):
        t = op.infer(*(TensorType(a.shape, a.dtype.name) for a in arrays))
        t = TensorType(t.shape, t.dtype, layout if len(t.shape) == 4 else None)
        got = rules_for(type(op))["codegen"].kernel(KernelContext(cp, "cuda", {}, t), op, *(dev(cp, a) for a in arrays))
        want = rules_for(type(op))["reference"].kernel(KernelContext(np), op, *arrays)
        bits = {2: np.uint16, 4: np.uint32}[want.itemsize]
        np.testing.assert_array_equal(host(cp, got).view(bits), np.asarray(want).view(bits))
        return host(cp, got)

    xs = [make_input(rng, "x", (4, c, 7, 9), dtype, layout) for c in (16, 24, 3)]
    y = both(ops.Concat(axis=1), xs)
    s = both(ops.Slice(axis=1, start=16, stop=40), [y])
    both(ops.SliceBackward(axis=1, start=16, stop=40, input_shape=y.shape), [s])
    p = both(ops.Pad(padding=((1, 2), (3, 0)), value=float("-inf")), [xs[0]])
    both(ops.PadBackward(padding=((1, 2), (3, 0))), [p])
    both(ops.Flatten(start_dim=1), [xs[1]])
    both(ops.Transpose(perm=(0, 2, 3, 1)), [xs[2]])


def test_in_place_output(cp, rng):
    from opgraph import ops
    shape = SHAPES["NHWC"]
    x, gy = (make_input(rng, "x", shape, "bfloat16", "NHWC") for _ in range(2))
    d_gy = dev(cp, gy)
    got = run(cp, ops.ReluBackward(), [x, gy], "NHWC", out=d_gy)
    assert got is d_gy
    np.testing.assert_array_equal(host(cp, got).astype(np.float64), reference(ops.ReluBackward(), [x, gy]))


def test_a_generated_step_replays_in_a_cuda_graph(cp, rng, captured_replay):
    """Batch-norm data gradient (a split reduction, its finishing kernel, a
    sweep): no host-to-device copy on the launch path, so it captures; the
    replay reads the input as it is at replay time."""
    from opgraph import ops
    shape = (32, 64, 28, 28)
    op = ops.BatchNormTrainingBackwardData()
    arrays = [make_input(rng, k, shape, "bfloat16", "NHWC") for k in ("x", "x", "stats", "c")]
    dev_arrays = [dev(cp, a) for a in arrays]
    from opgraph.backends.registry import KernelContext, rules_for
    kernel, t = rules_for(type(op))["codegen"].kernel, out_type(op, arrays, "NHWC")
    fresh = make_input(rng, "x", shape, "bfloat16", "NHWC")

    def change():  # through the uint16 bits: CuPy copies those
        dev_arrays[0].view(cp.uint16)[...] = dev(cp, fresh).view(cp.uint16)
    out, keep = captured_replay(lambda: kernel(KernelContext(cp, "cuda", {}, t), op, *dev_arrays), change)
    want = reference(op, [fresh, *arrays[1:]])
    assert rel_err(host(cp, out), want) < 1e-2


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_modern_blocks_compile_for_the_gpu_and_match_the_reference(cp, rng, layout):
    """A ResNet bottleneck and an MBConv block (training batch norm, SE, dropout):
    a training step on the GPU, float32 storage, no step on the reference."""
    import opgraph as og
    from modern_blocks import bottleneck, mbconv
    for make in (bottleneck, mbconv):
        y, params, extra = make()
        grads = og.grad(y, params, grad_outputs=[y])
        outs = [y, *grads, *extra]
        feeds = {s.name: rng.standard_normal(s.type.shape) * (0.2 if s.op.role == "param" else 1.0)
                 for s in y.graph.sources() if s.op.role in ("input", "param")}
        ref = og.compile(outs, pipeline="reference", dtype="float64")(**feeds)
        exe = og.compile(outs, device="cuda", policy={"layout": layout})
        counts = exe.report.by_algorithm()
        assert "reference" not in counts and counts["codegen"] > 0, counts
        got = exe(**{k: v.astype(np.float32) for k, v in feeds.items()})
        # A gradient that cancels exactly (a per-channel shift before a training
        # batch norm: the norm subtracts it) is float64 noise in the reference and
        # float32 noise here: such outputs are compared on the block's scale.
        scale = max(float(np.abs(b).max()) for b in ref)
        for k, (a, b) in enumerate(zip(got, ref)):
            a = cp.asnumpy(a)
            if np.abs(b).max() < 1e-9 * scale:
                assert np.abs(a).max() < 1e-5 * scale, (make.__name__, k, "cancelling gradient")
            else:
                assert rel_err(a, b) < 1e-3, (make.__name__, k)
