"""Whole networks of the classic topologies, written with ``onnx.helper``,
imported, run under every lowering the pass layer offers and compared with
``onnx.reference.ReferenceEvaluator`` within the SEMANTICS.md tolerances;
their gradients are checked by directional finite differences in float64.

* AlexNet-like: grouped convolutions, LRN (odd and even sizes), max pooling,
  Gemm + Relu + Dropout head, Softmax;
* Inception-style: a four-branch block (1x1, 1x1 -> 3x3, 1x1 -> 5x5,
  3x3 max pool -> 1x1) joined by Concat, ceil-mode pooling around it;
* ResNet-style: conv + BatchNormalization + Relu, a strided block with a
  projection shortcut and an identity block (residual Add), global average
  pooling, Gemm.
"""

import numpy as np
import pytest

pytest.importorskip("onnx.reference")

from onnx import helper  # noqa: E402

from onnxcheck import compare, lowerings, model  # noqa: E402

import opgraph as og  # noqa: E402
import opgraph.onnx as oxi  # noqa: E402


class Net:
    """Appends ONNX nodes and He-normal initializers (He et al. 2015) with fresh names."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.count = [], {}, 0

    def _name(self, stem):
        self.count += 1
        return f"{stem}{self.count}"

    def weight(self, shape, fan_in=None):
        fan_in = fan_in or int(np.prod(shape[1:]))
        name = self._name("w")
        self.inits[name] = (self.rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        return name

    def vector(self, n, lo=-0.1, hi=0.1):
        name = self._name("v")
        self.inits[name] = self.rng.uniform(lo, hi, n).astype(np.float32)
        return name

    def node(self, op_type, inputs, **attrs):
        out = self._name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def conv(self, x, cin, cout, k, bias=True, group=1, **attrs):
        ins = [x, self.weight((cout, cin // group, k, k))] + ([self.vector(cout)] if bias else [])
        return self.node("Conv", ins, group=group, **attrs)

    def bn(self, x, c):
        return self.node("BatchNormalization", [x, self.vector(c, 0.5, 1.5), self.vector(c),
                                                self.vector(c), self.vector(c, 0.5, 2.0)], epsilon=1e-3)

    def gemm(self, x, fin, fout):
        return self.node("Gemm", [x, self.weight((fout, fin)), self.vector(fout)], transB=1)

    def relu(self, x):
        return self.node("Relu", [x])


def alexnet_like():
    n = Net(1)
    y = n.relu(n.conv("x", 3, 8, 5, strides=[2, 2], pads=[1, 1, 1, 1]))          # 8 x 19 x 19
    y = n.node("LRN", [y], size=5, alpha=0.1, beta=0.75, bias=2.0)
    y = n.node("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2])             # 8 x 9 x 9
    y = n.relu(n.conv(y, 8, 12, 5, group=2, pads=[2, 2, 2, 2]))
    y = n.node("LRN", [y], size=4, alpha=0.1, beta=0.75, bias=2.0)
    y = n.node("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2])             # 12 x 4 x 4
    y = n.relu(n.conv(y, 12, 16, 3, pads=[1, 1, 1, 1]))
    y = n.relu(n.conv(y, 16, 16, 3, group=2, pads=[1, 1, 1, 1]))
    y = n.relu(n.conv(y, 16, 12, 3, group=2, auto_pad="SAME_UPPER"))
    y = n.node("MaxPool", [y], kernel_shape=[2, 2], strides=[2, 2])             # 12 x 2 x 2
    y = n.node("Flatten", [y], axis=1)
    y = n.node("Dropout", [n.relu(n.gemm(y, 48, 20))])
    y = n.node("Softmax", [n.gemm(y, 20, 10)], axis=1)
    return n, (2, 3, 39, 39), y


def inception_like():
    n = Net(2)
    y = n.relu(n.conv("x", 3, 8, 3, pads=[1, 1, 1, 1]))                          # 8 x 10 x 10
    y = n.node("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)  # 8 x 5 x 5 (floor: 4)
    b1 = n.relu(n.conv(y, 8, 4, 1))
    b2 = n.relu(n.conv(n.relu(n.conv(y, 8, 4, 1)), 4, 6, 3, pads=[1, 1, 1, 1]))
    b3 = n.relu(n.conv(n.relu(n.conv(y, 8, 2, 1)), 2, 3, 5, pads=[2, 2, 2, 2]))
    b4 = n.relu(n.conv(n.node("MaxPool", [y], kernel_shape=[3, 3], pads=[1, 1, 1, 1]), 8, 3, 1))
    y = n.node("Concat", [b1, b2, b3, b4], axis=1)                                # 16 x 5 x 5
    y = n.node("AveragePool", [y], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
               ceil_mode=1, count_include_pad=0)                                  # 16 x 3 x 3
    y = n.node("MaxPool", [y], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)  # 16 x 2 x 2
    y = n.node("Flatten", [y])
    return n, (2, 3, 10, 10), n.gemm(y, 64, 10)


def resnet_like():
    n = Net(3)
    y = n.relu(n.bn(n.conv("x", 4, 8, 3, bias=False, pads=[1, 1, 1, 1]), 8))      # 8 x 8 x 8
    # strided block with a projection shortcut
    a = n.relu(n.bn(n.conv(y, 8, 16, 3, bias=False, strides=[2, 2], pads=[1, 1, 1, 1]), 16))
    a = n.bn(n.conv(a, 16, 16, 3, bias=False, pads=[1, 1, 1, 1]), 16)
    s = n.bn(n.conv(y, 8, 16, 1, bias=False, strides=[2, 2]), 16)
    y = n.relu(n.node("Add", [a, s]))                                             # 16 x 4 x 4
    # identity block
    a = n.relu(n.bn(n.conv(y, 16, 16, 3, bias=False, pads=[1, 1, 1, 1]), 16))
    a = n.bn(n.conv(a, 16, 16, 3, bias=False, pads=[1, 1, 1, 1]), 16)
    y = n.relu(n.node("Add", [a, y]))
    y = n.node("Flatten", [n.node("GlobalAveragePool", [y])])
    return n, (2, 4, 8, 8), n.gemm(y, 16, 10)


NETWORKS = {"alexnet": alexnet_like, "inception": inception_like, "resnet": resnet_like}


def build(name):
    net, shape, out = NETWORKS[name]()
    x = np.random.default_rng(10).standard_normal(shape).astype(np.float32)
    return model(net.nodes, {"x": x}, [out], net.inits, opset=17), x


@pytest.mark.parametrize("name", NETWORKS)
def test_network_matches_the_onnx_reference_under_every_lowering(name):
    m, x = build(name)
    want = compare(m, {"x": x}, all_lowerings=True)
    assert np.abs(want[0]).max() > 1e-3  # a non-degenerate output


def test_every_lowering_is_exercised():
    """The check above covers each convolution algorithm once the pass layer offers it."""
    names = [n for n, _ in lowerings()]
    try:
        import opgraph.passes.policy  # noqa: F401
    except ImportError:
        assert names == ["default"]
    else:
        assert names == ["default", "direct", "gemm", "fft", "winograd"]


@pytest.mark.parametrize("name", NETWORKS)
def test_network_gradients_by_directional_finite_differences(name):
    """``f = sum(out * R)``; for the input and each parameter p, along a random
    direction v: ``<grad_p f, v>`` against ``(f(p + h v) - f(p - h v)) / 2h``
    with h = 1e-6 in float64 (central-difference error ~ h^2, far below 1e-6)."""
    m, x = build(name)
    g, (xv,), (out,) = oxi.load(m)
    params = g.sources("param")
    wrt = [xv] + [p.output for p in params]
    grads = og.grad(out, wrt)
    rng = np.random.default_rng(5)
    feeds = {"x": x.astype(np.float64)}
    feeds.update({p.name: np.asarray(g.param_values[p.name], np.float64) for p in params})
    r = rng.standard_normal(out.shape)
    backward = og.compile(grads, dtype="float64")
    needed = {s.name for s in backward.sources}
    analytic = backward(grad_outputs={out: r}, **{k: a for k, a in feeds.items() if k in needed})
    forward = og.compile([out], dtype="float64")

    def f(fd):
        return float(np.sum(forward(**fd)[0] * r))

    h = 1e-6
    for v, ga in zip(wrt, analytic):
        d = rng.standard_normal(v.shape)
        up = dict(feeds, **{v.name: feeds[v.name] + h * d})
        down = dict(feeds, **{v.name: feeds[v.name] - h * d})
        numeric = (f(up) - f(down)) / (2 * h)
        exact = float(np.sum(np.asarray(ga) * d))
        assert abs(exact - numeric) <= 1e-6 * max(1.0, abs(numeric)), (v.name, exact, numeric)
