"""Every modern-convnet op through ``og.compile``'s default CPU pipeline (legalize,
lower, layout, fuse, memory) in float32, against the float64 oracle pipeline, with
its gradient and second derivative; and the policy aliases of the new families."""

import numpy as np
import pytest

import opgraph as og
from opgraph import ops
from opgraph.passes.policy import ALIASES, LoweringPolicy


def _every_op_graph():
    """One node of every new forward op (their backward ops come from grad)."""
    g = og.Graph()
    x = g.input("x", (2, 4, 6, 6))
    w, b = g.param("w", (4,)), g.param("b", (4,))
    rm, rv = g.buffer("rm", (4,), value=0.0), g.buffer("rv", (4,), value=1.0)
    h, new_mean, new_var = og.batch_norm(x, rm, rv, w, b, training=True, return_running_stats=True)
    a, c = og.split(h, [1, 3])
    a = og.hardswish(og.relu6(a))
    c = og.silu(og.hardsigmoid(og.hardtanh(c, -2.0, 2.0), alpha=0.2))
    h = og.concat([og.gelu(a, "tanh"), og.gelu(c)], 1)
    s = og.sigmoid(og.mean(og.adaptive_avg_pool2d(h, 3), (2, 3), keepdim=True))
    h = og.div(og.mul(h, s), og.add(s, s))
    h = og.transpose(og.reshape(h, (2, 2, 2, 6, 6)), 1, 2)
    h = og.layer_norm(og.permute(og.reshape(h, (2, 4, 6, 6)), (0, 2, 3, 1)), 4, w, b)
    y = og.neg(h)
    return g, x, w, b, y, [new_mean, new_var]


def _feeds(rng):
    return {"x": rng.standard_normal((2, 4, 6, 6)), "w": 1 + 0.1 * rng.standard_normal(4),
            "b": 0.1 * rng.standard_normal(4)}


def _rel(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / max(np.linalg.norm(b), 1e-300))


def test_every_new_op_compiles_on_the_default_pipeline_and_matches_the_oracle():
    g, x, w, b, y, stats = _every_op_graph()
    first = og.grad(y, [x, w, b])
    second = og.grad(og.mean(og.mul(first[0], first[0])), [x, w])  # through the backward ops
    outs = [y, *stats, *first, *second]
    used = {type(v.op) for v in g.nodes_in_order(outs)}
    new_ops = {getattr(ops, n) for n in ALIASES["activation"] + ALIASES["norm"] + ALIASES["reduce"]}
    missing = new_ops - used - {ops.BatchNorm, ops.BatchNormBackwardData, ops.BatchNormBackwardScale}
    missing = {t for t in missing if not t.fused}  # the fuse pass makes those (tests/passes/test_fuse_*.py)
    assert not missing, f"not exercised: {sorted(m.__name__ for m in missing)}"
    assert {ops.Div, ops.Neg} <= used
    rng = np.random.default_rng(0)
    feeds = _feeds(rng)
    gy = {y: rng.standard_normal(y.shape)}
    ref = og.compile(outs, pipeline="reference", dtype="float64")(grad_outputs=gy, **feeds)
    fast = og.compile(outs)(grad_outputs=gy, **{k: v.astype(np.float32) for k, v in feeds.items()})
    for i, (o, r) in enumerate(zip(fast, ref)):
        assert o.dtype == np.float32 and _rel(o, r) < 1e-4, (i, _rel(o, r))
    f64 = og.compile(outs, dtype="float64")(grad_outputs=gy, **feeds)
    for o, r in zip(f64, ref):
        assert o.dtype == np.float64 and _rel(o, r) < 1e-12


@pytest.mark.parametrize("alias", ["activation", "norm", "reduce"])
def test_family_aliases_name_every_op_of_their_family(alias):
    family = {n for n in ops.__all__ if getattr(getattr(ops, n), "family", None) == alias}
    assert family and family <= set(ALIASES[alias])
    assert set(ALIASES[alias]) <= set(ops.__all__)
    LoweringPolicy(prefer={alias: ["reference"]})  # a valid policy key
