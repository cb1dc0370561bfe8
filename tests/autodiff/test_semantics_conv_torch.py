"""SEMANTICS.md "Convolution" rules, one edge case each, against PyTorch (CPU, float64):
forward, both gradients (backward-data and backward-filter ops) and the second
derivatives, through ``og.compile`` with each CPU lowering preferred for every
convolution node (reference, direct, im2col + GEMM, FFT, Winograd where it applies).

PyTorch's ``F.conv2d`` is a cross-correlation with symmetric padding, so the
asymmetric and ``'same'`` paddings are applied in PyTorch by ``F.pad`` with the
amounts computed here from SEMANTICS.md's formulas (never from opgraph)."""

import math

import numpy as np
import pytest

import opgraph as og

from .torch_compare import compare

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _same(size, k, s, d):
    """SEMANTICS.md's 'same' rule for one axis: (begin, end)."""
    out = math.ceil(size / s)
    total = max((out - 1) * s + d * (k - 1) + 1 - size, 0)
    return total // 2, total - total // 2


# name -> (x shape, w shape, opgraph params, torch pads (top, bottom, left, right))
CASES = {
    # An asymmetric kernel and asymmetric padding: a flipped kernel or swapped pads differ.
    "cross_correlation_asym_pad": ((2, 3, 6, 5), (4, 3, 3, 3), dict(padding=((0, 2), (1, 0))), (0, 2, 1, 0)),
    "same_extra_bottom_right": ((1, 2, 6, 5), (3, 2, 3, 2), dict(stride=2, padding="same"),
                                (*_same(6, 3, 2, 1), *_same(5, 2, 2, 1))),
    "same_dilated": ((1, 2, 7, 6), (2, 2, 2, 3), dict(dilation=(3, 2), padding="same"),
                     (*_same(7, 2, 1, 3), *_same(6, 3, 1, 2))),
    "same_stride1_3x3": ((2, 2, 5, 4), (3, 2, 3, 3), dict(padding="same"), (1, 1, 1, 1)),
    "valid": ((1, 2, 5, 6), (2, 2, 3, 3), dict(padding="valid"), (0, 0, 0, 0)),
    "stride_not_tiling": ((1, 2, 8, 7), (3, 2, 3, 3), dict(stride=3), (0, 0, 0, 0)),
    "kernel_gt_input_not_padded": ((1, 2, 2, 3), (3, 2, 3, 4), dict(padding=1), (1, 1, 1, 1)),
    "kernel_gt_input_3x3": ((2, 2, 2, 2), (3, 2, 3, 3), dict(padding=((1, 0), (0, 1))), (1, 0, 0, 1)),
    "1x1_stride2": ((2, 3, 5, 6), (4, 3, 1, 1), dict(stride=2), (0, 0, 0, 0)),
    "stride_dilation_hw": ((1, 2, 9, 8), (3, 2, 2, 3), dict(stride=(2, 1), dilation=(1, 2), padding=(1, 0)),
                           (1, 1, 0, 0)),
    "groups2": ((2, 4, 5, 5), (6, 2, 3, 3), dict(groups=2, padding=1), (1, 1, 1, 1)),
    "depthwise": ((1, 3, 5, 6), (6, 1, 3, 3), dict(groups=3, padding=((2, 0), (0, 1))), (2, 0, 0, 1)),
    "batch0": ((0, 4, 5, 5), (4, 2, 3, 3), dict(groups=2, padding=1), (1, 1, 1, 1)),
}

ALGORITHMS = ["reference", "direct", "gemm", "fft", "winograd"]


def _winograd_applies(ws, params):
    one = lambda v: v in (1, (1, 1))  # noqa: E731
    return ws[2:] == (3, 3) and one(params.get("stride", 1)) and one(params.get("dilation", 1))


GRID = [(alg, case) for alg in ALGORITHMS for case in CASES
        if alg != "winograd" or _winograd_applies(CASES[case][1], CASES[case][2])]


def _only(alg):
    def check(choices):
        convs = {n: c for n, c in choices.items() if "Conv2d" in c}
        assert convs, choices
        for name, chosen in convs.items():
            assert chosen.startswith(f"{alg}[cpu]:"), f"{name}: {chosen}"
    return check


@pytest.mark.parametrize("alg, case", GRID)
def test_conv_forward_gradients_and_second_derivatives_match_torch(alg, case):
    xs, ws, params, pads = CASES[case]
    top, bottom, left, right = pads
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal(xs), "w": rng.standard_normal(ws), "b": rng.standard_normal(ws[0])}
    stride, dilation, groups = params.get("stride", 1), params.get("dilation", 1), params.get("groups", 1)

    def ours(x, w, b):
        return og.conv2d(x, w, b, **params)

    def theirs(x, w, b):
        return F.conv2d(F.pad(x, (left, right, top, bottom)), w, b, stride=stride, dilation=dilation,
                        groups=groups)

    grads = compare(ours, theirs, feeds, ["x", "w", "b"], rtol=1e-9,
                    policy={"prefer": {"conv": [alg]}, "autotune": False}, choices=_only(alg))
    assert grads["x"].shape == xs and grads["w"].shape == ws
    if xs[0] == 0:
        assert np.all(grads["w"] == 0) and np.all(grads["b"] == 0)


# (x shape, w shape, params, rows read, columns read)
UNTOUCHED = {
    # k = 3, s = 3 on 8 x 7: rows 6..7 and column 6 lie past the last window.
    "past_last_window": ((1, 2, 8, 7), (3, 2, 3, 3), dict(stride=3), range(6), range(6)),
    # k = 1, s = 3 (k = 2, d = 2, s = 3 across): windows skip rows and columns between them.
    "between_windows": ((1, 2, 7, 8), (3, 2, 1, 2), dict(stride=3, dilation=(1, 2)), [0, 3, 6], [0, 2, 3, 5]),
}


def _touched_mask(shape, rows, cols):
    m = np.zeros(shape, bool)
    m[..., list(rows), :] = True
    keep = np.zeros(shape[-1], bool)
    keep[list(cols)] = True
    return m & keep


@pytest.mark.parametrize("case", sorted(UNTOUCHED))
@pytest.mark.parametrize("alg", ["reference", "direct", "gemm", "fft"])
def test_conv_input_gradient_rows_no_window_touches_are_exactly_zero(alg, case):
    """The input gradient keeps the input's shape; what no window reads is exactly 0
    (the FFT's transforms leave rounding noise there unless it is cleared)."""
    xs, ws, params, rows, cols = UNTOUCHED[case]
    g = og.Graph()
    x, w = g.input("x", xs, "float64"), g.input("w", ws, "float64")
    y = og.conv2d(x, w, **params)
    (gx,) = og.grad(y, [x])
    run = og.compile([gx], dtype="float64", policy={"prefer": {"conv": [alg]}, "autotune": False})
    _only(alg)(run.choices)
    rng = np.random.default_rng(0)
    (got,) = run(x=rng.standard_normal(xs), w=rng.standard_normal(ws),
                 grad_outputs={y: rng.standard_normal(y.shape)})
    assert got.shape == xs
    touched = _touched_mask(xs, rows, cols)
    assert np.all(got[~touched] == 0)
    assert np.all(got[touched] != 0)


@pytest.mark.parametrize("chunks", [1, 2])
@pytest.mark.parametrize("case", sorted(UNTOUCHED))
def test_fft_kernel_input_gradient_untouched_cells_are_exactly_zero(case, chunks):
    """The same on the FFT kernel with the ``fft-chunked`` rule's option, in float32."""
    from opgraph.backends.algorithms import fft
    from opgraph.backends.reference import conv as ref

    xs, ws, params, rows, cols = UNTOUCHED[case]
    rng = np.random.default_rng(1)
    w = rng.standard_normal(ws).astype(np.float32)
    ys = ref.conv_geometry(xs, ws, **params).y_shape
    gy = rng.standard_normal(ys).astype(np.float32)
    got = fft.conv2d_backward_data(np, gy, w, input_shape=xs, chunks=chunks, **params)
    want = torch.nn.grad.conv2d_input(xs, torch.tensor(w, dtype=torch.float64), torch.tensor(gy, dtype=torch.float64),
                                      stride=params.get("stride", 1), dilation=params.get("dilation", 1)).numpy()
    touched = _touched_mask(xs, rows, cols)
    assert np.all(got[~touched] == 0) and np.all(want[~touched] == 0)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5
