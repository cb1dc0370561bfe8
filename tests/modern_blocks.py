"""Small graphs of the modern-convnet ops for tests: a ResNet bottleneck and an
MBConv block, each a training step's forward with training batch norm. Each
builder returns ``(output, params, extra_outputs)``: the running statistics
are the extra outputs, the parameters are what the protocol differentiates."""

from __future__ import annotations

import opgraph as og
from opgraph import ops


def training_bn(g, h, c: int, name: str, outs: list, params: list):
    """A training batch norm of ``h`` (``c`` channels) with running statistics:
    its statistics join ``outs``, its weight and bias ``params``."""
    gamma, beta = g.param(f"{name}.gamma", (c,)), g.param(f"{name}.beta", (c,))
    rm, rv = g.buffer(f"{name}.rm", (c,), value=0.0), g.buffer(f"{name}.rv", (c,), value=1.0)
    h, m, v = og.batch_norm(h, rm, rv, gamma, beta, training=True, return_running_stats=True, name=name)
    outs.extend([m, v])
    params.extend([gamma, beta])
    return h


def bottleneck():
    """A ResNet-50 bottleneck (1x1, 3x3 stride 2, 1x1, projection shortcut),
    training batch norm with running statistics, and a classifier head."""
    g = og.Graph("bottleneck")
    x = g.input("x", (2, 64, 16, 16))
    outs, params = [], []

    def conv_bn(h, cin, cout, k, stride, name, act=True):
        w = g.param(f"{name}.w", (cout, cin, k, k))
        gamma, beta = g.param(f"{name}.gamma", (cout,)), g.param(f"{name}.beta", (cout,))
        rm, rv = g.buffer(f"{name}.rm", (cout,), value=0.0), g.buffer(f"{name}.rv", (cout,), value=1.0)
        h, m, v = og.batch_norm(og.conv2d(h, w, stride=stride, padding=k // 2), rm, rv, gamma, beta,
                                training=True, return_running_stats=True, name=name)
        outs.extend([m, v])
        params.extend([w, gamma, beta])
        return og.relu(h) if act else h

    h = conv_bn(x, 64, 32, 1, 1, "a")
    h = conv_bn(h, 32, 32, 3, 2, "b")
    h = conv_bn(h, 32, 128, 1, 1, "c", act=False)
    h = og.relu(og.add(h, conv_bn(x, 64, 128, 1, 2, "proj", act=False)))
    fc = g.param("fc.w", (10, 128))
    y = og.linear(og.flatten(og.adaptive_avg_pool2d(h, 1)), fc, g.param("fc.b", (10,)))
    return y, params + [fc], outs


def mbconv():
    """An EfficientNet MBConv block (expand, depthwise, squeeze-and-excitation,
    project, residual) and a MobileNet-v2 style head (ReLU6, hardswish, mean,
    dropout in training)."""
    g = og.Graph("mbconv")
    x = g.input("x", (2, 24, 12, 12))
    outs, params = [], []

    def bn(h, c, name):
        return training_bn(g, h, c, name, outs, params)

    def conv(h, cin, cout, k, name, groups=1):
        w = g.param(f"{name}.w", (cout, cin // groups, k, k))
        params.append(w)
        return og.conv2d(h, w, padding=k // 2, groups=groups)

    h = og.silu(bn(conv(x, 24, 96, 1, "expand"), 96, "bn0"))
    h = og.silu(bn(conv(h, 96, 96, 3, "dw", groups=96), 96, "bn1"))
    s = og.mean(h, (2, 3), keepdim=True)
    s = og.sigmoid(conv(og.silu(conv(s, 96, 8, 1, "se1")), 8, 96, 1, "se2"))
    h = bn(conv(og.mul(h, s), 96, 24, 1, "project"), 24, "bn2")
    h = og.add(h, x)
    h = og.hardswish(og.relu6(bn(conv(h, 24, 48, 1, "head"), 48, "bn3")))
    pooled = og.reshape(og.mean(h, (2, 3)), (2, 48))
    fc = g.param("fc.w", (10, 48))
    params.append(fc)
    y = og.linear(og.dropout(pooled, 0.2, training=True, seed=3), fc)
    return y, params, outs


def dense_block():
    """A DenseNet-121 dense block of three layers (BN-ReLU-conv1x1-BN-ReLU-conv3x3,
    growth 8, each layer reading the concatenation of every earlier feature)
    and a BN-ReLU-pool-linear head: the zero-copy plan makes each layer's
    batch norm read a channel slice of the block's buffer, and the gradient
    of every feature a sum of slices of the concats' gradients."""
    g = og.Graph("dense_block")
    x = g.input("x", (2, 16, 8, 8))
    outs, params = [], []

    def bn_relu(h, c, name):
        return og.relu(training_bn(g, h, c, name, outs, params))

    def conv(h, cin, cout, k, name):
        w = g.param(f"{name}.w", (cout, cin, k, k))
        params.append(w)
        return og.conv2d(h, w, padding=k // 2)

    features = [x]
    for i in range(3):
        cin = 16 + 8 * i
        h = og.concat(features, dim=1) if len(features) > 1 else x
        h = conv(bn_relu(h, cin, f"l{i}.bn1"), cin, 16, 1, f"l{i}.conv1")
        features.append(conv(bn_relu(h, 16, f"l{i}.bn2"), 16, 8, 3, f"l{i}.conv2"))
    h = bn_relu(og.concat(features, dim=1), 40, "final")
    fc = g.param("fc.w", (10, 40))
    params.append(fc)
    y = og.linear(og.flatten(og.adaptive_avg_pool2d(h, 1)), fc)
    return y, params, outs


def convnext_block(mixer: str = "dwconv", shape=(2, 8, 5, 6)):
    """A ConvNeXt block, y = h + gamma * permute(fc2(gelu(fc1(LN(permute(h)))))), the Linear
    layers as reshape -> MatMul -> reshape -> bias (as the ONNX import writes them). ``mixer``:
    h is a depthwise 3x3 convolution of x (``'dwconv'``, as in ConvNeXt) or a per-channel
    scale of x (``'scale'``: its gradient needs the layer norm's input gradient, with no
    convolution in the step)."""
    c = shape[1]
    g = og.Graph("cnblock")
    x = g.input("x", shape)
    spec = [("ln.w", (c,)), ("ln.b", (c,)), ("fc1.w", (c, 2 * c)), ("fc1.b", (2 * c,)), ("fc2.w", (2 * c, c)),
            ("fc2.b", (c,)), ("gamma", (c, 1, 1))]
    spec += [("dw.w", (c, 1, 3, 3)), ("dw.b", (c,))] if mixer == "dwconv" else [("s", (c, 1, 1))]
    p = {name: g.param(name, shape) for name, shape in spec}

    def linear(h, w, b, cout):
        flat = og.reshape(h, (-1, h.type.shape[-1]))
        y = og.reshape(og.matmul(flat, w), (*h.type.shape[:-1], cout))
        return g.apply(ops.BroadcastAdd, {}, [y, b])

    if mixer == "dwconv":
        h = og.conv2d(x, p["dw.w"], p["dw.b"], padding=1, groups=c, name="dw")
        residual = x
    else:
        h = residual = og.mul(p["s"], x)
    h = og.layer_norm(og.permute(h, (0, 2, 3, 1)), c, p["ln.w"], p["ln.b"], eps=1e-6)
    h = linear(og.gelu(linear(h, p["fc1.w"], p["fc1.b"], 2 * c)), p["fc2.w"], p["fc2.b"], c)
    y = og.add(residual, og.mul(p["gamma"], og.permute(h, (0, 3, 1, 2))))
    return y, list(p.values()), []


__all__ = ["training_bn", "bottleneck", "mbconv", "dense_block", "convnext_block"]
