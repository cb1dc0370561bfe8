"""The ``cudnn`` rules of training batch norm without a GPU (the machine's
answer stubbed to "no GPU", so that these run the same on a GPU machine): each
declines with a reason (no GPU, no frontend, a dtype cuDNN graphs do not take),
and the survey of each training batch-norm node on cuda lists both the
generated kernel and cuDNN, in that order, so that autotune times both on a
GPU. The kernels run in tests/gpu/test_cudnn_batchnorm.py."""

from __future__ import annotations

import re
import sys

import attrs
import pytest

import opgraph as og
from opgraph import ops
from opgraph.backends import registry
from opgraph.backends.cuda import cudnn_norm_rules as rules, cudnn_rules
from opgraph.op import Lowered, abstract_of
from opgraph.passes.candidates import survey
from opgraph.passes.policy import LoweringPolicy
from opgraph.types import TensorType as T

X, STATS, W = T((4, 6, 3, 5), layout="NCHW"), T((2, 6)), T((6,))
NODES = [(ops.BatchNormTraining(eps=1e-3), (X, STATS, W, W)),
         (ops.BatchNormTrainingBackwardData(), (X, X, STATS, W)),
         (ops.BatchNormTrainingBackwardScale(), (X, STATS, X))]
IDS = ["forward", "backward_data", "backward_scale"]


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(cudnn_rules, "cuda_status", lambda: (False, "stubbed"))


@pytest.mark.parametrize("op, types_", NODES, ids=IDS)
def test_survey_on_cuda_lists_codegen_then_cudnn(op, types_, no_gpu):
    s = survey("bn", op, types_, "cuda", LoweringPolicy())
    assert s.order.index("codegen") < s.order.index("cudnn")
    assert [e.rule.algorithm for e in s.applicable()][:1] == ["codegen"]
    assert s.declined()["cudnn"] == "no GPU: stubbed"


@pytest.mark.parametrize("op, types_", NODES, ids=IDS)
def test_with_a_gpu_both_are_candidates(op, types_, monkeypatch):
    rule = registry.rules_for(type(op))["cudnn"]
    table = dict(registry.rules_for(type(op)), cudnn=attrs.evolve(rule, check=lambda *a: None))
    monkeypatch.setitem(registry._RULES, type(op), table)
    applicable = [e.rule.algorithm for e in survey("bn", op, types_, "cuda", LoweringPolicy()).applicable()]
    assert applicable.index("codegen") < applicable.index("cudnn")
    excluded = survey("bn", op, types_, "cuda", LoweringPolicy(exclude=["cudnn"]))
    assert "cudnn" not in [e.rule.algorithm for e in excluded.applicable()]


def test_a_missing_frontend_is_the_reason(monkeypatch):
    monkeypatch.setattr(cudnn_rules, "cuda_status", lambda: (True, ""))
    monkeypatch.setitem(sys.modules, "cudnn", None)  # import cudnn raises ImportError
    why = rules.check(*NODES[0], "cuda")
    assert "cuDNN frontend cannot be imported" in why and "nvidia-cudnn-frontend" in why


@pytest.mark.parametrize("x, match", [(T((4, 6, 3, 5), "float64"), "takes float32, float16, bfloat16; got float64"),
                                      (T((6,)), r"shape \(N, C, ...\)")])
def test_what_cudnn_never_takes_is_declined_before_any_gpu_question(x, match):
    why = rules.static_reason(ops.BatchNormTraining(), (x, STATS))
    assert why is not None and re.search(match, why)
    assert rules.check(ops.BatchNormTraining(), (x, STATS), "cuda") == why


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_a_training_step_on_cuda_runs_the_generated_batch_norm_without_autotune(layout, dtype, no_gpu):
    """cuDNN is not in the default order of non-convolution ops: it competes
    only under autotune; its reason is in the report. (Without a GPU the
    passes run as on one: they only ask the rules.)"""
    from opgraph.passes.base import PassContext
    from opgraph.passes.pipelines import default

    g = og.Graph()
    x, w, b = g.input("x", (4, 6, 5, 5)), g.param("w", (6,)), g.param("b", (6,))
    rm, rv = g.buffer("rm", (6,), value=0.0), g.buffer("rv", (6,), value=1.0)
    y, nm, nv = og.batch_norm(x, rm, rv, w, b, training=True, return_running_stats=True, name="bn")
    grads = og.grad(y, [x, w, b], grad_outputs=[y])
    pol = LoweringPolicy(layout=layout)
    ctx = PassContext(device="cuda", policy=pol, dtype=dtype)
    graph, outs = default(pol).run(g, [y, *grads, nm, nv], ctx)
    seen = {}
    for view in graph.nodes_in_order(outs):
        if isinstance(view.op, Lowered) and type(abstract_of(view.op)) in rules.GRAPHS:
            seen[abstract_of(view.op).name] = view.op.algorithm
            assert ctx.report.nodes[view.name].declined["cudnn"] == "no GPU: stubbed"
    # the fuse pass made the three gradients one pass of sums, its rows and the data gradient
    # from them (passes/fuse_bn_backward.py): those ops have no cuDNN rule
    assert set(seen) == {"BatchNormTraining"}
    assert set(seen.values()) == {"codegen"}
    made = {"BatchNormTrainingBackwardSums", "BatchNormBackwardSumsRow", "BatchNormTrainingBackwardDataFromSums"}
    assert {abstract_of(v.op).name: v.op.algorithm for v in graph.nodes_in_order(outs)
            if isinstance(v.op, Lowered) and abstract_of(v.op).name in made} == dict.fromkeys(made, "codegen")
