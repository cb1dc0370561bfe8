"""The layout pass keeps permutes views (``passes/layout.py``): the layouts it
stamps on every benchmark network's training step, NHWC policy on cuda.

Only a 4-D permute can give a value a layout unlike the policy's, so every
network without one keeps all its 4-D values NHWC, exactly as when the pass
stamped the policy layout on everything; ConvNeXt's permutes to (N, H, W, C)
and what is computed from them up to the permute back are NCHW (the
C-contiguous view of the NHWC buffer), and no op outside
``FOLLOWING`` ever reads such a value."""

from __future__ import annotations

import pathlib

import pytest

import opgraph as og
from opgraph import ops
from opgraph.benchmarks import models
from opgraph.op import Source
from opgraph.passes.base import PassContext
from opgraph.passes.layout import FOLLOWING, LayoutPass, transpose_layout
from opgraph.passes.policy import LoweringPolicy

MODELS_DIR = pathlib.Path(__file__).resolve().parents[1] / "onnx" / "models"
FILES = sorted(MODELS_DIR.glob("*.onnx"))
NHWC = PassContext(device="cuda", policy=LoweringPolicy(layout="NHWC"))


def test_transpose_layout_follows_the_physical_order():
    assert transpose_layout("NHWC", (0, 2, 3, 1)) == "NCHW"   # ConvNeXt's permute: the buffer itself
    assert transpose_layout("NCHW", (0, 3, 1, 2)) == "NHWC"   # and back
    assert transpose_layout("NHWC", (0, 1, 2, 3)) == "NHWC"
    assert transpose_layout("NCHW", (0, 1, 2, 3)) == "NCHW"
    assert transpose_layout("NCHW", (0, 2, 3, 1)) is None     # neither: a copy
    assert transpose_layout("NHWC", (0, 3, 1, 2)) is None
    assert transpose_layout("NHWC", (0, 1, 3, 2)) is None
    assert transpose_layout("NCHW", (1, 0, 2, 3)) is None


def _training_graph(m):
    outs = [m.output, *og.grad(m.output, m.params, grad_outputs=[m.output])]
    graph = og.graph.graph_of(*outs)
    ctx = PassContext(device="cuda", policy=LoweringPolicy(layout="NHWC"))
    out = LayoutPass()(graph, outs, ctx)
    return out, outs, ctx


def _check(graph, outs):
    """(count of 4-D values, count of NCHW ones); asserts the pass's rules."""
    nodes = list(graph.nodes_in_order(outs))
    four = [v for v in nodes if v.type.ndim == 4]
    permutes = [v for v in four if type(v.op) is ops.Transpose and graph.node(graph.input_ids(v.id)[0]).type.ndim == 4]
    nchw = [v for v in four if v.type.layout == "NCHW"]
    assert all(v.type.layout in ("NCHW", "NHWC") for v in four)
    if not permutes:
        assert not nchw
    for v in permutes:
        x = graph.node(graph.input_ids(v.id)[0]).type
        assert v.type.layout == (transpose_layout(x.layout, v.op.perm) or "NHWC")
    for v in nodes:  # an op outside FOLLOWING (a convolution, a pool, ...) reads NHWC only
        if not isinstance(v.op, Source) and type(v.op) not in FOLLOWING and type(v.op) is not ops.Transpose:
            assert all(graph.node(a).type.layout == "NHWC" for a in graph.input_ids(v.id)
                       if graph.node(a).type.ndim == 4), v.name
        if isinstance(v.op, Source) and v.type.ndim == 4:
            assert v.type.layout == "NHWC"
    return len(four), len(nchw), len(permutes)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_onnx_models(path):
    pytest.importorskip("onnx")
    from opgraph.benchmarks.onnx_model import load_model
    graph, outs, ctx = _training_graph(load_model(path, batch=2, dtype="float32"))
    four, nchw, permutes = _check(graph, outs)
    note = next(n for n in ctx.report.notes if n.startswith("layout:"))
    if path.stem == "convnext_tiny":
        assert permutes == 92 and nchw > 200   # 23 layer norms between permutes, forward and backward
        assert f"{nchw} 4-D values stored NCHW" in note and f"{four - nchw} 4-D values stored NHWC" in note
    else:
        assert nchw == 0 and note.startswith(f"layout: {four} 4-D values stored NHWC,") and "NCHW" not in note


@pytest.mark.parametrize("name", sorted(models.MODELS))
def test_builtin_models_keep_nhwc(name):
    graph, outs, _ = _training_graph(models.build(name, batch=2))
    four, nchw, permutes = _check(graph, outs)
    assert permutes == 0 and nchw == 0 and four > 0


def test_a_permuted_value_read_by_a_convolution_is_pinned_to_nhwc():
    g = og.Graph()
    x, w = g.input("x", (2, 4, 6, 6)), g.param("w", (4, 4, 3, 3))
    h = og.permute(og.relu(og.conv2d(x, w, padding=1, name="c1")), (0, 2, 3, 1), name="p")  # (2, 6, 6, 4)
    y = og.conv2d(og.gelu(h, name="act"), g.param("w2", (4, 6, 1, 1)), name="c2")   # reads the permuted value
    out = LayoutPass()(g, [y], PassContext(device="cuda", policy=LoweringPolicy(layout="NHWC")))
    # the gelu the convolution reads is stored NHWC (its kernel's output converted); the permute stays a view
    assert [out[n].type.layout for n in ("c1", "p", "act", "c2")] == ["NHWC", "NCHW", "NHWC", "NHWC"]


def test_nchw_and_cpu_keep_one_layout():
    g = og.Graph()
    x = g.input("x", (2, 4, 6, 6))
    y = og.permute(og.gelu(og.permute(x, (0, 2, 3, 1))), (0, 3, 1, 2))
    for ctx in (PassContext(device="cuda", policy=LoweringPolicy(layout="NCHW")),
                PassContext(device="cpu", policy=LoweringPolicy(layout="NHWC"))):
        out = LayoutPass()(g, [y], ctx)
        assert {v.type.layout for v in out.nodes_in_order([y]) if v.type.ndim == 4} == {"NCHW"}
    out = LayoutPass()(g, [y], NHWC)
    assert [v.type.layout for v in out.nodes_in_order([y])] == ["NHWC", "NCHW", "NCHW", "NHWC"]
