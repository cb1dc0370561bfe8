"""Tiny benchmark models for the driver, report and peer tests (milliseconds on the CPU)."""

from __future__ import annotations

import opgraph as og
from opgraph.benchmarks.models import Model
from opgraph.benchmarks.models.common import ModelBuilder


def tiny_convnet(batch: int = 2) -> Model:
    """conv1 5x5 (3->4, pad 2) + relu -> max pool 2 -> conv2 3x3 (4->6, pad 1) + relu
    -> flatten -> fc (96 -> 5): a first layer Winograd declines, a second it runs."""
    m = ModelBuilder("tiny", "tiny", "tiny convnet", input_chw=(3, 8, 8), batch=batch, seed_batch=2)
    x = m.conv_relu(m.input, "conv1", "relu1", 4, 5, pad=2)
    x = m.max_pool(x, "pool1", 2, 2)
    x = m.conv_relu(x, "conv2", "relu2", 6, 3, pad=1)
    x = og.flatten(x, 1, name="flatten")
    return m.finish(m.linear(x, "fc", 5))


def every_op_model(batch: int = 2) -> Model:
    """One node of every op the PyTorch converter handles, with asymmetric
    convolution padding, padded max pooling, average pooling, LRN, threshold,
    concat and a linear layer."""
    g = og.Graph("every_op")
    x = g.input("data", (batch, 3, 9, 9))
    params = []

    def param(name, shape):
        p = g.param(name, shape)
        params.append(p)
        return p

    a = og.conv2d(x, param("c1.weight", (4, 3, 3, 3)), param("c1.bias", (4,)),
                  padding=((1, 0), (0, 1)), stride=2, name="c1")
    a = og.relu(a, name="r1")
    b = og.conv2d(a, param("c2.weight", (4, 4, 1, 1)), name="c2")
    b = og.local_response_norm(b, 3, alpha=0.1, beta=0.75, k=2.0, name="lrn")
    p1 = og.max_pool2d(a, 3, stride=1, padding=1, name="mp")
    p2 = og.avg_pool2d(a, 3, stride=1, padding=1, count_include_pad=False, name="ap")
    y = og.concat([b, p1, p2], dim=1, name="cat")
    y = og.threshold(y, 0.1, -0.5, name="th")
    y = og.flatten(y, 1, name="flat")
    y = og.linear(y, param("fc.weight", (7, y.shape[1])), param("fc.bias", (7,)), name="fc")
    return Model(key="every_op", spec_key="every_op", title="every op", graph=g, input=x, output=y,
                 params=params, first_conv_input=x, seed_batch=batch, batch=batch, dtype="float32")
