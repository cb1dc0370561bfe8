"""The direct (reference) convolution against an independent loop implementation,
adjoint identities and finite differences, all in float64 (SEMANTICS.md)."""

import numpy as np
import pytest

from opgraph.backends.reference import conv as ref
from opgraph.errors import ParameterError, ShapeError
from opgraph.params import padding2d, pair

# (x shape, w shape, params): every parameter form SEMANTICS.md names.
CASES = {
    "plain": ((2, 3, 5, 4), (2, 3, 3, 3), dict()),
    "pad1": ((1, 2, 4, 5), (3, 2, 3, 3), dict(padding=1)),
    "asym_pad": ((1, 2, 4, 5), (2, 2, 3, 2), dict(padding=((0, 2), (1, 0)))),
    "stride2": ((2, 2, 7, 6), (2, 2, 3, 3), dict(stride=2, padding=1)),
    "stride_hw": ((1, 2, 7, 8), (3, 2, 2, 3), dict(stride=(3, 1), padding=((1, 0), (0, 2)))),
    "dilation": ((1, 2, 8, 7), (2, 2, 3, 2), dict(dilation=(2, 3), padding=((2, 1), (0, 1)))),
    "groups2": ((2, 4, 5, 5), (6, 2, 3, 3), dict(groups=2, padding=1)),
    "depthwise": ((1, 3, 5, 6), (3, 1, 3, 2), dict(groups=3, stride=(1, 2))),
    "kernel_gt_input": ((1, 2, 2, 3), (2, 2, 3, 4), dict(padding=((1, 1), (1, 1)))),
    "1x1_stride2": ((2, 3, 5, 6), (4, 3, 1, 1), dict(stride=2)),
    "stride_not_tiling": ((1, 1, 8, 7), (2, 1, 3, 3), dict(stride=3)),
}


def loop_conv(x, w, stride, padding, dilation, groups):
    """SEMANTICS.md's formula, one output element at a time (pure Python)."""
    n_, c_, h_, w_ = x.shape
    o_, cg, kh, kw = w.shape
    (sh, sw), (dh, dw) = stride, dilation
    (pt, pb), (pl, pr) = padding
    ho = (h_ + pt + pb - dh * (kh - 1) - 1) // sh + 1
    wo = (w_ + pl + pr - dw * (kw - 1) - 1) // sw + 1
    og = o_ // groups
    y = np.zeros((n_, o_, ho, wo))
    for n in range(n_):
        for o in range(o_):
            g = o // og
            for i in range(ho):
                for j in range(wo):
                    acc = 0.0
                    for c in range(cg):
                        for p in range(kh):
                            for q in range(kw):
                                r, s = i * sh + p * dh - pt, j * sw + q * dw - pl
                                if 0 <= r < h_ and 0 <= s < w_:
                                    acc += x[n, g * cg + c, r, s] * w[o, c, p, q]
                    y[n, o, i, j] = acc
    return y


def canonical(params):
    """(stride, padding, dilation, groups) in canonical form for :func:`loop_conv`."""
    return (pair("stride", params.get("stride", 1), minimum=1),
            padding2d(params.get("padding", 0)),
            pair("dilation", params.get("dilation", 1), minimum=1),
            params.get("groups", 1))


def data(case, seed=0):
    xs, ws, params = CASES[case]
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    y = ref.conv2d_forward(np, x, w, **params)
    gy = rng.standard_normal(y.shape)
    return x, w, gy, params


@pytest.mark.parametrize("case", CASES)
def test_forward_matches_loops(case):
    x, w, _, params = data(case)
    y = ref.conv2d_forward(np, x, w, **params)
    expect = loop_conv(x, w, *canonical(params))
    assert y.shape == expect.shape and y.dtype == np.float64
    np.testing.assert_allclose(y, expect, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", CASES)
def test_backward_adjoint_identities(case):
    """<conv(x, w), gy> = <x, dgrad(gy, w)> = <w, wgrad(x, gy)> (bilinearity)."""
    x, w, gy, params = data(case)
    y = ref.conv2d_forward(np, x, w, **params)
    gx = ref.conv2d_backward_data(np, gy, w, input_shape=x.shape, **params)
    gw = ref.conv2d_backward_filter(np, x, gy, weight_shape=w.shape, **params)
    assert gx.shape == x.shape and gw.shape == w.shape
    lhs = np.vdot(y, gy)
    scale = np.linalg.norm(y) * np.linalg.norm(gy)
    assert abs(lhs - np.vdot(x, gx)) <= 1e-12 * scale
    assert abs(lhs - np.vdot(w, gw)) <= 1e-12 * scale


@pytest.mark.parametrize("case", ["asym_pad", "stride_hw", "dilation", "groups2", "stride_not_tiling"])
def test_backward_finite_differences(case):
    """Central differences of L = <conv(x, w), gy> at a few random entries."""
    x, w, gy, params = data(case)
    gx = ref.conv2d_backward_data(np, gy, w, input_shape=x.shape, **params)
    gw = ref.conv2d_backward_filter(np, x, gy, weight_shape=w.shape, **params)

    def loss(xv, wv):
        return np.vdot(ref.conv2d_forward(np, xv, wv, **params), gy)

    rng, h = np.random.default_rng(1), 1e-5
    for arr, grad, is_x in ((x, gx, True), (w, gw, False)):
        for flat in rng.choice(arr.size, size=min(6, arr.size), replace=False):
            idx = np.unravel_index(flat, arr.shape)
            plus, minus = arr.copy(), arr.copy()
            plus[idx] += h
            minus[idx] -= h
            if is_x:
                fd = (loss(plus, w) - loss(minus, w)) / (2 * h)
            else:
                fd = (loss(x, plus) - loss(x, minus)) / (2 * h)
            assert fd == pytest.approx(grad[idx], rel=1e-6, abs=1e-7)


def test_input_gradient_untouched_rows_are_zero():
    """Stride 3 over 8 rows with a 3-tap kernel reads rows 0..5 only."""
    x, w, gy, params = data("stride_not_tiling")
    gx = ref.conv2d_backward_data(np, gy, w, input_shape=x.shape, **params)
    assert gx.shape == (1, 1, 8, 7)
    assert np.all(gx[:, :, 6:, :] == 0) and np.all(gx[:, :, :, 6:] == 0)
    assert np.all(gx[:, :, :6, :6] != 0)


def test_cross_correlation_not_convolution():
    """A kernel with a single 1 at (0, 1) reads x[i, j+1] (no flip)."""
    x = np.arange(12.0).reshape(1, 1, 3, 4)
    w = np.zeros((1, 1, 2, 2))
    w[0, 0, 0, 1] = 1.0
    y = ref.conv2d_forward(np, x, w)
    np.testing.assert_array_equal(y[0, 0], x[0, 0, :2, 1:])


def test_batch_zero():
    x, w = np.zeros((0, 4, 5, 5)), np.ones((6, 2, 3, 3))
    y = ref.conv2d_forward(np, x, w, padding=1, groups=2)
    assert y.shape == (0, 6, 5, 5)
    gx = ref.conv2d_backward_data(np, y, w, padding=1, groups=2, input_shape=x.shape)
    assert gx.shape == x.shape
    gw = ref.conv2d_backward_filter(np, x, y, padding=1, groups=2, weight_shape=w.shape)
    assert gw.shape == w.shape and np.all(gw == 0)


def test_same_padding_output_size():
    """TensorFlow's 'same': out = ceil(in / s), extra pad at the bottom/right."""
    g = ref.conv_geometry((1, 1, 7, 6), (1, 1, 4, 3), stride=2, padding="same")
    assert (g.ho, g.wo) == (4, 3)
    assert g.padding == ((1, 2), (0, 1))


def test_float32_stays_float32():
    x = np.ones((1, 1, 3, 3), np.float32)
    assert ref.conv2d_forward(np, x, np.ones((1, 1, 2, 2), np.float32)).dtype == np.float32


def test_window_view_fallback_matches_sliding_window_view():
    a = np.arange(2 * 9 * 11, dtype=np.float64).reshape(2, 9, 11)
    for kernel, stride, dilation in [((3, 2), (2, 3), (1, 2)), ((1, 1), (2, 2), (1, 1)), ((2, 4), (1, 1), (3, 1))]:
        fast = ref.window_view(np, a, kernel, stride, dilation)
        slow = ref.strided_windows(np, a, kernel, stride, dilation)
        np.testing.assert_array_equal(fast, slow)
        # Element check of the definition v[..., i, j, p, q] = a[..., i*s + p*d, j*s + q*d].
        i, j, p, q = fast.shape[1] - 1, fast.shape[2] - 1, kernel[0] - 1, kernel[1] - 1
        assert fast[1, i, j, p, q] == a[1, i * stride[0] + p * dilation[0], j * stride[1] + q * dilation[1]]


@pytest.mark.parametrize("kwargs, param", [
    (dict(stride=0), "stride"),
    (dict(dilation=(1, 0)), "dilation"),
    (dict(padding=-1), "padding"),
    (dict(groups=0), "groups"),
    (dict(groups=3), "groups"),
])
def test_bad_parameters_name_the_parameter(kwargs, param):
    with pytest.raises(ParameterError) as err:
        ref.conv2d_forward(np, np.ones((1, 4, 5, 5)), np.ones((4, 4, 3, 3)), **kwargs)
    assert err.value.param == param


def test_kernel_larger_than_padded_input_is_an_error():
    with pytest.raises(ShapeError, match="larger than the padded input"):
        ref.conv2d_forward(np, np.ones((1, 1, 2, 2)), np.ones((1, 1, 3, 3)))


def test_weight_channels_must_match_groups():
    with pytest.raises(ShapeError, match="C/groups"):
        ref.conv2d_forward(np, np.ones((1, 4, 5, 5)), np.ones((4, 4, 3, 3)), groups=2)


def test_backward_rejects_wrong_gradient_shape():
    with pytest.raises(ShapeError, match="output gradient"):
        ref.conv2d_backward_data(np, np.ones((1, 2, 4, 4)), np.ones((2, 1, 3, 3)), input_shape=(1, 1, 5, 5))
    with pytest.raises(ShapeError, match="output gradient"):
        ref.conv2d_backward_filter(np, np.ones((1, 1, 5, 5)), np.ones((1, 2, 4, 4)), weight_shape=(2, 1, 3, 3))


@pytest.mark.parametrize("case", ["asym_pad", "stride_hw", "dilation", "groups2", "stride_not_tiling"])
def test_node_geometry_reinterprets_nothing(monkeypatch, case):
    """A node's geometry (``geometry_of``: the op's canonical fields, the node's
    types) is ``conv_geometry``'s, without ``padding2d`` or ``conv_out_size``;
    the three directions run on it give the standalone functions' results."""
    from opgraph.ops import Conv2d, Conv2dBackwardData, Conv2dBackwardFilter
    from opgraph.types import TensorType

    x, w, gy, params = data(case)
    want = ref.conv_geometry(x.shape, w.shape, **params)
    results = [ref.conv2d_forward(np, x, w, **params),
               ref.conv2d_backward_data(np, gy, w, input_shape=x.shape, **params),
               ref.conv2d_backward_filter(np, x, gy, weight_shape=w.shape, **params)]
    fwd, dgrad = Conv2d(**params), Conv2dBackwardData(input_shape=x.shape, **params)
    wgrad = Conv2dBackwardFilter(weight_shape=w.shape, **params)
    t = {k: TensorType(a.shape, "float64") for k, a in dict(x=x, w=w, gy=gy).items()}

    def unavailable(*a, **k):
        raise AssertionError("the node geometry re-derived a parameter")

    monkeypatch.setattr(ref, "padding2d", unavailable)
    monkeypatch.setattr(ref, "conv_out_size", unavailable)
    geoms = [ref.geometry_of("forward", fwd, [t["x"], t["w"]], t["gy"]),
             ref.geometry_of("backward_data", dgrad, [t["gy"], t["w"]], t["x"]),
             ref.geometry_of("backward_filter", wgrad, [t["x"], t["gy"]], t["w"])]
    assert geoms == [want] * 3
    got = [ref.forward(np, x, w, geoms[0]), ref.backward_data(np, gy, w, geoms[1]),
           ref.backward_filter(np, x, gy, geoms[2])]
    for a, b in zip(got, results):
        np.testing.assert_array_equal(a, b)
