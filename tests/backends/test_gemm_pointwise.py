"""gemm's 1x1 path (``backends/algorithms/gemm_pointwise.py``): the three
directions against the float64 direct reference in every storage a plan
hands it (NCHW, packed NHWC, a channel slice of an NHWC buffer), NHWC kept
for NHWC operands, and neither im2col nor its window view ever built."""

import numpy as np
import pytest

from opgraph.backends.algorithms import gemm, gemm_pointwise
from opgraph.backends.reference import conv as ref
from opgraph.types import TensorType, is_channels_last, to_layout

XS, WS = (3, 6, 4, 5), (8, 6, 1, 1)


def stored(a, how):
    """``a`` as the plan may hand it: NCHW, packed NHWC, or a channel slice of a wider NHWC buffer."""
    if how == "NCHW":
        return a
    if how == "NHWC":
        return to_layout(np, a, "NHWC")
    n, c, h, w = a.shape
    wide = np.zeros((n, c + 3, h, w), a.dtype)
    wide[:, 2:2 + c] = a
    return to_layout(np, wide, "NHWC")[:, 2:2 + c]


@pytest.fixture(autouse=True)
def no_im2col(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the 1x1 path built an im2col window")
    monkeypatch.setattr(gemm, "window_view", refuse)
    monkeypatch.setattr(gemm, "im2col", refuse)


@pytest.mark.parametrize("stride", [1, 2, (2, 3)])
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("how", ["NCHW", "NHWC", "slice"])
@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_filter"])
def test_matches_the_reference(direction, how, groups, stride):
    rng = np.random.default_rng(7)
    ws = (WS[0], WS[1] // groups, 1, 1)
    x, w = rng.standard_normal(XS), rng.standard_normal(ws)
    conv = {"groups": groups, "stride": stride}
    gy = rng.standard_normal(ref.conv_geometry(XS, ws, **conv).y_shape)
    x32, w32, gy32 = (a.astype(np.float32) for a in (x, w, gy))
    if direction == "forward":
        got = gemm.conv2d_forward(np, stored(x32, how), w32, **conv)
        want = ref.conv2d_forward(np, x32.astype(np.float64), w32.astype(np.float64), **conv)
        lead = x32
    elif direction == "backward_data":
        got = gemm.conv2d_backward_data(np, stored(gy32, how), w32, **conv, input_shape=XS)
        want = ref.conv2d_backward_data(np, gy32.astype(np.float64), w32.astype(np.float64),
                                        **conv, input_shape=XS)
        lead = gy32
    else:
        got = gemm.conv2d_backward_filter(np, stored(x32, how), stored(gy32, how), **conv,
                                          weight_shape=ws)
        want = ref.conv2d_backward_filter(np, x32.astype(np.float64), gy32.astype(np.float64),
                                          **conv, weight_shape=ws)
        lead = None
    assert got.shape == want.shape and got.dtype == np.float32
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    if lead is not None:  # an activation keeps the plan's layout where one GEMM ran
        assert is_channels_last(got) == (how in ("NHWC", "slice") and groups == 1)


def test_only_an_unpadded_1x1_takes_the_path():
    g = ref.conv_geometry(XS, WS)
    assert gemm_pointwise.applies(g)
    assert gemm_pointwise.applies(ref.conv_geometry(XS, WS, stride=2))  # the pixels it reads, subsampled
    assert not gemm_pointwise.applies(ref.conv_geometry(XS, WS, padding=1))
    assert not gemm_pointwise.applies(ref.conv_geometry(XS, (8, 6, 3, 3)))
    assert not gemm_pointwise.applies(ref.conv_geometry((0, *XS[1:]), WS))


def test_workspace_is_what_the_path_allocates():
    from opgraph.ops.conv import Conv2dBackwardFilter
    op = Conv2dBackwardFilter(stride=1, padding=0, dilation=1, groups=1, weight_shape=WS)
    gys = (XS[0], WS[0], *XS[2:])
    nhwc = [TensorType(XS, "float32", "NHWC"), TensorType(gys, "float32", "NHWC")]
    nchw = [TensorType(XS, "float32", "NCHW"), TensorType(gys, "float32", "NCHW")]
    assert gemm.workspace("backward_filter", op, nhwc, {}) == 0
    n, c, h, w = XS
    assert gemm.workspace("backward_filter", op, nchw, {}) == (c + WS[0]) * n * h * w * 4
