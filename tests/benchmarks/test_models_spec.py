"""The benchmark models against the spec files in benchmarks/specs/.

Every layer of every model is checked for: its place in the graph (name,
order, which node it reads), its op and every op parameter, its output shape,
its parameter count and its forward FLOPs; then the model totals against the
spec's ``computed`` block and its ``expected_shapes``. The spec numbers come
from the seed's source (convnet-benchmarks), not from this code.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import opgraph as og
from opgraph.analysis import summarize, totals
from opgraph.benchmarks import models as M
from opgraph.errors import ParameterError
from opgraph.op import Source

SPECS = Path(__file__).resolve().parents[2] / "benchmarks" / "specs"
WINNER_SPECS = json.loads((SPECS / "imagenet_winners.json").read_text())["models"]
SUITE_SPECS = {L["name"]: L for L in json.loads((SPECS / "layer_suite.json").read_text())["layers"]}

BATCH = 3  # any batch works for static checks; 3 catches per-image vs per-batch mix-ups
WINNER_KEYS = {"alexnet": "alexnet", "overfeat": "overfeat_fast", "vgg_a": "vgg_a",
               "googlenet": "googlenet_v1"}
OP_OF_TYPE = {"conv2d": "Conv2d", "relu": "Relu", "maxpool2d": "MaxPool2d",
              "avgpool2d": "AvgPool2d", "view": "Flatten", "linear": "Linear",
              "threshold": "Threshold", "inception": "Concat"}


def flat_layers(spec_layers):
    """Spec layers in execution order, inception branches expanded before
    the module's own entry (its concat); each with the name of the node it
    reads (None: the image)."""
    out, prev = [], None
    for layer in spec_layers:
        if layer["type"] == "inception":
            branches = {b["name"]: b for b in layer["branches"]}
            ends = []
            for bname in layer["concat_order"]:
                src = prev
                for sub in branches[bname]["layers"]:
                    out.append((sub, [src]))
                    src = sub["name"]
                ends.append(src)
            out.append((layer, ends))
        else:
            out.append((layer, [prev]))
        prev = layer["name"]
    return out


@pytest.fixture(scope="module", params=sorted(WINNER_KEYS))
def winner(request):
    model = M.MODELS[request.param](batch=BATCH)
    spec = WINNER_SPECS[WINNER_KEYS[request.param]]
    rows = summarize(model.graph, [model.output])
    return model, spec, rows, {r.name: r for r in rows}


def test_registry_has_the_thirteen_entries_and_their_spec_keys():
    assert set(M.MODELS) == {"alexnet", "overfeat", "vgg_a", "googlenet", "L1", "L2", "L3", "L4", "L5",
                             *M.MODERN}  # the modern four: test_models_modern_spec.py
    for key, spec_key in WINNER_KEYS.items():
        assert M.resolve(spec_key) == key
        m = M.build(key, batch=1)
        assert m.spec_key == spec_key and m.key == key
        assert M.SEED_BATCHES[key] == WINNER_SPECS[spec_key]["batch_size"]
    for name, layer in SUITE_SPECS.items():
        assert M.SEED_BATCHES[name] == layer["batch"]
    with pytest.raises(KeyError, match="unknown model 'resnet'"):
        M.resolve("resnet")


def test_default_batch_is_the_seed_batch_and_batch_is_checked():
    assert M.build("vgg_a").input.shape == tuple(WINNER_SPECS["vgg_a"]["input_shape_nchw"])
    assert M.build("L3").input.shape == (128, 128, 32, 32)
    m = M.build("alexnet", batch=5, dtype="float64")
    assert m.input.shape[0] == 5 and m.output.shape == (5, 1000)
    assert {p.dtype for p in m.params} == {"float64"} and m.output.dtype == "float64"
    with pytest.raises(ParameterError, match="batch"):
        M.build("alexnet", batch=-1)


def test_layer_names_and_order_equal_the_spec(winner):
    model, spec, rows, _ = winner
    assert [r.name for r in rows] == [layer["name"] for layer, _ in flat_layers(spec["layers"])]


def test_every_layer_reads_the_node_the_spec_says(winner):
    model, spec, _, _ = winner
    g = model.graph
    for layer, sources in flat_layers(spec["layers"]):
        node = g.node(g[layer["name"]].node)
        data_inputs = [v for v in node.inputs if not isinstance(v.op, Source)
                       or v.op.role == "input"]
        want = [model.input.name if s is None else s for s in sources]
        assert [v.name for v in data_inputs] == want, layer["name"]


def test_every_layer_has_the_spec_op_and_parameters(winner):
    model, spec, _, _ = winner
    g = model.graph
    for layer, _ in flat_layers(spec["layers"]):
        node = g.node(g[layer["name"]].node)
        op, t = node.op, layer["type"]
        assert op.name == OP_OF_TYPE[t], layer["name"]
        params = {v.name.rsplit(".", 1)[1]: v.shape for v in node.inputs
                  if isinstance(v.op, Source) and v.op.role == "param"}
        if t == "conv2d":
            (kh, kw), (p0, p1) = layer["kernel"], layer["pad"]
            assert op.stride == tuple(layer["stride"])
            assert op.padding == ((p0, p0), (p1, p1))
            assert op.dilation == tuple(layer["dilation"]) and op.groups == layer["groups"]
            assert params["weight"] == (layer["out_channels"], layer["in_channels"] // layer["groups"], kh, kw)
            assert ("bias" in params) == layer["bias"]
        elif t in ("maxpool2d", "avgpool2d"):
            (p0, p1) = layer["pad"]
            assert op.kernel_size == tuple(layer["kernel"]) and op.stride == tuple(layer["stride"])
            assert op.padding == ((p0, p0), (p1, p1)) and op.ceil_mode == layer["ceil_mode"]
            assert not params
        elif t == "linear":
            assert params["weight"] == (layer["out_features"], layer["in_features"])
            assert ("bias" in params) == layer["bias"]
        elif t == "threshold":
            assert (op.threshold, op.value) == (layer["threshold"], layer["value"])
        elif t == "view":
            assert op.start_dim == 1
        elif t == "inception":
            assert op.axis == layer["concat_dim"]


def test_every_layer_shape_params_and_flops_equal_the_spec(winner):
    model, spec, _, by_name = winner
    for layer, _ in flat_layers(spec["layers"]):
        row = by_name[layer["name"]]
        assert row.shape == (BATCH, *layer["output_shape"]), layer["name"]
        if layer["type"] in ("conv2d", "linear"):
            assert row.params == layer["params"], layer["name"]
            assert row.flops == BATCH * layer["fwd_flops_per_image"], layer["name"]
            assert row.flops == 2 * BATCH * layer["fwd_macs_per_image"]
        elif layer["type"] == "inception":
            members = [r for n, r in by_name.items() if n.startswith(layer["name"] + "/")]
            assert len(members) == sum(len(b["layers"]) for b in layer["branches"])
            assert sum(r.params for r in members) == layer["params"]
            convs = [r for r in members if r.op == "Conv2d"]
            assert sum(r.flops for r in convs) == BATCH * layer["fwd_flops_per_image"]
            assert row.params == 0
        else:
            assert row.params == 0, layer["name"]


def test_totals_equal_the_spec_computed_block(winner):
    model, spec, rows, _ = winner
    c = spec["computed"]
    tot = totals(rows, model.graph, [model.output])
    assert tot.params == c["params_total"] == model.param_count
    conv = sum(r.flops for r in rows if r.op == "Conv2d")
    lin = sum(r.flops for r in rows if r.op == "Linear")
    assert conv == 2 * BATCH * c["conv_macs_per_image"]
    assert lin == 2 * BATCH * c["linear_macs_per_image"]
    assert conv + lin == BATCH * c["forward_flops_per_image"]
    assert tot.activation_bytes == 4 * BATCH * c["activation_elements_per_image_all_layer_outputs"]
    assert tot.param_bytes == 4 * c["params_total"]
    assert tot.input_bytes == 4 * BATCH * math.prod(spec["input_shape_nchw"][1:])


def test_expected_shapes_and_model_io(winner):
    model, spec, _, by_name = winner
    for name, shape in spec["expected_shapes"].items():
        assert by_name[name].shape == (BATCH, *shape), name
    assert model.input.shape[1:] == tuple(spec["input_shape_nchw"][1:])
    assert model.output.shape[1:] == tuple(spec["output_shape_nc"][1:])
    assert model.output.name == spec["layers"][-1]["name"]


def test_first_conv_reads_the_image_and_is_the_only_one_without_input_gradient(winner):
    model, spec, _, _ = winner
    layers = [layer for layer, _ in flat_layers(spec["layers"]) if layer["type"] == "conv2d"]
    assert [l["compute_grad_input"] for l in layers] == [False] + [True] * (len(layers) - 1)
    first = model.graph.node(model.graph[layers[0]["name"]].node)
    assert first.inputs[0].node == model.input.node == model.first_conv_input.node


def test_params_list_covers_every_param_source_once(winner):
    model, _, _, _ = winner
    graph_params = {s.id for s in model.graph.sources("param")}
    assert sorted(p.node for p in model.params) == sorted(graph_params)
    assert len({p.name for p in model.params}) == len(model.params)


@pytest.mark.parametrize("name", sorted(SUITE_SPECS))
def test_layer_suite_entry_equals_the_spec(name):
    spec = SUITE_SPECS[name]
    model = M.build(name)  # the seed batch: the spec's GFLOP are per batch of 128
    rows = summarize(model.graph, [model.output])
    assert [r.name for r in rows] == [name]
    (row,), op = rows, model.output.op
    b, c, h, o, k, hw = (spec[f] for f in ("batch", "in_channels", "height", "out_channels",
                                           "kernel", "output_hw"))
    assert model.input.shape == (b, c, h, spec["width"])
    assert row.shape == (b, o, hw, hw)
    assert op.stride == (spec["stride"],) * 2 and op.padding == ((spec["pad"],) * 2,) * 2
    assert row.params == spec["params"] == o * c * k * k + o
    assert row.flops == 2 * b * o * hw * hw * c * k * k
    assert round(row.flops / 1e9, 1) == spec["fwd_gflop_per_batch"]


@pytest.mark.slow
def test_alexnet_runs_forward_on_the_reference_lowering():
    from opgraph.benchmarks.driver import random_feeds

    model = M.build("alexnet", batch=1)
    (y,) = og.compile([model.output], device="cpu")(**random_feeds(model, seed=1))
    assert y.shape == (1, 1000) and y.dtype == np.float32
    assert np.isfinite(y).all() and np.abs(y).max() > 0
