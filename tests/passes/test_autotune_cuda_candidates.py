"""Which nodes autotune tunes on cuda, and between which candidates, without a
GPU: the premises of the GPU tests that autotune checks and times cuBLAS
(``tests/gpu/test_cublas_matmul_gpu.py``) and cuDNN's training batch norm
against codegen (``tests/gpu/test_cudnn_batchnorm.py``), so that a change of
the fusion table or of the candidate rules that leaves those tests nothing to
check fails here, on every machine.

The default pipeline runs for device ``cuda`` with NumPy arrays; every rule
of the graph's ops that runs on cuda gets the oracle's kernel (the real ones
need CuPy), and cuDNN's batch-norm rules accept what they accept on a GPU
(their check, variants and workspace build cuDNN plans). Each candidate is
therefore checked and timed (``StubTimer``) as on the GPU; only which rules
compete is under test, not their kernels.
"""

from __future__ import annotations

import attrs
import numpy as np

import opgraph as og
from opgraph.backends import registry
from opgraph.graph import graph_of
from opgraph.passes.autotune import REFERENCE_ALGORITHMS
from opgraph.passes.base import PassContext
from opgraph.passes.pipelines import build

from passes_stubs import StubTimer

#: The training batch norm's nodes that cuDNN has rules for (backends/cuda/cudnn_norm_rules.py).
CUDNN_BN_OPS = ("BatchNormTraining", "BatchNormTrainingBackwardData", "BatchNormTrainingBackwardScale")
#: The fusion rules the GPU test excludes so that those nodes stay in the graph.
CUDNN_NODE_FUSIONS = ["bn-backward-sums", "elementwise"]


def oracle_kernels_on_cuda(monkeypatch):
    """Every cuda rule of an op with an oracle runs the oracle's kernel; cuDNN's
    batch-norm rules accept a node whatever cuDNN would say of it on a GPU
    but for dtype, layout and rank (``static_reason``), with one engine."""
    from opgraph.backends.cuda.cudnn_norm_rules import static_reason

    registry.rules_for(og.ops.Linear)  # the backends loaded
    for op_type, rules in list(registry._RULES.items()):
        if "reference" not in rules:
            continue
        table = dict(rules)
        for algo, rule in rules.items():
            if algo in REFERENCE_ALGORITHMS or "cuda" not in rule.devices:
                continue
            change = {"kernel": rules["reference"].kernel}
            if algo == "cudnn" and op_type.__name__ in CUDNN_BN_OPS:
                change.update(check=lambda op, types, device: static_reason(op, types),
                              variants=lambda op, types, device, limit=None: [{"engine": 0}],
                              workspace=lambda op, types, options: 0)
            table[algo] = attrs.evolve(rule, **change)
        monkeypatch.setitem(registry._RULES, op_type, table)


def tune_for_cuda(outs, policy, dtype=None):
    """The default pipeline (autotune on) for cuda: ``{step name: (op name,
    algorithm, report record)}`` for every lowered step."""
    ctx = PassContext(device="cuda", policy=policy, dtype=dtype, xp=np, timer=StubTimer({}))
    graph, louts = build("default", policy).run(graph_of(*outs), list(outs), ctx)
    return {v.name: (v.op.op.name, v.op.algorithm, ctx.report.node(v.name))
            for v in graph.nodes_in_order(louts) if v.name in ctx.report.nodes}


def bn_relu_step(shape=(4, 8, 5, 5)):
    """The GPU test's training step: batch norm (running statistics), ReLU, the gradients."""
    g = og.Graph()
    x, w, b = g.input("x", shape), g.param("w", shape[1:2]), g.param("b", shape[1:2])
    rm, rv = g.buffer("rm", shape[1:2], value=0.0), g.buffer("rv", shape[1:2], value=1.0)
    y, nm, nv = og.batch_norm(x, rm, rv, w, b, training=True, momentum=0.2, eps=1e-3,
                              return_running_stats=True, name="bn")
    z = og.relu(y)
    return [z, *og.grad(z, [x, w, b]), nm, nv]


def test_cudnn_competes_on_the_batch_norm_nodes_once_the_fusions_that_rewrite_them_are_excluded(
        monkeypatch, tmp_path):
    oracle_kernels_on_cuda(monkeypatch)
    policy = dict(layout="NHWC", autotune=True, cache=str(tmp_path / "c.json"))
    # by default bn-backward-sums and elementwise rewrite all three before autotune
    steps = tune_for_cuda(bn_relu_step(), og.LoweringPolicy(**policy), "bfloat16")
    assert not [op for op, _, _ in steps.values() if op in CUDNN_BN_OPS], steps
    assert not [n for n, (_, _, rec) in steps.items() if any(c.algorithm == "cudnn" for c in rec.candidates)]

    steps = tune_for_cuda(bn_relu_step(), og.LoweringPolicy(**policy, exclude=CUDNN_NODE_FUSIONS), "bfloat16")
    tuned = {op: rec for op, _, rec in steps.values() if op in CUDNN_BN_OPS}
    assert sorted(tuned) == sorted(CUDNN_BN_OPS), steps
    for op, rec in tuned.items():
        timed = {c.algorithm for c in rec.candidates if c.status in ("ok", "chosen") and c.time_ms is not None}
        assert rec.how == "autotune" and {"codegen", "cudnn"} <= timed, (op, rec.candidates)


def test_cublas_is_tuned_on_cuda_only_beside_a_second_linear_rule(monkeypatch):
    """Linear's cuda candidates are cublas and the oracle, which does not compete
    there: a single candidate, not tuned. The GPU test registers the oracle's
    kernel again under another name, which competes."""
    oracle_kernels_on_cuda(monkeypatch)
    g = og.Graph("classifier")
    outs = [og.linear(g.input("x", (16, 32)), g.param("w", (10, 32)), name="fc")]
    policy = og.LoweringPolicy(autotune=True, precision="tf32", cache="off")
    _, algo, rec = tune_for_cuda(outs, policy)["fc"]
    assert (algo, rec.how, rec.candidates) == ("cublas", "policy", [])

    rules = registry.rules_for(og.ops.Linear)
    monkeypatch.setitem(registry._RULES, og.ops.Linear,
                        {**rules, "oracle-standin": attrs.evolve(rules["reference"], algorithm="oracle-standin")})
    _, _, rec = tune_for_cuda(outs, policy)["fc"]
    rows = {c.algorithm: c for c in rec.candidates}
    assert rec.how == "autotune" and set(rows) == {"cublas", "oracle-standin"}, rec.candidates
    assert rows["cublas"].options == {"precision": "tf32"} and rows["cublas"].time_ms is not None
