"""opgraph.analysis on a small graph whose figures are worked out by hand
from the definitions (conv FLOPs = 2 * N * O * Ho * Wo * C/G * kH * kW)."""

from __future__ import annotations

import opgraph as og
from opgraph.analysis import node_flops, node_params, peak_live_bytes, summarize, totals


def small(dtype="float32"):
    g = og.Graph("small")
    x = g.input("x", (2, 3, 8, 8), dtype)
    w = g.param("w", (4, 3, 3, 3), dtype)
    b = g.param("b", (4,), dtype)
    y = og.conv2d(x, w, b, name="conv")          # (2, 4, 6, 6)
    r = og.relu(y, name="relu")
    p = og.max_pool2d(r, 2, name="pool")         # (2, 4, 3, 3)
    return g, x, w, b, p


def test_rows_by_hand():
    g, x, w, b, out = small()
    rows = summarize(g, [out])
    assert [(r.name, r.op) for r in rows] == [("conv", "Conv2d"), ("relu", "Relu"), ("pool", "MaxPool2d")]
    conv, relu, pool = rows
    assert conv.shape == (2, 4, 6, 6) and pool.shape == (2, 4, 3, 3)
    assert conv.params == 4 * 3 * 3 * 3 + 4 and conv.param_bytes == 4 * 112
    assert conv.flops == 2 * 2 * 4 * 6 * 6 * 3 * 3 * 3
    assert conv.out_bytes == 2 * 4 * 6 * 6 * 4 and pool.out_bytes == 2 * 4 * 3 * 3 * 4
    assert relu.params == pool.params == 0
    node = g.node(g["conv"].node)
    assert node_params(node) == 112 and node_flops(node) == conv.flops
    assert node_params(g.node(x.node)) == 0


def test_totals_and_live_peak_by_hand():
    g, x, w, b, out = small("float64")
    rows = summarize(g, [out])
    t = totals(rows, g, [out])
    conv_b, pool_b = 2 * 4 * 6 * 6 * 8, 2 * 4 * 3 * 3 * 8
    assert t.layers == 3 and t.params == 112 and t.param_bytes == 8 * 112
    assert t.activation_bytes == 2 * conv_b + pool_b
    assert t.input_bytes == 2 * 3 * 8 * 8 * 8
    # conv and relu outputs live together; conv is freed before pool runs
    assert t.peak_bytes == peak_live_bytes(g, [out]) == 2 * conv_b
    # keeping the relu output as a second result keeps it alive to the end
    assert peak_live_bytes(g, [out, g["relu"]]) == 2 * conv_b


def test_shared_parameter_counts_once_in_totals():
    g = og.Graph()
    x = g.input("x", (1, 3, 5, 5))
    w = g.param("w", (3, 3, 1, 1))
    y = og.conv2d(og.conv2d(x, w, name="a"), w, name="b")
    rows = summarize(g, [y])
    assert [r.params for r in rows] == [9, 9]
    assert totals(rows, g, [y]).params == 9
    assert totals(rows).params == 18  # without the graph, rows are simply summed


def test_sources_listed_on_request():
    g, x, w, b, out = small()
    rows = summarize(g, [out], include_sources=True)
    assert [(r.name, r.role) for r in rows if r.role] == [("x", "input"), ("w", "param"), ("b", "param")]
    assert totals(rows).activation_bytes == totals(summarize(g, [out])).activation_bytes
    assert totals(rows).layers == 3


def test_lowered_graph_reports_the_abstract_op_and_the_algorithm():
    g, x, w, b, out = small()
    run = og.compile([out], device="cpu", policy=og.LoweringPolicy(exclude=["fused"]))
    rows = summarize(run.graph, run.outputs)
    abstract = summarize(g, [out])
    assert [(r.name, r.op, r.flops, r.params) for r in rows] == \
        [(r.name, r.op, r.flops, r.params) for r in abstract]
    assert all(r.algorithm for r in rows) and all(r.algorithm is None for r in abstract)
    # fused (the default): the conv row becomes Conv2dBiasRelu with the same
    # FLOPs and parameters, and the ReLU row is gone
    fused = {r.name: r for r in summarize(*(lambda e: (e.graph, e.outputs))(og.compile([out])))}
    conv = next(r for r in abstract if r.op == "Conv2d")
    assert (fused[conv.name].op, fused[conv.name].flops, fused[conv.name].params) == \
        ("Conv2dBiasRelu", conv.flops, conv.params)
    assert not any(r.op == "Relu" for r in fused.values())
