"""``scripts/gpu_codegen_bench.py`` without a GPU: its cases are ResNet-50's
batch-norm inputs, and the code generator plans every one of them (the rule's
check builds the launch plan; no source is compiled)."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

from opgraph.backends.registry import rules_for
from opgraph.benchmarks.models import build

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "gpu_codegen_bench.py"


def _script():
    spec = importlib.util.spec_from_file_location("gpu_codegen_bench", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_shapes_are_resnet50s_batch_norm_inputs():
    from opgraph import ops
    from opgraph.op import abstract_of
    model = build("resnet50", batch=128)
    shapes = {tuple(v.inputs[0].type.shape[1:]) for v in model.output.graph.nodes_in_order([model.output])
              if isinstance(abstract_of(v.op), ops.BatchNormTraining)}
    assert shapes == set(_script().RESNET50_BN)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_case_is_planned_by_the_generator(dtype):
    cases = _script().cases(128, dtype, "NHWC")
    assert len(cases) == 4 * 12
    for case in cases:
        why = rules_for(type(case["op"]))["codegen"].check(case["op"], case["types"], "cuda")
        assert why is None, (case["name"], case["shape"], why)
