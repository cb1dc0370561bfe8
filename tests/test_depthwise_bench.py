"""``scripts/depthwise_bench.py`` without a GPU: its layer shapes are ConvNeXt-tiny's depthwise
layers (read from the ONNX file the benchmark imports), and it refuses to run without a GPU."""

from __future__ import annotations

import pytest

from repo_scripts import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("depthwise_bench")


def test_the_shapes_are_convnext_tinys_depthwise_layers(script):
    pytest.importorskip("onnx")
    from opgraph.benchmarks.onnx_model import load_model
    from opgraph.ops import Conv2d

    model = load_model("tests/onnx/models/convnext_tiny.onnx", batch=128, dtype="bfloat16")
    found = set()
    for node in model.graph.nodes_in_order():
        if isinstance(node.op, Conv2d) and node.op.groups > 1:
            x, w = (v.type.shape for v in node.inputs[:2])
            assert (w[2:], node.op.padding, node.op.stride) == (script.KERNEL, script.PADDING, (1, 1))
            found.add(x)
    assert found == set(script.SHAPES)


def test_without_a_gpu_it_says_so(script, capsys, monkeypatch):
    from opgraph.backends import device
    monkeypatch.setattr(device, "cuda_status", lambda: (False, "no CUDA device"))
    with pytest.raises(SystemExit) as e:
        script.main([])
    assert e.value.code == 2 and "needs a CUDA GPU: no CUDA device" in capsys.readouterr().err
