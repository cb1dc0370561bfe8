"""The reference pooling kernels' offset loop (reference/pool.py) on the cases
its blocks and fast paths branch on: blocks that split the batch unevenly or
cut images into channel slices (``_BLOCK_BYTES`` made small), channels-last
storage, output gradients holding NaN or inf (the masked routing path), the
node kernel's fused ReLU backward bit for bit, windows of over 256 cells, and
PyTorch CPU as a second opinion (ties included).

Expected values come from a float64 per-window loop written here, which
enumerates each window's cells in row-major order and classifies each as
input, explicit padding or ceil_mode overhang (SEMANTICS.md, Pooling).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from opgraph.backends.reference import pool
from opgraph.backends.reference.elementwise import relu_backward
from opgraph.params import pool_out_size
from opgraph.types import numpy_dtype, storage_order, to_layout

#: kernel, stride, ((top, bottom), (left, right)), ceil_mode, input HW: each
#: mixes asymmetric padding, ceil_mode overhang or overlapping windows.
CONFIGS = [
    ((3, 3), (2, 2), ((1, 0), (0, 1)), True, (7, 8)),
    ((3, 2), (2, 1), ((1, 1), (1, 0)), True, (6, 5)),
    ((2, 3), (3, 2), ((0, 1), (1, 1)), False, (8, 7)),
    ((3, 3), (1, 1), ((1, 1), (1, 1)), False, (5, 5)),
    ((1, 1), (2, 3), ((0, 0), (0, 0)), True, (5, 7)),    # stride > kernel, overhang
    ((4, 4), (3, 3), ((2, 0), (1, 2)), True, (9, 10)),
]
KINDS = ["normal", "ties", "nan", "neg_inf"]


def make_input(rng, shape, kind):
    """``shape`` float64 data: distinct values, many ties (zeros included),
    scattered NaN, or ``-inf`` rows and a column next to the padding."""
    if kind == "ties":
        return rng.integers(-1, 2, shape).astype(np.float64)
    x = rng.standard_normal(shape)
    if kind == "nan":
        x.flat[rng.choice(x.size, max(1, x.size // 10), replace=False)] = np.nan
    elif kind == "neg_inf":
        x[:, :, : shape[2] // 2] = -np.inf
        x[:, :, :, -1] = -np.inf
    return x


def window_cells(i, j, k, s, pad, hw):
    """``(inputs, padcells)`` of window ``(i, j)``: its input cells as
    ``(r, c, p*kw + q)`` in row-major window order, and how many explicit
    padding cells it holds (ceil_mode overhang is neither)."""
    (pt, pb), (pl, pr) = pad
    inputs, padcells = [], 0
    for p, q in itertools.product(range(k[0]), range(k[1])):
        r, c = i * s[0] - pt + p, j * s[1] - pl + q
        if 0 <= r < hw[0] and 0 <= c < hw[1]:
            inputs.append((r, c, p * k[1] + q))
        elif -pt <= r < hw[0] + pb and -pl <= c < hw[1] + pr:
            padcells += 1
    return inputs, padcells


def loop_pool(x, gy, v, k, s, pad, ceil, cip=True):
    """float64 window-by-window pooling, a dict: ``ymax``, ``gmax`` (each
    window's gy whole at its winner: its first NaN, else its first input cell
    equal to the maximum), ``argwin`` (the winner's row-major index in the
    window), ``select`` (v at the winner), ``yavg``, ``gavg``."""
    n, c, h, w = x.shape
    oh, ow = (pool_out_size(d, kk, ss, p, ceil) for d, kk, ss, p in zip((h, w), k, s, pad))
    out = {name: np.zeros((n, c, oh, ow)) for name in ("ymax", "argwin", "select", "yavg")}
    out["gmax"], out["gavg"] = np.zeros(x.shape), np.zeros(x.shape)
    for i, j in itertools.product(range(oh), range(ow)):
        inputs, padcells = window_cells(i, j, k, s, pad, (h, w))
        vals = np.stack([x[:, :, r, col] for r, col, _ in inputs], axis=-1)
        top = vals.max(axis=-1)
        nan = np.isnan(vals)
        first = np.where(nan.any(axis=-1), np.argmax(nan, axis=-1), np.argmax(vals == top[..., None], axis=-1))
        div = len(inputs) + (padcells if cip else 0)
        out["ymax"][:, :, i, j] = top
        out["yavg"][:, :, i, j] = vals.sum(axis=-1) / div
        for t, (r, col, cell) in enumerate(inputs):
            won = first == t
            out["gmax"][:, :, r, col] += np.where(won, gy[:, :, i, j], 0)
            out["gavg"][:, :, r, col] += gy[:, :, i, j] / div
            out["argwin"][:, :, i, j] = np.where(won, cell, out["argwin"][:, :, i, j])
            out["select"][:, :, i, j] = np.where(won, v[:, :, r, col], out["select"][:, :, i, j])
    return out


def kw_of(k, s, pad, ceil):
    return dict(kernel_size=k, stride=s, padding=pad, ceil_mode=ceil)


#: ``_BLOCK_BYTES`` by the input shape (float64): one channel per block,
#: blocks of two images over a batch of 5 (the last one shorter), one block.
BLOCKINGS = {"channel": lambda shape: 1,
             "two_images": lambda shape: 2 * 8 * shape[1] * shape[2] * shape[3],
             "whole": lambda shape: 1 << 40}


def run_all(x, gy, v, k, s, pad, ceil):
    """Every reference pooling kernel on one case, a dict like :func:`loop_pool`'s."""
    kw = kw_of(k, s, pad, ceil)
    y, argwin = pool._max_argwin(np, x, pool._checked("max_pool2d", x, k, s, pad, ceil))
    out = {"ymax": pool.max_pool2d(np, x, **kw), "argwin": argwin, "argwin_y": y,
           "gmax": pool.max_pool2d_backward(np, x, gy, **kw), "select": pool.max_pool2d_select(np, x, v, **kw)}
    for cip in (True, False):
        out[f"yavg{cip}"] = pool.avg_pool2d(np, x, count_include_pad=cip, **kw)
        out[f"gavg{cip}"] = pool.avg_pool2d_backward(np, gy, count_include_pad=cip, input_shape=x.shape, **kw)
    return out


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("blocking", list(BLOCKINGS))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("k,s,pad,ceil,hw", CONFIGS)
def test_every_kernel_matches_the_window_loop(monkeypatch, k, s, pad, ceil, hw, kind, blocking, layout):
    rng = np.random.default_rng(0)
    shape = (5, 3) + hw
    x64, v64 = make_input(rng, shape, kind), rng.standard_normal(shape)
    gy64 = rng.standard_normal(shape[:2] + pool._checked("max_pool2d", x64, k, s, pad, ceil).out)
    want = {True: loop_pool(x64, gy64, v64, k, s, pad, ceil, True),
            False: loop_pool(x64, gy64, v64, k, s, pad, ceil, False)}
    monkeypatch.setattr(pool, "_BLOCK_BYTES", BLOCKINGS[blocking](shape))
    got = run_all(*(to_layout(np, a, layout) for a in (x64, gy64, v64)), k, s, pad, ceil)
    for name in ("ymax", "argwin", "select"):       # exact: nothing is summed
        np.testing.assert_array_equal(got[name], want[True][name], err_msg=name)
    np.testing.assert_array_equal(got["argwin_y"], want[True]["ymax"])
    np.testing.assert_allclose(got["gmax"], want[True]["gmax"], rtol=1e-13, atol=1e-14)
    for cip in (True, False):
        np.testing.assert_allclose(got[f"yavg{cip}"], want[cip]["yavg"], rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(got[f"gavg{cip}"], want[cip]["gavg"], rtol=1e-13, atol=1e-15)
    # results keep the operand's storage order (an NHWC plan pays no transpose)
    for name, a in got.items():
        assert storage_order(a) == layout or min(a.shape[1], a.shape[2] * a.shape[3]) == 1, name


@pytest.mark.parametrize("k,s,pad,ceil,hw", CONFIGS)
def test_blocking_and_layout_change_no_bit(monkeypatch, k, s, pad, ceil, hw):
    """Blocks and storage order only change which cells a pass visits
    together, never the order of any cell's sum: every result is the same
    bits under every blocking, NCHW or NHWC."""
    rng = np.random.default_rng(1)
    shape = (5, 3) + hw
    x = make_input(rng, shape, "ties").astype(np.float32)
    g = pool._checked("max_pool2d", x, k, s, pad, ceil)
    gy = rng.standard_normal(shape[:2] + g.out).astype(np.float32)
    v = rng.standard_normal(shape).astype(np.float32)
    runs = []
    for blocking, layout in itertools.product(BLOCKINGS, ["NCHW", "NHWC"]):
        monkeypatch.setattr(pool, "_BLOCK_BYTES", BLOCKINGS[blocking](shape))
        runs.append(run_all(*(to_layout(np, a, layout) for a in (x, gy, v)), k, s, pad, ceil))
    for run in runs[1:]:
        for name, a in run.items():
            assert a.dtype == runs[0][name].dtype
            np.testing.assert_array_equal(np.ascontiguousarray(a).view(np.uint8),
                                          np.ascontiguousarray(runs[0][name]).view(np.uint8), err_msg=name)


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # inf + -inf summed at one winner
@pytest.mark.parametrize("blocking", ["channel", "whole"])
@pytest.mark.parametrize("k,s,pad,ceil,hw", CONFIGS)
def test_nan_and_inf_gradients_reach_their_winner_only(monkeypatch, k, s, pad, ceil, hw, blocking):
    """A NaN or inf in gy takes the masked routing path: it reaches its
    window's winner and no other cell (``inf * 0`` would be NaN)."""
    rng = np.random.default_rng(2)
    shape = (5, 3) + hw
    x = make_input(rng, shape, "ties")
    g = pool._checked("max_pool2d", x, k, s, pad, ceil)
    gy = rng.standard_normal(shape[:2] + g.out)
    spots = rng.choice(gy.size, max(3, gy.size // 4), replace=False)
    gy.flat[spots] = np.resize([np.nan, np.inf, -np.inf], spots.size)
    monkeypatch.setattr(pool, "_BLOCK_BYTES", BLOCKINGS[blocking](shape))
    want = loop_pool(x, gy, x, k, s, pad, ceil)["gmax"]
    got = pool.max_pool2d_backward(np, x, gy, **kw_of(k, s, pad, ceil))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-14)


def _fused_node(x, gy, k, s, pad, ceil):
    from opgraph.backends.registry import KernelContext, lookup
    from opgraph.ops import MaxPool2dBackwardRelu

    op = MaxPool2dBackwardRelu(kernel_size=k, stride=s, padding=pad, ceil_mode=ceil)
    return lookup(MaxPool2dBackwardRelu, "reference").kernel(KernelContext(np), op, x, gy)


@pytest.mark.parametrize("dtype", ["float64", "float16"])
@pytest.mark.parametrize("gy_kind", ["finite", "nonfinite"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("k,s,pad,ceil,hw", CONFIGS)
def test_fused_relu_node_is_relu_backward_of_max_backward_bit_for_bit(k, s, pad, ceil, hw, kind, gy_kind, dtype):
    """The node kernel routes only windows whose maximum is > 0; the result is
    ``relu_backward(x, max_pool2d_backward(x, gy))`` to the bit, signs of
    zero included, over ties, zeros, negatives, NaN and -inf inputs."""
    rng = np.random.default_rng(3)
    shape = (2, 3) + hw
    dt = numpy_dtype(dtype)
    x = make_input(rng, shape, kind).astype(dt)
    g = pool._checked("max_pool2d", x, k, s, pad, ceil)
    gy = rng.standard_normal(shape[:2] + g.out).astype(dt)
    if gy_kind == "nonfinite":
        gy.flat[rng.choice(gy.size, max(2, gy.size // 6), replace=False)] = np.inf
        gy.flat[0] = np.nan
    kw = kw_of(k, s, pad, ceil)
    want = relu_backward(np, x, pool.max_pool2d_backward(np, x, gy, **kw))
    got = _fused_node(x, gy, k, s, pad, ceil)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint8), np.ascontiguousarray(want).view(np.uint8))


def test_a_window_over_256_cells_indexes_past_a_byte():
    """17x17 windows (289 cells): the winner index needs 16 bits."""
    rng = np.random.default_rng(4)
    x = rng.integers(0, 3, (2, 2, 20, 19)).astype(np.float64)
    k, s, pad = (17, 17), (1, 2), ((0, 0), (1, 0))
    g = pool._checked("max_pool2d", x, k, s, pad, False)
    y, idx = pool._max_argwin(np, x, g)
    assert idx.dtype == np.uint16
    want = loop_pool(x, np.zeros(y.shape), x, k, s, pad, False)
    np.testing.assert_array_equal(idx, want["argwin"])
    np.testing.assert_array_equal(y, want["ymax"])


# ---- PyTorch CPU as a second opinion (symmetric padding, PyTorch's only form)

TORCH_CONFIGS = [  # kernel, stride, padding, ceil_mode, input HW
    (3, 2, 1, True, (8, 7)),
    (3, 2, 0, True, (6, 9)),
    ((3, 2), (2, 1), (1, 1), True, (7, 6)),
    (2, 2, 1, False, (5, 5)),
    (3, 1, 1, False, (6, 6)),
]


@pytest.mark.parametrize("kind", ["normal", "ties"])
@pytest.mark.parametrize("k,s,p,ceil,hw", TORCH_CONFIGS)
def test_against_pytorch(k, s, p, ceil, hw, kind):
    """PyTorch's CPU pooling picks the first maximum in row-major order (a
    strict ``>``) and divides averages by SEMANTICS.md's counts; NaN differs
    (PyTorch routes to the last NaN), so none is fed."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(5)
    shape = (3, 4) + hw
    x = make_input(rng, shape, kind)
    kw = dict(kernel_size=k, stride=s, padding=p, ceil_mode=ceil)
    xt = torch.tensor(x, requires_grad=True)
    yt = F.max_pool2d(xt, **kw)
    gy = rng.standard_normal(tuple(yt.shape))
    yt.backward(torch.tensor(gy))
    np.testing.assert_array_equal(pool.max_pool2d(np, x, **kw), yt.detach().numpy())
    np.testing.assert_allclose(pool.max_pool2d_backward(np, x, gy, **kw), xt.grad.numpy(), rtol=1e-13, atol=1e-14)
    for cip in (True, False):
        xt = torch.tensor(x, requires_grad=True)
        at = F.avg_pool2d(xt, count_include_pad=cip, **kw)
        at.backward(torch.tensor(gy))
        np.testing.assert_allclose(pool.avg_pool2d(np, x, count_include_pad=cip, **kw), at.detach().numpy(),
                                   rtol=1e-13, atol=1e-15)
        ga = pool.avg_pool2d_backward(np, gy, count_include_pad=cip, input_shape=shape, **kw)
        np.testing.assert_allclose(ga, xt.grad.numpy(), rtol=1e-13, atol=1e-15)
