"""Broadcasting add/mul/div, neg, mean, adaptive average pooling, split/narrow and
permute/transpose (the channel shuffle) against PyTorch (CPU, float64):
forward, gradients and double backward through ``og.compile``."""

import numpy as np
import pytest

import opgraph as og

from .torch_compare import compare

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _normal(seed=3, **shapes):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s) for n, s in shapes.items()}


@pytest.mark.parametrize("a_shape, b_shape", [((2, 3, 4, 4), (2, 3, 1, 1)), ((2, 3, 1, 1), (2, 3, 4, 4)),
                                              ((3, 4), (4,)), ((2, 5), (2, 5))])
def test_mul_matches_torch(a_shape, b_shape):
    """The squeeze-and-excitation scale (N, C, H, W) * (N, C, 1, 1) and its mirror."""
    compare(og.mul, torch.mul, _normal(a=a_shape, b=b_shape), ["a", "b"])


@pytest.mark.parametrize("a_shape, b_shape", [((2, 3, 4, 4), (3, 1, 1)), ((3, 1), (1, 4)), ((2, 5), (2, 5)),
                                              ((4,), (2, 3, 4))])
def test_add_broadcasts_as_torch_add(a_shape, b_shape):
    """A per-channel bias (N, C, H, W) + (C, 1, 1), an outer sum and its mirror: values and
    gradients (summed back to each operand's shape). No double backward: an operand of the
    output's shape has gy itself as its gradient, which ``compare`` cannot feed a cotangent to."""
    compare(og.add, torch.add, _normal(a=a_shape, b=b_shape), ["a", "b"], double=False)


@pytest.mark.parametrize("a_shape, b_shape", [((2, 3, 4, 4), (2, 3, 1, 1)), ((3, 1), (1, 4))])
def test_div_matches_torch(a_shape, b_shape):
    feeds = _normal(a=a_shape, b=b_shape)
    feeds["b"] = np.sign(feeds["b"]) * (0.5 + np.abs(feeds["b"]))
    compare(og.div, torch.div, feeds, ["a", "b"])


def test_neg_matches_torch():
    compare(og.neg, torch.neg, _normal(x=(2, 3)), ["x"])


@pytest.mark.parametrize("dim, keepdim", [((2, 3), True), ((2, 3), False), (1, False), (-1, True),
                                          (None, False), ((0, 2), True)])
def test_mean_matches_torch(dim, keepdim):
    theirs = (lambda x: torch.mean(x)) if dim is None else (lambda x: torch.mean(x, dim, keepdim))
    compare(lambda x: og.mean(x, dim, keepdim), theirs, _normal(x=(2, 3, 4, 5)), ["x"])


@pytest.mark.parametrize("output_size", [1, (1, 1), (2, 3), (None, 3), 6])
def test_adaptive_avg_pool2d_matches_torch(output_size):
    compare(lambda x: og.adaptive_avg_pool2d(x, output_size),
            lambda x: F.adaptive_avg_pool2d(x, output_size), _normal(x=(2, 3, 6, 6)), ["x"])


@pytest.mark.parametrize("sections, dim", [(2, 1), ([1, 3, 2], 1), (4, -1), ([2, 0, 3], 3)])
def test_split_matches_torch(sections, dim):
    """Every chunk against torch.split; the gradient of their concatenation is the
    gradient of x (each chunk's slice-backward summed)."""
    def ours(x):
        return og.concat([og.relu(c) for c in og.split(x, sections, dim)], dim=dim)

    def theirs(x):
        return torch.cat([torch.relu(c) for c in torch.split(x, sections, dim)], dim)

    x = np.random.default_rng(4).standard_normal((2, 6, 3, 5))
    compare(ours, theirs, {"x": np.where(np.abs(x) < 0.05, 0.5, x)}, ["x"], double=False)


def test_narrow_matches_torch():
    compare(lambda x: og.narrow(x, 1, 2, 3), lambda x: torch.narrow(x, 1, 2, 3),
            _normal(x=(2, 6, 3, 3)), ["x"])


@pytest.mark.parametrize("dim,start,length", [(1, -2, 2), (-1, -3, 1), (1, -6, 6)])
def test_narrow_with_a_negative_start_matches_torch(dim, start, length):
    """``torch.narrow``'s start may be negative, counted from the end of the axis;
    ``og.narrow`` refused it."""
    compare(lambda x: og.narrow(x, dim, start, length), lambda x: torch.narrow(x, dim, start, length),
            _normal(x=(2, 6, 3, 3)), ["x"])


def test_narrow_with_a_start_before_the_axis_names_the_parameter():
    g = og.Graph("t")
    x = g.input("x", (2, 6, 3, 3))
    with pytest.raises(og.ParameterError, match="node cut.*parameter start=-7"):
        og.narrow(x, 1, -7, 2, name="cut")


@pytest.mark.parametrize("start,length,match", [
    (-1, 2, r"parameter length=2.*start -1 \(5 from the axis' beginning\) \+ length <= 6"),
    (4, 3, r"parameter length=3.*start 4 \+ length <= 6"),
    (0, -1, r"parameter length=-1"),
    (2.0, 1, r"parameter start=2\.0"),
])
def test_narrow_names_start_and_length_as_given(start, length, match):
    """Review: the error showed the shifted start and a ``stop`` the caller never passed;
    torch.narrow refuses the same calls."""
    g = og.Graph("t")
    x = g.input("x", (2, 6, 3, 3))
    with pytest.raises(og.ParameterError, match="node cut.*" + match):
        og.narrow(x, 1, start, length, name="cut")
    with pytest.raises((RuntimeError, IndexError, TypeError)):
        torch.narrow(torch.zeros(2, 6, 3, 3), 1, start, length)


@pytest.mark.parametrize("groups", [2, 3])
def test_channel_shuffle_matches_torch(groups):
    """ShuffleNet's shuffle: reshape (N, g, C/g, H, W), transpose(1, 2), reshape back."""
    n, c, h, w = 2, 6, 3, 2

    def ours(x):
        y = og.transpose(og.reshape(x, (n, groups, c // groups, h, w)), 1, 2)
        return og.reshape(y, (n, c, h, w))

    def theirs(x):
        return x.reshape(n, groups, c // groups, h, w).transpose(1, 2).reshape(n, c, h, w)

    compare(ours, theirs, _normal(x=(n, c, h, w)), ["x"])


def test_permute_matches_torch():
    compare(lambda x: og.permute(x, (0, 2, 3, 1)), lambda x: x.permute(0, 2, 3, 1),
            _normal(x=(2, 3, 4, 5)), ["x"])
