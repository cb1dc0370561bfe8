"""Small models that together use every op the PyTorch peer converts (the
converter tests compare each with the float64 reference; a test fails when
some converter is used by none of them).

Each case is ``build() -> (Model, extra outputs)``: the model's output is
differentiated (its own value as the output gradient, parameters and, where
``Model.input`` is floating, the image), the extra outputs are compared as
values only (running statistics, integer results).
"""

from __future__ import annotations

import numpy as np

import opgraph as og
from opgraph import ops
from opgraph.benchmarks.models import Model
from opgraph.types import TensorType


class Net:
    """A graph being built: one image input and named parameters."""

    def __init__(self, name: str, shape=(2, 4, 6, 6), dtype: str = "float32"):
        self.g = og.Graph(name)
        self.x = self.g.input("x", shape, dtype)
        self.params: list = []

    def param(self, name: str, shape):
        p = self.g.param(name, shape)
        self.params.append(p)
        return p

    def model(self, y, extras=()) -> tuple[Model, list]:
        return (Model(key=self.g.name, spec_key=self.g.name, title=self.g.name, graph=self.g, input=self.x,
                      output=y, params=list(self.params), first_conv_input=self.x, seed_batch=2,
                      batch=self.x.shape[0], dtype="float32"), list(extras))


def conv_pool():
    n = Net("conv_pool", (2, 4, 9, 9))
    w, b = n.param("w", (6, 2, 3, 3)), n.param("b", (6,))
    y = og.conv2d(n.x, w, b, stride=2, padding=((1, 0), (0, 1)), groups=2)  # asymmetric, grouped
    fused = n.g.apply(ops.Conv2dBiasRelu, dict(padding=1), [y, n.param("w2", (6, 6, 3, 3)),
                                                         n.param("b2", (6,))])
    a = og.max_pool2d(fused, 3, stride=2, padding=1, ceil_mode=True)
    c = og.max_pool2d(fused, 2, stride=2, padding=((1, 0), (0, 1)), ceil_mode=True)  # asymmetric
    d = og.avg_pool2d(fused, 3, stride=2, padding=1, count_include_pad=False)
    return n.model(og.concat([og.flatten(v, 1) for v in (a, c, d)], dim=1))


def avg_pools():
    n = Net("avg_pools", (2, 3, 7, 8))
    y = og.mul(n.x, n.param("s", (1, 3, 1, 1)))
    a = og.avg_pool2d(y, 3, stride=2, padding=((1, 0), (1, 1)), ceil_mode=True)
    b = og.avg_pool2d(y, 3, stride=2, padding=((1, 0), (1, 1)), ceil_mode=True, count_include_pad=False)
    c = og.avg_pool2d(y, 2, stride=2, padding=((0, 1), (1, 0)))
    g = og.adaptive_avg_pool2d(y, 1)
    flat = [og.flatten(v, 1) for v in (a, b, c, g)]
    return n.model(og.concat(flat, dim=1))


def activations():
    n = Net("activations", (2, 5, 3, 3))
    x = og.mul(n.x, n.param("scale", (1, 5, 1, 1)))
    parts = [og.relu(x), og.threshold(x, 0.1, -0.5), og.relu6(og.mul(x, n.param("k", (1, 5, 1, 1)))),
             og.hardtanh(x, -0.5, 0.7), og.hardsigmoid(x), og.hardsigmoid(x, alpha=0.2, beta=0.4),
             og.hardswish(x), og.sigmoid(x), og.silu(x), og.gelu(x), og.gelu(x, "tanh")]
    y = parts[0]
    for p in parts[1:]:
        y = og.add(y, p)
    return n.model(y)


def norms():
    n = Net("norms", (3, 4, 5, 5))
    g = n.g
    mean = g.buffer("bn.running_mean", (4,), value=0.2)
    var = g.buffer("bn.running_var", (4,), value=1.5)
    # both running statistics fetched: F.batch_norm updates them in place
    y, new_mean, new_var = og.batch_norm(n.x, mean, var, n.param("bn.weight", (4,)), n.param("bn.bias", (4,)),
                                         training=True, momentum=0.3, eps=1e-3, return_running_stats=True,
                                         name="bn")
    # only the mean fetched: the update's own formula
    m2, v2 = g.buffer("bn2.running_mean", (4,), value=-0.5), g.buffer("bn2.running_var", (4,), value=3.0)
    z, new_m2, _ = og.batch_norm(og.relu(y), m2, v2, n.param("bn2.weight", (4,)), training=True,
                                 return_running_stats=True, name="bn2")
    z = og.batch_norm(z, None, None, training=True, name="bn2b")  # no affine, no running statistics
    inf_mean, inf_var = g.buffer("bn3.mean", (4,), value=0.1), g.buffer("bn3.var", (4,), value=2.0)
    z = og.batch_norm(z, inf_mean, inf_var, n.param("bn3.weight", (4,)), n.param("bn3.bias", (4,)), eps=1e-4)
    t = og.permute(z, (0, 2, 3, 1))
    ln = og.layer_norm(t, 4, n.param("ln.weight", (4,)), n.param("ln.bias", (4,)))
    ln2 = og.layer_norm(t, (5, 4))
    return n.model(og.add(ln, ln2), [new_mean, new_var, new_m2])


def arithmetic():
    n = Net("arithmetic", (2, 3, 4, 4))
    g = n.g
    s = og.mean(n.x, (2, 3), keepdim=True)  # squeeze-and-excitation style scale
    y = og.mul(n.x, og.sigmoid(og.mul(s, n.param("se", (1, 3, 1, 1)))))
    two = g.apply(ops.Constant, {"value": np.full((1, 3, 1, 1), 2.0, np.float32)}, [])
    y = og.div(y, og.add(og.mul(n.param("den", (1, 3, 1, 1)), n.param("den2", (1, 3, 1, 1))), two))
    y = og.neg(og.bias_add(y, n.param("bias", (3,))))
    y = g.apply(ops.BroadcastAdd, {}, [y, n.param("row", (4,))])
    y = og.add(y, g.apply(ops.BroadcastTo, {"shape": (2, 3, 4, 4)}, [n.param("col", (3, 1, 1))]))
    y = og.add(y, g.apply(ops.Zeros, {"type": TensorType((2, 3, 4, 4), "float32")}, []))
    pieces = [g.apply(ops.SumTo, {"shape": (3, 1, 4)}, [y]), og.mean(y, (1,)),
              g.apply(ops.Mean, {"axes": ()}, [y]), og.mean(y), *og.split(y, [1, 2, 1], dim=2),
              og.pad(og.narrow(y, 1, 1, 2), ((1, 0), (0, 2)), value=0.5)]
    flat = og.concat([og.reshape(v, (1, v.type.size)) for v in pieces], dim=1)
    ints = og.div(g.apply(ops.Constant, {"value": np.array([7, -7, 9])}, []),
                  g.apply(ops.Constant, {"value": np.array([2, 2, -4])}, []), rounding_mode="trunc")
    return n.model(flat, [ints])


def heads():
    n = Net("heads", (4, 3, 2, 2))
    x = og.flatten(og.dropout(n.x, 0.3, training=True, seed=5), 1)
    x = og.dropout(x, 0.5, training=False)
    y = og.linear(x, n.param("fc.weight", (6, 12)), n.param("fc.bias", (6,)))
    y = og.matmul(y, n.param("m", (6, 5)))
    y = og.matmul(n.param("m2", (5, 4)), y, transpose_a=True, transpose_b=True)  # (4, 4)
    logits = og.reshape(og.transpose(og.reshape(y, (2, 2, 4)), 0, 2), (4, 4))
    loss = og.cross_entropy(logits, n.g.input("target", (4,), "int64"))
    soft = og.add(og.softmax(logits, 1), og.log_softmax(logits, 0))
    return n.model(n.g.apply(ops.BroadcastAdd, {}, [soft, og.reshape(loss, (1, 1))]))


def lrn():
    n = Net("lrn", (2, 6, 3, 3))
    a = og.local_response_norm(og.relu(og.mul(n.x, n.param("s", (1, 6, 1, 1)))), 4, alpha=0.1, beta=0.75, k=2.0)
    return n.model(og.local_response_norm(a, 3))


CASES = {f.__name__: f for f in (conv_pool, avg_pools, activations, norms, arithmetic, heads, lrn)}


def feeds_of(model: Model, seed: int = 0) -> dict:
    """Standard normal floats (including biases, so that no term vanishes), the
    graph's declared buffer values, and class indices for int64 inputs."""
    rng = np.random.default_rng(seed)
    g = model.graph
    feeds = {}
    for src in g.sources():
        if src.op.role == "buffer" or src.op.role == "grad":
            continue
        t = src.type
        if t.dtype == "int64":
            feeds[src.name] = rng.integers(0, 4, t.shape).astype(np.int64)
        else:
            feeds[src.name] = rng.standard_normal(t.shape).astype(np.float32)
    return feeds


__all__ = ["CASES", "feeds_of", "Net"]
