"""torchvision's classification convnets, exported weightless to ONNX
(``tests/onnx/models/``, README there), imported, run on the CPU and compared
with onnxruntime (or ``onnx.reference`` where onnxruntime is missing).

Each file's parameters are graph inputs without values. The test draws one
random array per ONNX graph input, feeds it to onnxruntime by that name and to
opgraph under every source name that reads it (the exporter deduplicated
equal tensors behind ``Identity`` nodes; the importer keeps one source per
name), and compares the logits by ``||ours - ref|| / ||ref||`` within
:data:`TOL`: SEMANTICS.md's bound for fp32 GEMM, the default CPU lowering.

Weights are LeCun-normal (variance ``1 / fan_in``), biases small. He-normal
weights without the folded BatchNorms make the deep SiLU networks chaotic
(EfficientNet-v2-s logits of norm 1e7 on which float32 runs of the same
graph, ours and onnxruntime's alike, differ from float64 by 60 %), which
would test the weights, not the import. Running variances are drawn positive.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import opgraph as og  # noqa: E402
import opgraph.onnx as oxi  # noqa: E402
from opgraph import ops  # noqa: E402

MODELS = Path(__file__).parent / "models"
MANIFEST = json.loads((MODELS / "manifest.json").read_text())["models"]
#: Relative error bound of the logits (SEMANTICS.md, fp32 GEMM).
TOL = 1e-4
#: Above ~4 s each on a 2-core CPU (import, compile, run, reference): marked slow.
SLOW = {"alexnet", "vgg11", "vgg11_bn", "densenet121", "inception_v3", "wide_resnet50_2", "convnext_tiny",
        "efficientnet_v2_s"}


def reference_runner():
    """``run(model, feeds) -> outputs`` of onnxruntime's CPU provider, else
    ``onnx.reference`` (much slower), with its name."""
    try:
        import onnxruntime as ort
    except ImportError:
        from onnx.reference import ReferenceEvaluator
        return "onnx.reference", lambda m, feeds: ReferenceEvaluator(m).run(None, feeds)

    def run(m, feeds):
        session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(None, feeds)
    return "onnxruntime", run


def identity_origin(m):
    """``origin(name)``: the tensor an ``Identity`` chain ending at ``name`` starts from."""
    source = {n.output[0]: n.input[0] for n in m.graph.node if n.op_type == "Identity"}

    def origin(name):
        while name in source:
            name = source[name]
        return name
    return origin


def random_graph_inputs(m, seed=0) -> dict[str, np.ndarray]:
    """One array per graph input: the image standard normal, weights LeCun-normal,
    vectors normal * 0.1, any input a BatchNormalization reads as a variance uniform(0.5, 1.5)."""
    rng = np.random.default_rng(seed)
    origin = identity_origin(m)
    variances = {origin(n.input[4]) for n in m.graph.node if n.op_type == "BatchNormalization"}
    feeds = {}
    for i, vi in enumerate(m.graph.input):
        shape = [d.dim_value or 1 for d in vi.type.tensor_type.shape.dim]  # batch 1
        if vi.name in variances:
            feeds[vi.name] = rng.uniform(0.5, 1.5, shape).astype(np.float32)
            continue
        std = 1.0 if i == 0 else math.sqrt(1.0 / math.prod(shape[1:])) if len(shape) >= 2 else 0.1
        feeds[vi.name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
    return feeds


def source_feeds(m, graph, outputs, onnx_feeds) -> dict[str, np.ndarray]:
    """opgraph's feeds: every source the outputs read gets its ONNX origin's array."""
    origin = identity_origin(m)
    scope = graph.ancestors(outputs)
    return {s.name: onnx_feeds[origin(s.name)] for s in graph.sources() if s.id in scope}


def marks(name):
    return [pytest.mark.slow] if name in SLOW else []


@pytest.mark.parametrize("name", [pytest.param(n, marks=marks(n)) for n in sorted(MANIFEST)])
def test_imports_runs_and_agrees_with_the_reference(name):
    entry = MANIFEST[name]
    m = onnx.load(MODELS / f"{name}.onnx")
    t0 = time.perf_counter()
    graph, inputs, outputs = oxi.load(m, inputs=["x"])
    assert [v.name for v in inputs] == ["x"] and inputs[0].shape == tuple(entry["input"])
    assert outputs[0].shape == (1, 1000)
    # one source per parameter: the element counts of torchvision's model with the
    # BatchNorms the exporter folds folded (torch.fx), not of the deduplicated inputs
    assert sum(s.output.type.size for s in graph.sources("param")) == entry["params"]
    assert sum(s.output.type.size for s in graph.sources("buffer")) == entry["buffers"]
    onnx_feeds = random_graph_inputs(m)
    t1 = time.perf_counter()
    (got,) = og.compile(outputs, device="cpu")(**source_feeds(m, graph, outputs, onnx_feeds))
    t2 = time.perf_counter()
    which, run = reference_runner()
    (want,) = run(m, onnx_feeds)
    t3 = time.perf_counter()
    err = float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))
    print(f"{name}: relative error {err:.2e} vs {which}; import + weights {t1 - t0:.2f} s, opgraph "
          f"{t2 - t1:.2f} s, reference {t3 - t2:.2f} s")
    assert err <= TOL, f"{name}: relative error {err:.3g} vs {which} > {TOL}"


def test_shared_parameters_become_one_source_per_name():
    """ResNet-18's folded convolution biases are all zero at export, so the exporter
    feeds them from a few graph inputs through Identity nodes; each is its own param."""
    m = onnx.load(MODELS / "resnet18.onnx")
    identities = {n.output[0]: n.input[0] for n in m.graph.node if n.op_type == "Identity"}
    graph, _, _ = oxi.load(m, inputs=["x"])
    params = {s.name for s in graph.sources("param")}
    assert set(identities) <= params
    assert len(set(identities.values())) < len(identities)  # several names, one origin


def test_densenet_running_statistics_are_buffers():
    m = onnx.load(MODELS / "densenet121.onnx")
    graph, _, outs = oxi.load(m, inputs=["x"])
    bns = [v for v in graph.nodes_in_order(outs) if isinstance(v.op, ops.BatchNorm)]
    assert len(bns) == entry_count("densenet121", "BatchNormalization")
    for bn in bns:
        roles = [s.op.role for s in bn.inputs[1:]]
        assert roles == ["param", "param", "buffer", "buffer"], bn.name


def entry_count(name: str, op_type: str) -> int:
    return MANIFEST[name]["operators"].get(op_type, 0)


@pytest.mark.parametrize("name,op,count", [
    ("convnext_tiny", ops.Gelu, entry_count("convnext_tiny", "Erf")),     # each erf subgraph: one Gelu
    ("convnext_tiny", ops.LayerNorm, entry_count("convnext_tiny", "LayerNormalization")),
    ("mobilenet_v2", ops.Hardtanh, entry_count("mobilenet_v2", "Clip")),
    ("mobilenet_v3_small", ops.Hardswish, entry_count("mobilenet_v3_small", "HardSwish")),
    ("mobilenet_v3_small", ops.Hardsigmoid, entry_count("mobilenet_v3_small", "HardSigmoid")),
    ("efficientnet_b0", ops.Sigmoid, entry_count("efficientnet_b0", "Sigmoid")),
    ("mnasnet0_5", ops.Mean, entry_count("mnasnet0_5", "ReduceMean")),
    ("shufflenet_v2_x0_5", ops.Slice, entry_count("shufflenet_v2_x0_5", "Slice")),
])
def test_operators_map_to_one_op_each(name, op, count):
    graph, _, outs = oxi.load(MODELS / f"{name}.onnx", inputs=["x"])
    assert count > 0
    assert sum(isinstance(v.op, op) for v in graph.nodes_in_order(outs)) == count


def test_shufflenet_shape_arithmetic_folds():
    """ShuffleNet's channel shuffle computes its reshape targets from Shape, Gather,
    Div, Cast, ...: all folded, none of them (nor a Constant) is left in the graph."""
    graph, _, outs = oxi.load(MODELS / "shufflenet_v2_x0_5.onnx", inputs=["x"], batch=2)
    kinds = {type(v.op).__name__ for v in graph.nodes_in_order(outs)}
    assert kinds <= {"Source", "Conv2d", "Relu", "MaxPool2d", "Concat", "Reshape", "Transpose", "Slice",
                     "Mean", "Linear"}, kinds
    shuffles = [v for v in graph.nodes_in_order(outs) if isinstance(v.op, ops.Transpose)]
    assert shuffles and all(v.op.perm == (0, 2, 1, 3, 4) and v.type.shape[0] == 2 for v in shuffles)
