"""The per-node check of a ``ThresholdBackward`` at threshold 0 that ``relu-bias-sums`` rewrote
into a ``ReluBackwardSums`` (the classifier heads of AlexNet, OverFeat and VGG-A): its value is
the abstract ``ThresholdBackward``'s, kept by the float64 reference, as a ``ReluBackward``'s is."""

from __future__ import annotations

import opgraph as og
from opgraph.benchmarks import check
from opgraph.benchmarks.models.common import ModelBuilder
from opgraph.benchmarks.protocol import random_feeds, training_graph
from opgraph.op import abstract_of


def _threshold_head():
    m = ModelBuilder("thead", "thead", "threshold head", input_chw=(3, 4, 4), batch=2, seed_batch=2)
    x = m.conv_relu(m.input, "conv1", "relu1", 4, 3, pad=1)
    return m.finish(m.classifier(x, [16, 16], classes=5))


def test_the_threshold_gradient_turned_relu_sums_has_its_abstract_twin():
    model = _threshold_head()
    tg = training_graph(model)
    ref = check.Reference(tg, random_feeds(model, seed=1), "cpu")
    exe = og.compile(tg.outputs, policy={"include": ["fused-reference"]})
    sums = [st.node for st in exe.steps if abstract_of(st.op).name == "ReluBackwardSums"]
    was = {nid: ref.graph.node(nid).op.name for nid in sums}
    assert "ThresholdBackward" in was.values(), was
    for nid in sums:
        twin = check.abstract_twin(exe.graph, ref.graph, nid)
        assert twin == nid and ref.graph.node(twin).op.name in ("ReluBackward", "ThresholdBackward")
    assert check.check_lowering(exe, ref).passed
