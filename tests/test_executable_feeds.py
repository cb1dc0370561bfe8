"""What an executable accepts as feeds: sources the compiled outputs do not
read are ignored (a training loop feeds one dict of every parameter), names
that are not in the graph, malformed ``grad_outputs`` and float data fed to
integer inputs are clear errors."""

import re

import numpy as np
import pytest
import torch

import opgraph as og
from opgraph.errors import ExecutionError


def _conv():
    g = og.Graph("net")
    x, w, b = g.input("x", (2, 3, 5, 5)), g.param("w", (4, 3, 3, 3)), g.param("b", (4,))
    y = og.conv2d(x, w, b, padding=1, name="conv")
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 3, 5, 5), dtype=np.float32),
             "w": rng.standard_normal((4, 3, 3, 3), dtype=np.float32),
             "b": rng.standard_normal(4, dtype=np.float32)}
    return g, y, feeds


def test_a_source_the_outputs_do_not_read_is_ignored():
    g, y, feeds = _conv()
    (dw,) = og.grad(y, [g["w"]])
    run = og.compile([dw])  # dw reads x and the output gradient, not w or b
    gy = np.ones(y.shape, np.float32)
    (got,) = run(grad_outputs={y: gy}, **feeds)
    xt = torch.from_numpy(feeds["x"])
    wt = torch.from_numpy(feeds["w"]).requires_grad_()
    torch.nn.functional.conv2d(xt, wt, padding=1).backward(torch.from_numpy(gy))
    np.testing.assert_allclose(got, wt.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_a_name_not_in_the_graph_is_still_an_error():
    g, y, feeds = _conv()
    with pytest.raises(ExecutionError, match=r"unknown feed\(s\) \['wq'\]: no source of graph 'net'"):
        og.compile([y])(wq=feeds["w"], **feeds)


def test_grad_outputs_must_be_a_mapping():
    g, y, feeds = _conv()
    (dw,) = og.grad(y, [g["w"]])
    with pytest.raises(TypeError, match="grad_outputs must be a dict .* got list"):
        og.compile([dw])([np.ones(y.shape, np.float32)], **feeds)


def test_an_unknown_grad_outputs_name_is_named():
    g, y, feeds = _conv()
    (dw,) = og.grad(y, [g["w"]])
    with pytest.raises(ExecutionError, match="grad_outputs key 'nope' is neither an output Value nor"):
        og.compile([dw])(grad_outputs={"nope": np.ones(y.shape)}, **feeds)
    (got,) = og.compile([dw])(grad_outputs={"conv": np.ones(y.shape)}, **feeds)  # by name works
    assert got.shape == (4, 3, 3, 3)


def test_a_feed_dict_passed_positionally_says_so():
    g, y, feeds = _conv()
    with pytest.raises(ExecutionError, match=r"'x' is a source \(input\), not an output: feed sources "
                                             r"as keyword arguments, run\(x=...\)"):
        og.compile([y])(feeds)


def _loss():
    g = og.Graph("clf")
    x, t = g.input("x", (3, 4)), g.input("t", (3,), dtype="int64")
    return og.cross_entropy(x, t), np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)


@pytest.mark.parametrize("target, bad", [([0.0, 1.7, 2.0], "1.7"), ([0.0, np.nan, 2.0], "nan"),
                                         ([0.0, 1.0, 1e30], "1e+30")])
def test_cross_entropy_refuses_non_integral_float_targets(target, bad):
    loss, x = _loss()
    with pytest.raises(ExecutionError, match="input 't' is int64: got floating values such as " + re.escape(bad)):
        og.compile([loss])(x=x, t=np.array(target))


def test_cross_entropy_takes_whole_float_targets_as_pytorch_takes_long_ones():
    loss, x = _loss()
    (got,) = og.compile([loss])(x=x, t=np.array([0.0, 3.0, 2.0]))
    want = torch.nn.functional.cross_entropy(torch.from_numpy(x), torch.tensor([0, 3, 2]))
    assert abs(float(got) - float(want)) < 1e-6
