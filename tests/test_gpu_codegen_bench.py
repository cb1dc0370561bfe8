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


def test_the_layer_norm_shapes_are_convnext_tinys():
    """Each (C, H, W) is the input of a ConvNeXt-tiny layer norm over its channels (read from
    the ONNX file the benchmark imports), every stage's; the head's one (1 x 1) is left out."""
    pytest.importorskip("onnx")
    from opgraph import ops
    from opgraph.benchmarks.onnx_model import load_model

    script = _script()
    batch, shapes = script.LAYER_NORM_MODELS["convnext_tiny"]
    model = load_model("tests/onnx/models/convnext_tiny.onnx", batch=batch, dtype="bfloat16")
    found = set()
    for node in model.graph.nodes_in_order():
        if isinstance(node.op, ops.LayerNorm):
            n, h, w, c = node.inputs[0].type.shape
            assert (n, node.op.normalized_shape) == (batch, (c,))
            found.add((c, h, w))
    assert found - {(768, 1, 1)} == set(shapes)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_layer_norm_cases_are_one_kernel_or_two(monkeypatch, dtype):
    """Each layer-norm case is planned by the generator; with ``plan.ROW_SWEEP`` (what
    ``--row-sweep 1`` sets) one ``row_sweep`` launch, without it a reduction and a sweep, so
    ``--row-sweep 0,1`` times the two plans."""
    from opgraph.backends.cuda.codegen import plan

    script = _script()
    batch, shapes = script.LAYER_NORM_MODELS["convnext_tiny"]
    cases = script.layer_norm_cases(batch, dtype, shapes)
    assert [c["name"] for c in cases] == ["layer_norm", "layer_norm_dx"] * len(shapes)
    for case in cases:
        rows = case["shape"][0] * case["shape"][2] * case["shape"][3]
        assert case["types"][0].shape == (rows, case["shape"][1]) and case["out"].shape == (rows, case["shape"][1])
        assert rules_for(type(case["op"]))["codegen"].check(case["op"], case["types"], "cuda") is None
        for row_sweep, kinds in ((True, ["rowsweep"]), (False, ["reduce", "sweep"])):
            monkeypatch.setattr(plan, "ROW_SWEEP", row_sweep)
            lowered = plan.lower(case["op"], case["types"], case["out"])
            assert [x.name.split("_")[2] for x in lowered.launches] == kinds, (case["name"], case["shape"])


def test_dtypes_are_comma_separated():
    import argparse
    script = _script()
    assert script._dtypes("bfloat16,float32") == ["bfloat16", "float32"]
    with pytest.raises(argparse.ArgumentTypeError, match="float8"):
        script._dtypes("bfloat16,float8")


@pytest.mark.parametrize("argv,message", [
    (["--row-sweep", "5"], r"argument --row-sweep: \[5\]: each must be 0 or 1"),
    (["--blocks", "abc"], r"argument --blocks: 'abc': comma-separated ints expected"),
    (["--calls", "0"], r"argument --calls: 0: must be >= 1"),
    (["--batch", "-3"], r"argument --batch: -3: must be >= 1"),
    (["--model", "convnext_tiny", "--blocks", "528"], r"--blocks: the kernels of --model convnext_tiny do not read it"),
    (["--model", "convnext_tiny", "--layout", "NCHW"], r"--layout: the kernels of --model convnext_tiny"),
    (["--model", "resnet50", "--row-sweep", "0,1"], r"--row-sweep: the kernels of --model resnet50 do not read it"),
])
def test_bad_or_inapplicable_flags_exit_2_before_any_gpu_work(capsys, argv, message):
    """Every value is checked when parsed (a ``--blocks abc`` was a ValueError traceback after CuPy's
    import, ``--row-sweep 5`` ran as 1), and a flag the model's kernels do not read is refused, not
    run without: exit 2 with one line naming the flag, whether or not there is a GPU."""
    import re
    with pytest.raises(SystemExit) as e:
        _script().main(argv)
    assert e.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_without_a_gpu_it_says_what_it_needs(capsys, monkeypatch):
    """No GPU (CuPy missing here, or no device): exit 2 with what it needs, no traceback."""
    from opgraph.backends import device
    monkeypatch.setattr(device, "cuda_status", lambda: (False, "CuPy cannot be imported (no module)"))
    with pytest.raises(SystemExit) as e:
        _script().main(["--model", "convnext_tiny"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "needs an NVIDIA GPU and CuPy; here: CuPy cannot be imported" in err
