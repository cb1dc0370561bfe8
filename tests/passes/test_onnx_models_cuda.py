"""No step of a benchmark ONNX network runs the oracle on the GPU: every file of
tests/onnx/models imported at batch 2, its training step (the output and the
gradients of every parameter) compiled for cuda in NHWC with cuDNN's GPU check
stubbed (``passes_stubs.cudnn_accepts``), and no lowered node may be
``reference`` or ``direct``. bfloat16 storage for every model; float32 for
ConvNeXt (layer norm, sums over leading axes: the generated ``row``/``col``
kernels) and a few small models, so the module stays under a minute."""

from __future__ import annotations

import collections
import pathlib

import pytest

import opgraph as og
from opgraph.benchmarks.onnx_model import load_model
from opgraph.op import Lowered

from passes_stubs import compile_for_cuda, cudnn_accepts

pytest.importorskip("onnx")

FORBIDDEN = {"reference", "direct"}
MODELS_DIR = pathlib.Path(__file__).resolve().parents[1] / "onnx" / "models"
FILES = sorted(MODELS_DIR.glob("*.onnx"))
#: the float32 compiles: ConvNeXt always, and the smallest files of other kinds
FLOAT32 = ["convnext_tiny", "resnet18", "mobilenet_v3_small", "squeezenet1_1", "vgg11_bn"]
CASES = [(f, "bfloat16") for f in FILES] + [(MODELS_DIR / f"{name}.onnx", "float32") for name in FLOAT32]


def forbidden_steps(path, dtype: str) -> collections.Counter:
    """Op name -> count of the lowered steps on an oracle algorithm."""
    m = load_model(path, batch=2, dtype=dtype)
    outs = [m.output, *og.grad(m.output, m.params, grad_outputs=[m.output])]
    graph, louts, _ = compile_for_cuda(outs, og.LoweringPolicy(layout="NHWC"))
    nodes = [v for v in graph.nodes_in_order(louts) if isinstance(v.op, Lowered)]
    return collections.Counter(v.op.op.name for v in nodes if v.op.algorithm in FORBIDDEN)


def test_every_model_file_is_covered():
    assert len(FILES) == 22 and MODELS_DIR / "convnext_tiny.onnx" in FILES


@pytest.mark.parametrize("path,dtype", CASES, ids=[f"{p.stem}-{d}" for p, d in CASES])
def test_no_training_step_runs_the_oracle_on_cuda(monkeypatch, path, dtype):
    cudnn_accepts(monkeypatch)
    assert not forbidden_steps(path, dtype)
