"""``random_feeds`` / ``buffer_feeds``: buffers start as ``torch.nn.BatchNorm2d``'s
running statistics (mean zeros, variance ones) unless they declare a value, and
only buffers the model output reads are fed."""

import numpy as np

import opgraph as og
from opgraph.benchmarks.models import Model
from opgraph.benchmarks.protocol import buffer_feeds, random_feeds


def _model():
    g = og.Graph("bn_net")
    x = g.input("data", (2, 3, 4, 4))
    w, gamma, beta = g.param("conv.weight", (3, 3, 1, 1)), g.param("bn.weight", (3,)), g.param("bn.bias", (3,))
    rm, rv = g.buffer("bn.running_mean", (3,)), g.buffer("bn.running_var", (3,))
    declared = g.buffer("bn2.running_var", (3,), value=2.0)
    g.buffer("unused", (3,))
    h = og.batch_norm(og.conv2d(x, w), rm, rv, gamma, beta, name="bn")
    y = og.batch_norm(h, g.buffer("bn2.running_mean", (3,)), declared, name="bn2")
    return Model(key="bn_net", spec_key="bn_net", title="bn net", graph=g, input=x, output=y,
                 params=[w, gamma, beta], first_conv_input=x, seed_batch=2, batch=2, dtype="float32")


def test_buffers_start_as_torch_running_statistics():
    model = _model()
    feeds = random_feeds(model, seed=0)
    np.testing.assert_array_equal(feeds["bn.running_mean"], np.zeros(3, np.float32))
    np.testing.assert_array_equal(feeds["bn.running_var"], np.ones(3, np.float32))
    np.testing.assert_array_equal(feeds["bn2.running_var"], np.full(3, 2.0, np.float32))
    np.testing.assert_array_equal(feeds["bn2.running_mean"], np.zeros(3, np.float32))
    assert "unused" not in feeds and feeds["bn.running_var"].dtype == np.float32
    (y,) = og.compile([model.output])(**feeds)  # the executable takes every feed
    assert np.all(np.isfinite(y))


def test_running_update_variance_is_fed_ones():
    g = og.Graph()
    x = g.input("x", (4, 2))
    rm, rv = g.buffer("rm", (2,)), g.buffer("rv", (2,))
    _, new_mean, new_var = og.batch_norm(x, rm, rv, training=True, return_running_stats=True)
    feeds = buffer_feeds(g, [new_mean, new_var])
    np.testing.assert_array_equal(feeds["rv"], np.ones(2, np.float32))
    np.testing.assert_array_equal(feeds["rm"], np.zeros(2, np.float32))
