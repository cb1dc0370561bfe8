"""``scripts/gpu_codegen_bench.py`` without a GPU: its cases are ResNet-50's
batch-norm inputs, and the code generator plans every one of them (the rule's
check builds the launch plan; no source is compiled)."""

from __future__ import annotations

import pytest

from opgraph.backends.registry import rules_for
from opgraph.benchmarks.models import build

from repo_scripts import load_script


def _script():
    return load_script("gpu_codegen_bench")


def _batch_norm_inputs(name: str, batch: int) -> set:
    from opgraph import ops
    from opgraph.op import abstract_of
    model = build(name, batch=batch)
    return {tuple(v.inputs[0].type.shape[1:]) for v in model.output.graph.nodes_in_order([model.output])
            if isinstance(abstract_of(v.op), ops.BatchNormTraining)}


def test_the_shapes_are_resnet50s_batch_norm_inputs():
    assert _batch_norm_inputs("resnet50", 128) == set(_script().RESNET50_BN)


def test_the_densenet_shapes_are_densenet121s_batch_norm_inputs():
    """Each (C, H, W) is a batch-norm input of DenseNet-121, and each view's
    buffer is its block's concat buffer: the block's last input plus the
    growth rate (32), at that resolution."""
    script = _script()
    shapes = _batch_norm_inputs("densenet121", 64)
    assert {s[:3] for s in script.DENSENET121_BN} <= shapes
    widest = {}  # resolution -> the widest dense-layer input, from the model
    for c, h, w in shapes:
        widest[h] = max(widest.get(h, 0), c)
    for c, h, w, view_of in script.DENSENET121_BN:
        if view_of:
            assert c < view_of and (c - widest[h]) % 32 == 0, (c, h, w, view_of)
            assert view_of in (widest[h] + 32, widest[h]), (c, h, view_of, widest[h])


@pytest.mark.parametrize("model", ["resnet50", "densenet121"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_case_is_planned_by_the_generator(dtype, model):
    batch, shapes = _script().MODELS[model]
    cases = _script().cases(batch, dtype, "NHWC", shapes)
    assert len(cases) == 4 * len(shapes)
    for case in cases:
        why = rules_for(type(case["op"]))["codegen"].check(case["op"], case["types"], "cuda")
        assert why is None, (case["name"], case["shape"], why)
