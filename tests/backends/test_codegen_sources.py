"""Every source the code generator emits compiles with nvcc for the H200
(``-arch=sm_90``, ``-ptx``: no GPU needed), so that a GPU session meets no
compile error: every op of the expression table in float32, bfloat16,
float16 and float64 and both layouts, the fused programs, split reductions
and their finishing kernels, 64-bit indices, in-place sweeps and the strided
copies. The kernels are recorded, not run. Also checked on the text: no
atomics (every sum has a fixed order), 16-byte accesses where the plan says
so, and the kernels' signatures as the launch plans fill them."""

from __future__ import annotations

import re

import numpy as np
import pytest

from codegen_cases import CASES, ODD_SHAPE, SHAPES, fused_cases, make_input, out_type
from cuda_cpu_emulator import NVCC, EmulatedCupy, nvcc_check
from cupy_standin import cupy_replaced
from opgraph import ops
from opgraph.backends.cuda.codegen import copies, launch, movement, plan
from opgraph.types import TensorType

DTYPES = ["float32", "bfloat16", "float16", "float64"]


def _record_everything(emu, monkeypatch):
    rng = np.random.default_rng(0)

    def run(op, kinds, shape, dtype, layout, **kw):
        arrays = [make_input(rng, k, shape, dtype, layout) for k in kinds]
        launch.run(np, op, arrays, out_type(op, arrays, layout), **kw)

    for layout in ("NCHW", "NHWC"):
        shape = SHAPES[layout]
        for dtype in DTYPES:
            for case in CASES:
                run(case.make(shape), case.kinds, shape, dtype, layout)
            for _, op, kinds in fused_cases():
                run(op, kinds, shape, dtype, layout)
        for case in CASES[:12]:
            run(case.make(ODD_SHAPE), case.kinds, ODD_SHAPE, "bfloat16", layout)
    x = make_input(rng, "x", SHAPES["NHWC"], "bfloat16", "NHWC")
    launch.run(np, ops.Relu(), [x], out_type(ops.Relu(), [x], "NHWC"), out=x)  # in place: no __restrict__
    _record_layer_norms(rng)
    monkeypatch.setattr(plan, "TARGET_BLOCKS", 8)
    monkeypatch.setattr(plan, "MIN_PER_THREAD", 1)
    monkeypatch.setattr(plan, "INT32_LIMIT", 100)
    monkeypatch.setattr(plan, "FINISH_BYTES", 32 * 1024)  # the last-block form too (off by default)
    launch._PLANS.clear()
    _record_layer_norms(rng, dtypes=("bfloat16",))  # 64-bit indices
    for layout in ("NCHW", "NHWC"):
        for case in CASES:
            if case.id in ("BiasAddBackward()", "BatchNormStats()", "GlobalAvgPool2d()",
                           "BatchNormTrainingBackwardData(eps=1e-05)", "Dropout(p=0.3, training=True, seed=11)"):
                run(case.make((8, 16, 16, 24)), case.kinds, (8, 16, 16, 24), "bfloat16", layout)
    for dtype, layout in (("bfloat16", "NHWC"), ("float32", "NCHW"), ("float16", "NHWC")):
        xs = [make_input(rng, "x", (2, c, 5, 6), dtype, layout) for c in (8, 3)]
        y = movement.concat(np, *xs, axis=1)
        movement.slice_backward(np, movement.slice_(np, y, axis=1, start=1, stop=9), axis=1, start=1, stop=9,
                                input_shape=y.shape)
        movement.pad(np, xs[0], padding=((1, 0), (2, 1)), value=float("-inf"))
        movement.transpose(np, xs[1], perm=(0, 2, 3, 1))


def _record_layer_norms(rng, dtypes=DTYPES):
    """Layer norm's ops (``layer_norm_cases``) in ``dtypes``: row sums and their sweep in one
    kernel (``kernels.row_sweep``, also in place) or two, the scale gradient's column sums."""
    from layer_norm_cases import LAYER_NORM_CASES, inputs
    for dtype in dtypes:
        for op_type, kinds in LAYER_NORM_CASES:
            for shape in ((3, 7, 24), (37, 5), (6, 1)):
                op = op_type(normalized_shape=shape[-1:], eps=1e-5)
                arrays = inputs(rng, kinds, shape, 1, dtype)
                launch.run(np, op, arrays, op.infer(*(TensorType(a.shape, a.dtype.name) for a in arrays)))
    x = inputs(rng, "x", (9, 96), 1, "bfloat16")[0]
    op = ops.LayerNorm(normalized_shape=(96,))
    launch.run(np, op, [x], op.infer(TensorType(x.shape, x.dtype.name)), out=x)


@pytest.fixture(scope="module")
def recorded():
    """Every emitted source (and the launches), recorded once for the module."""
    mp = pytest.MonkeyPatch()
    emu = EmulatedCupy(run=False)
    try:
        mp.setattr(launch, "_PLANS", {})
        with cupy_replaced(mp, emu, launch.compiled, copies._plan):
            _record_everything(emu, mp)
    finally:
        mp.undo()
    return emu


def test_no_atomics_and_vector_accesses_where_planned(recorded):
    sources = set(recorded.raw_sources)
    assert len(sources) > 300
    # deterministic: fixed-order sums only; the one atomic is a tile's ticket (who adds, not what)
    atomics = [line.strip() for s in sources for line in s.splitlines() if "atomic" in line]
    assert atomics and all(a.startswith("og_last = atomicAdd(tickets + tile, 1u) == S - 1;") for a in atomics)
    vectors = [s for s in sources if "uint4" in s]
    assert len(vectors) > len(sources) // 2
    assert any("typedef long long IDX;" in s for s in sources) and any("DIRECT" in s for s in sources)
    assert any("__restrict__" not in s.split("extern")[-1] for s in sources)  # the in-place sweep
    rowsweeps = [s for s in sources if "opgraph_gen_rowsweep_" in s]  # layer norm's one-kernel rows
    assert len(rowsweeps) > 20 and any("__restrict__" not in s.split("extern")[-1] for s in rowsweeps)


def test_launch_arguments_match_the_signatures(recorded):
    """Each recorded launch passes one argument per parameter, each of the
    declared kind (the emulator checks types when it runs a kernel)."""
    from cuda_raw_emulator import parse_signature
    for call in recorded.raw_launches:
        sig = parse_signature(call["source"], call["name"])
        assert len(sig) == len(call["args"]), call["name"]
        for (ctype, name), arg in zip(sig, call["args"]):
            assert ctype.endswith("*") == isinstance(arg, np.ndarray), (call["name"], name)
        assert all(g >= 1 for g in call["grid"]) and call["block"] == (256, 1, 1)


@pytest.mark.skipif(NVCC is None, reason="no nvcc")
def test_every_generated_source_compiles_for_sm_90(recorded):
    sources = sorted(set(recorded.raw_sources))
    ptx = nvcc_check(sources)
    assert len(re.findall(r"\.entry (\w+)\(", ptx)) == len(sources) > 300
