"""cuDNN's training batch norm (``backends/cuda/cudnn_norm.py``) on the GPU.

* Against the float64 reference (``backends/reference/batchnorm_training.py``),
  fp32 and bf16 storage (fp16 once), NCHW and NHWC, and a 2-D (N, C) input:
  cuDNN's whole forward (y, the saved mean and inverse standard deviation,
  the running statistics with the unbiased variance and torch's momentum),
  the normalisation with given statistics (the ``BatchNormTraining`` rule),
  and the backward (dx through the statistics, dweight, dbias).
* Whole training steps with ``prefer={'norm': ['cudnn']}`` against the
  float64 reference, and an autotuned one in which every training batch-norm
  node's cuDNN and codegen candidates are checked correct and timed (with the
  fusion rules that rewrite those nodes into ops cuDNN has no rule for
  excluded: ``CUDNN_NODE_FUSIONS``).
* ``test_timing_cudnn_against_codegen`` prints (run with ``-s``) the median of
  CUDA-event times of cuDNN and of the generated kernels on ResNet-50's
  batch-norm shapes at batch 128: forward (codegen: stats + normalise + two
  running updates; cuDNN: the normalise rule, and its whole forward in one
  call), backward (codegen: dx + dweight + dbias nodes; cuDNN: the dx rule,
  and its whole backward in one call). It asserts nothing about speed.

Tolerances (SEMANTICS.md, relative to float64): fp32 1e-4, half storage 1e-2;
float32 statistics 1e-4 in every storage (computed from the stored x).
"""

from __future__ import annotations

import statistics

import numpy as np
import pytest

import opgraph as og
from opgraph import ops
from opgraph.backends.device import cuda_status
from opgraph.backends.reference import batchnorm_training as ref
from opgraph.types import TensorType, is_channels_last, numpy_dtype

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_status()[0], reason=f"no GPU: {cuda_status()[1]}")]

TOL = {"float32": 1e-4, "bfloat16": 1e-2, "float16": 1e-2}
EPS, MOMENTUM = 1e-3, 0.2
CASES = [("float32", "NCHW"), ("float32", "NHWC"), ("bfloat16", "NCHW"), ("bfloat16", "NHWC"),
         ("float16", "NHWC")]


@pytest.fixture
def cn():
    from opgraph.backends.cuda import cudnn_norm
    return cudnn_norm


def _host(cp, a):
    """float64 host copy of a device array (bfloat16 moved as its bits: CuPy
    copies uint16 arrays, not bfloat16 ones)."""
    if str(a.dtype) == "bfloat16":
        return cp.asnumpy(cp.ascontiguousarray(a.view(cp.uint16))).view(numpy_dtype("bfloat16")).astype(np.float64)
    return cp.asnumpy(a).astype(np.float64)


def _device(cp, host, dtype, layout="NCHW"):
    """``host`` stored as ``dtype`` on the device, a 4-D array in ``layout``
    (converted and transposed on the host)."""
    a = host.astype(numpy_dtype(dtype))
    if layout == "NHWC" and a.ndim == 4:
        return cp.asarray(np.ascontiguousarray(a.transpose(0, 2, 3, 1))).transpose(0, 3, 1, 2)
    return cp.asarray(a)


def _data(cp, rng, shape, dtype, layout):
    """``(device arrays, float64 host copies of the stored values)`` of x, gy,
    weight, bias, running mean and variance; x has per-channel offsets and scales."""
    c = shape[1]
    per_channel = (1, c) + (1,) * (len(shape) - 2)
    x = rng.standard_normal(shape) * rng.uniform(0.5, 3, c).reshape(per_channel) + \
        rng.uniform(-2, 2, c).reshape(per_channel)
    host = {"x": x, "gy": rng.standard_normal(shape), "w": rng.uniform(0.5, 1.5, c),
            "b": rng.standard_normal(c), "rm": rng.standard_normal(c), "rv": rng.uniform(0.5, 2, c)}
    dev, stored = {}, {}
    for k, v in host.items():
        dev[k] = _device(cp, v, dtype, layout)
        stored[k] = _host(cp, dev[k])
    return dev, stored


def _stats(stored):
    return ref.batch_norm_stats(np, stored["x"])


@pytest.mark.parametrize("dtype, layout", CASES)
def test_whole_forward_against_the_reference(cp, cn, rng, relerr, dtype, layout):
    dev, h = _data(cp, rng, (8, 16, 7, 9), dtype, layout)
    got = cn.batch_norm_training_forward(cp, dev["x"], dev["w"], dev["b"], dev["rm"], dev["rv"],
                                         eps=EPS, momentum=MOMENTUM)
    stats = _stats(h)
    want_y = ref.batch_norm_training(np, h["x"], stats, h["w"], h["b"], eps=EPS)
    n = 8 * 7 * 9
    assert got.y.dtype == dev["x"].dtype and is_channels_last(got.y) == (layout == "NHWC")
    assert relerr(_host(cp, got.y), want_y) < TOL[dtype]
    assert relerr(_host(cp, got.mean), stats[0]) < 1e-4
    assert relerr(_host(cp, got.inv_std), 1 / np.sqrt(stats[1] + EPS)) < 1e-4
    for name, s, running in (("mean", "rm", got.running_mean), ("var", "rv", got.running_var)):
        want = ref.batch_norm_running_update(np, stats, h[s], statistic=name, momentum=MOMENTUM, count=n)
        assert running.dtype == dev[s].dtype
        assert relerr(_host(cp, running), want) < TOL[dtype], f"running {name} (unbiased variance, momentum)"


@pytest.mark.parametrize("dtype, layout", CASES)
def test_normalize_with_the_node_s_statistics(cp, cn, rng, relerr, dtype, layout):
    from opgraph.backends.cuda.cudnn_norm_rules import KERNELS
    from opgraph.backends.registry import KernelContext
    from opgraph.backends.cuda.cudnn_norm_rules import check
    from opgraph.errors import LoweringError
    dev, h = _data(cp, rng, (8, 16, 7, 9), dtype, layout)
    stats = _stats(h)
    want = ref.batch_norm_training(np, h["x"], stats, h["w"], h["b"], eps=EPS)
    try:
        y = cn.batch_norm_normalize(cp, dev["x"], cp.asarray(stats.astype(np.float32)), dev["w"], dev["b"],
                                    eps=EPS)
    except LoweringError as e:  # cuDNN 9.19 on the H200 (2026-12-02) proposes no engine for this graph:
        # then the rule must decline the node with cuDNN's own reason, so that codegen runs it
        assert "cuDNN rejects bn_normalize" in str(e)
        x_type = TensorType((8, 16, 7, 9), dtype, layout=layout)
        why = check(ops.BatchNormTraining(eps=EPS), (x_type, TensorType((2, 16), "float32"),
                                                     TensorType((16,), dtype)), "cuda")
        assert why is not None and "cuDNN rejects" in why
        return
    assert relerr(_host(cp, y), want) < TOL[dtype]
    op = ops.BatchNormTraining(eps=EPS)
    out_type = TensorType((8, 16, 7, 9), dtype, layout=layout)
    y = KERNELS[ops.BatchNormTraining](KernelContext(cp, "cuda", {}, out_type), op, dev["x"],
                                        cp.asarray(stats.astype(np.float32)), dev["w"])
    assert is_channels_last(y) == (layout == "NHWC")
    assert relerr(_host(cp, y), ref.batch_norm_training(np, h["x"], stats, h["w"], eps=EPS)) < TOL[dtype]


@pytest.mark.parametrize("dtype, layout", CASES)
def test_backward_against_the_reference(cp, cn, rng, relerr, dtype, layout):
    dev, h = _data(cp, rng, (8, 16, 7, 9), dtype, layout)
    stats = _stats(h)
    dx, dw, db = cn.batch_norm_backward(cp, dev["gy"], dev["x"], cp.asarray(stats.astype(np.float32)),
                                        dev["w"], eps=EPS)
    want_dx = ref.batch_norm_training_backward_data(np, h["gy"], h["x"], stats, h["w"], eps=EPS)
    want_dw = ref.batch_norm_training_backward_scale(np, h["x"], stats, h["gy"], eps=EPS)
    assert is_channels_last(dx) == (layout == "NHWC") and dx.dtype == dev["x"].dtype
    assert relerr(_host(cp, dx), want_dx) < TOL[dtype]
    assert relerr(_host(cp, dw), want_dw) < TOL[dtype]
    assert relerr(_host(cp, db), h["gy"].sum(axis=(0, 2, 3))) < TOL[dtype]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_2d_input_is_seen_as_n_c_1_1(cp, cn, rng, relerr, dtype):
    dev, h = _data(cp, rng, (64, 24), dtype, "NCHW")
    stats = _stats(h)
    got = cn.batch_norm_training_forward(cp, dev["x"], dev["w"], dev["b"], eps=EPS, momentum=MOMENTUM)
    assert got.y.shape == (64, 24)
    assert relerr(_host(cp, got.y), ref.batch_norm_training(np, h["x"], stats, h["w"], h["b"], eps=EPS)) < TOL[dtype]
    dx, _, _ = cn.batch_norm_backward(cp, dev["gy"], dev["x"], cp.asarray(stats.astype(np.float32)), eps=EPS)
    want = ref.batch_norm_training_backward_data(np, h["gy"], h["x"], stats, eps=EPS)
    assert relerr(_host(cp, dx), want) < TOL[dtype]


def test_an_empty_batch_calls_no_cudnn(cp, cn):
    x = cp.zeros((0, 4, 3, 3), cp.float32)
    got = cn.batch_norm_training_forward(cp, x, running_mean=cp.ones(4, cp.float32), eps=EPS, momentum=0.5)
    assert got.y.shape == (0, 4, 3, 3) and float(got.running_mean.sum()) == 4.0
    assert cn.batch_norm_normalize(cp, x, cp.zeros((2, 4), cp.float32)).shape == (0, 4, 3, 3)


# ----------------------------------------------------------------- whole graphs


def _bn_step(shape=(8, 16, 6, 6)):
    g = og.Graph()
    x, w, b = g.input("x", shape), g.param("w", shape[1:2]), g.param("b", shape[1:2])
    rm, rv = g.buffer("rm", shape[1:2], value=0.0), g.buffer("rv", shape[1:2], value=1.0)
    y, nm, nv = og.batch_norm(x, rm, rv, w, b, training=True, momentum=MOMENTUM, eps=EPS,
                              return_running_stats=True, name="bn")
    z = og.relu(y)
    outs = [z, *og.grad(z, [x, w, b]), nm, nv]
    rng = np.random.default_rng(5)
    feeds = {"x": 2 * rng.standard_normal(shape) + 1, "w": rng.uniform(0.5, 1.5, shape[1]),
             "b": rng.standard_normal(shape[1])}
    return z, outs, feeds, rng.standard_normal(shape)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_training_step_with_cudnn_batch_norm(cp, relerr, layout, dtype):
    """fp32: against float64 (1e-3: a chain of ops); bf16 storage: against the
    same step on the generated kernels (2e-2: per-op rounding of two routes)
    and loosely against float64 (ReLU masks flip where bf16 rounds y across 0)."""
    z, outs, feeds, gz = _bn_step()
    want = og.compile(outs, device="cpu", pipeline="reference", dtype="float64")(grad_outputs={z: gz}, **feeds)
    f32 = {k: v.astype(np.float32) for k, v in feeds.items()}
    runs = {}
    for algo in ("cudnn", "codegen"):
        exe = og.compile(outs, device="cuda", dtype=dtype, policy=og.LoweringPolicy(prefer={"norm": [algo]},
                                                                                     layout=layout))
        on_cudnn = sorted(st.op.op.name for st in exe.steps if st.op.algorithm == "cudnn")
        # the normalisation only where cuDNN builds its graph (declined on the H200 with cuDNN 9.19)
        want_on = {"BatchNormTrainingBackwardData", "BatchNormTrainingBackwardScale"} if algo == "cudnn" else set()
        assert want_on <= set(on_cudnn) <= want_on | ({"BatchNormTraining"} if algo == "cudnn" else set())
        runs[algo] = [_host(cp, a) for a in exe(grad_outputs={z: gz.astype(np.float32)}, **f32)]
    names = ["z", "dx", "dw", "db", "running_mean", "running_var"]
    for name, a, b, w in zip(names, runs["cudnn"], runs["codegen"], want):
        if dtype is None:
            assert relerr(a, w) < 1e-3, name
        else:
            assert relerr(a, b) < 2e-2, f"{name}: cudnn against codegen"
            assert relerr(a, w) < 1e-1, f"{name}: against float64"


#: The fusion rules that take the training batch norm's nodes from cuDNN: by
#: default on cuda, ``bn-backward-sums`` rewrites the data and scale gradients
#: into ops cuDNN has no rule for (BatchNormTrainingBackwardSums, ...FromSums,
#: BatchNormBackwardSumsRow) and ``elementwise`` fuses the normalisation into
#: the ReLU's generated kernel (a FusedElementwise step), both before autotune.
CUDNN_NODE_FUSIONS = ["bn-backward-sums", "elementwise"]


def test_autotune_checks_and_times_cudnn_and_codegen(cp, relerr, tmp_path):
    """With the fusions that remove them excluded, each training batch-norm
    node cuDNN implements is tuned: its codegen and cuDNN candidates checked
    correct and timed (cuDNN's normalisation, which cuDNN 9.19 declines on
    the H200, is then codegen's alone: not tuned, cuDNN's reason reported)."""
    z, outs, feeds, gz = _bn_step((32, 64, 14, 14))
    exe = og.compile(outs, device="cuda", dtype="bfloat16",
                     policy=og.LoweringPolicy(layout="NHWC", autotune=True, cache=str(tmp_path / "c.json"),
                                              exclude=CUDNN_NODE_FUSIONS))
    seen = []
    for st in exe.steps:
        if st.op.op.name in ("BatchNormTraining", "BatchNormTrainingBackwardData", "BatchNormTrainingBackwardScale"):
            rec = exe.report.node(st.name)
            rows = rec.candidates
            seen.append(st.op.op.name)
            if st.op.op.name == "BatchNormTraining" and "cudnn" in rec.declined:
                # the normalisation graph declined (cuDNN 9.19 on the H200): codegen alone, untimed
                assert rec.declined["cudnn"] and st.op.algorithm == "codegen", (st.name, rec)
                continue
            for algo in ("codegen", "cudnn"):
                mine = [c for c in rows if c.algorithm == algo]
                assert any(c.status in ("ok", "chosen") and c.time_ms is not None for c in mine), \
                    (st.name, algo, [(c.label, c.status, c.reason) for c in rows])
            print(f"{st.name}: chosen {st.op.algorithm}; "
                  + ", ".join(f"{c.label} {c.time_ms:.3f} ms" for c in rows if c.time_ms is not None))
    assert sorted(seen) == ["BatchNormTraining", "BatchNormTrainingBackwardData",
                            "BatchNormTrainingBackwardScale"], [st.op.op.name for st in exe.steps]
    want = og.compile(outs, device="cpu", pipeline="reference", dtype="float64")(grad_outputs={z: gz}, **feeds)
    got = exe(grad_outputs={z: gz.astype(np.float32)}, **{k: v.astype(np.float32) for k, v in feeds.items()})
    for a, w in zip(got, want):
        assert relerr(_host(cp, a), w) < 1e-1  # bf16 storage end to end (see the test above)


# ----------------------------------------------------------------- timing (printed)

#: ResNet-50's batch-norm inputs at batch 128 (the first, and one per stage).
SHAPES = [(128, 64, 112, 112), (128, 256, 56, 56), (128, 512, 28, 28), (128, 1024, 14, 14), (128, 2048, 7, 7)]


def _median_ms(fn, repeats=20):
    from opgraph.passes.autotune import CudaEventTimer
    return 1e3 * statistics.median(CudaEventTimer().measure(fn, label="", warmup=3, repeats=repeats))


def _declined_nan(time_it):
    """``time_it()``, or NaN where cuDNN proposes no engine for the graph."""
    from opgraph.errors import LoweringError
    try:
        return time_it()
    except LoweringError:
        return float("nan")


def _codegen(op, out_type):
    from opgraph.backends.registry import KernelContext, lookup
    rule = lookup(type(op), "codegen")
    ctx = KernelContext(__import__("cupy"), "cuda", {}, out_type)
    return lambda *arrays: rule.kernel(ctx, op, *arrays)


@pytest.mark.parametrize("dtype, layout", [("bfloat16", "NHWC"), ("float32", "NCHW")])
def test_timing_cudnn_against_codegen(cp, cn, to_cl, dtype, layout):
    from opgraph.backends.cuda.storage import like, unbits

    def stored(a32):  # a float32 device array in ``dtype`` storage, layout kept
        return unbits(like(cp, a32, dtype), dtype)

    rows = []
    for shape in SHAPES:
        n, c = shape[0] * shape[2] * shape[3], shape[1]
        x, gy = (stored(to_cl(r) if layout == "NHWC" else r)
                 for r in (cp.random.standard_normal(shape, dtype=cp.float32) for _ in range(2)))
        w, b = stored(cp.ones(c, cp.float32)), stored(cp.zeros(c, cp.float32))
        rm, rv = stored(cp.zeros(c, cp.float32)), stored(cp.ones(c, cp.float32))
        xt = TensorType(shape, dtype, layout=layout)
        st = TensorType((2, c), "float32")
        vt = TensorType((c,), dtype)
        stats_k = _codegen(ops.BatchNormStats(), st)
        norm_k = _codegen(ops.BatchNormTraining(eps=EPS), xt)
        upd = [_codegen(ops.BatchNormRunningUpdate(statistic=s, momentum=MOMENTUM, count=n), vt) for s in ("mean", "var")]
        bwd_dx = _codegen(ops.BatchNormTrainingBackwardData(eps=EPS), xt)
        bwd_dw = _codegen(ops.BatchNormTrainingBackwardScale(eps=EPS), vt)
        bwd_db = _codegen(ops.BiasAddBackward(), vt)
        stats = stats_k(x)

        def codegen_fwd():
            s = stats_k(x)
            return norm_k(x, s, w, b), upd[0](s, rm), upd[1](s, rv)

        def codegen_bwd():
            return bwd_dx(gy, x, stats, w), bwd_dw(x, stats, gy), bwd_db(gy)

        t = {
            "fwd codegen (4 nodes)": _median_ms(codegen_fwd),
            "fwd codegen normalise": _median_ms(lambda: norm_k(x, stats, w, b)),
            "fwd cudnn normalise (rule)": _declined_nan(lambda: _median_ms(
                lambda: cn.batch_norm_normalize(cp, x, stats, w, b, eps=EPS))),
            "fwd cudnn whole": _median_ms(lambda: cn.batch_norm_training_forward(cp, x, w, b, rm, rv, eps=EPS,
                                                                                 momentum=MOMENTUM)),
            "bwd codegen (3 nodes)": _median_ms(codegen_bwd),
            "bwd codegen dx": _median_ms(lambda: bwd_dx(gy, x, stats, w)),
            "bwd cudnn whole (= dx rule)": _median_ms(lambda: cn.batch_norm_backward(cp, gy, x, stats, w, eps=EPS)),
        }
        rows.append((shape, t))
    print(f"\ncuDNN vs codegen batch norm, {dtype} {layout}, median of CUDA events (ms)")
    names = list(rows[0][1])
    print(f"{'shape':<22}" + "".join(f"{k:>30}" for k in names))
    for shape, t in rows:
        print(f"{str(shape):<22}" + "".join(f"{t[k]:>30.3f}" for k in names))
