"""``scripts/bias_grad_bench.py`` without a GPU: the shapes it times are every 4-D bias gradient
of the models' training steps (read from the autodiff graph), and the ``vector`` method takes each
of them in bfloat16 (channels a multiple of its 8 lanes)."""

from __future__ import annotations

import sys

import pytest

from opgraph import ops
from opgraph.backends.cuda import rules
from opgraph.benchmarks.models import build
from opgraph.types import TensorType

from repo_scripts import load_script


@pytest.mark.parametrize("model, batch, convs", [("googlenet", 128, 57), ("vgg_a", 64, 8)])
def test_the_shapes_are_every_bias_gradient_of_the_model(model, batch, convs):
    shapes = load_script("bias_grad_bench").bias_shapes(model, batch)
    assert sum(shapes.values()) == convs  # one per convolution with a bias
    graph = build(model, batch=batch)
    conv_outputs = {tuple(v.type.shape) for v in graph.output.graph.nodes_in_order([graph.output])
                    if "conv" in type(v.op).__name__.lower()}
    assert conv_outputs and set(shapes) <= conv_outputs
    for shape in shapes:
        assert shape[0] == batch
        t = TensorType(shape, "bfloat16", layout="NHWC")
        assert {"method": "vector"} in rules.bias_variants(ops.BiasAddBackward(), [t], "cuda")


@pytest.mark.parametrize("argv, message", [
    (["--model", "googlnet:2"], "--model 'googlnet:2': no model 'googlnet': did you mean googlenet?"),
    (["--model", "googlenet"], "--model 'googlenet': give model:batch"),
    (["--model", "vgg_a:0"], "--model 'vgg_a:0': give model:batch"),
    (["--calls", "0"], "--calls 0: must be at least 1"),
    ([], "it times CUDA kernels: it needs an NVIDIA GPU and CuPy"),
])
def test_bad_arguments_and_no_cupy_are_one_line_errors(capsys, monkeypatch, argv, message):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError, GPU or not
    with pytest.raises(SystemExit) as e:
        load_script("bias_grad_bench").main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and "Traceback" not in err
