"""The NHWC plan of the layout pass survives rewrites and execution.

Two bugs this guards against, both found on the H200 (2026-11-30): fusion
and autotuning re-inferred the types of the nodes they rewrote, which reset
their layout to NCHW (so the autotuner timed most candidates in the wrong
layout), and kernels whose output cannot follow their input's layout
(concatenation, a 2-D gradient reshaped to 4-D) silently turned the rest of
the network NCHW. NHWC is a cuda-only plan, so the executor part stamps the
types by hand and runs the NumPy kernels: values must not change, storage
must be channels-last after every 4-D step.
"""

import attrs
import numpy as np

import opgraph as og
from opgraph import ops
from opgraph.backends.registry import KernelContext, rules_for
from opgraph.executable import Executable
from opgraph.op import Lowered
from opgraph.passes.base import PassContext
from opgraph.passes.layout import LayoutPass
from opgraph.passes.policy import LoweringPolicy
from opgraph.types import is_channels_last


def _inception_like():
    g = og.Graph()
    x = g.input("x", (2, 3, 8, 8))
    wa, ba = g.param("wa", (4, 3, 1, 1)), g.param("ba", (4,))
    wb, bb = g.param("wb", (2, 3, 3, 3)), g.param("bb", (2,))
    a = og.relu(og.conv2d(x, wa, ba, name="a"), name="a_relu")
    b = og.relu(og.conv2d(x, wb, bb, padding=1, name="b"), name="b_relu")
    cat = og.concat([a, b], name="cat")
    pooled = og.max_pool2d(cat, 2, name="pool")
    w = g.param("w", (5, 6 * 4 * 4))
    y = og.linear(og.flatten(pooled, name="flat"), w, name="fc")
    return g, x, y, [x, wa, ba, wb, bb, w]


def test_replace_op_and_rewiring_keep_the_layout():
    g, x, y, _ = _inception_like()
    out = LayoutPass()(g, [y], PassContext(device="cuda", policy=LoweringPolicy(layout="NHWC")))
    conv, relu = out["a"].node, out["a_relu"].node
    assert out.node(conv).type.layout == "NHWC"
    conv_op = out.node(conv).op
    fused = Lowered(ops.Conv2dBiasRelu(**conv_op.conv_params()), "direct", "cuda", {})
    out.replace_op(conv, fused)       # what fusion and autotuning do
    out.absorb(relu, conv)            # the concat now reads the fused node
    assert out.node(conv).type.layout == "NHWC"
    assert out.node(out["cat"].node).type.layout == "NHWC"
    four_d = [v for v in out.nodes_in_order([y]) if v.type.ndim == 4]
    assert four_d and all(v.type.layout == "NHWC" for v in four_d)


def test_every_4d_step_output_is_channels_last_and_values_are_unchanged():
    g, x, y, params = _inception_like()
    grads = og.grad(y, params)
    exe = og.compile([y, *grads], pipeline="reference")
    graph = exe.graph
    for n in graph.nx.nodes:
        t = graph.node(n).type
        if t.ndim == 4:
            graph.nx.nodes[n]["type"] = attrs.evolve(t, layout="NHWC")

    def resolve(op, out_type):
        return rules_for(type(op.op))[op.algorithm].kernel, KernelContext(np, "cpu", op.option_dict, out_type)

    nhwc = Executable(graph, exe.outputs, resolve, xp=np, source_graph=g)  # grad_outputs keyed by g's y
    rng = np.random.default_rng(0)
    feeds = {s.name: rng.standard_normal(s.type.shape).astype(np.float32) for s in exe.sources
             if s.op.role != "grad"}
    gy = {y: rng.standard_normal(y.type.shape).astype(np.float32)}
    slots = nhwc.feed(feeds, gy)
    for st in nhwc.steps:  # every value kept (execute frees dead ones)
        slots[st.node] = st.kernel(st.ctx, st.op.op, *[slots[a] for a in st.args])
    kinds = set()
    for st in nhwc.steps:
        if graph.node(st.node).type.ndim == 4:
            out = slots[st.node]  # NHWC storage (a 1x1 weight gradient is both layouts at once)
            assert is_channels_last(out) or out.transpose(0, 2, 3, 1).flags.c_contiguous, st.name
            kinds.add(st.op.op.name)
    # the kernels whose output used to lose the layout are among those checked
    assert {"Concat", "Slice", "Reshape"} <= kinds
    want = exe(grad_outputs=gy, **feeds)
    got = [slots[v.node] for v in nhwc.outputs]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
