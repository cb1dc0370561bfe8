"""The functional builders: output shapes (SEMANTICS.md size rules, counted by
hand here) and the errors of invalid parameters, which must name the node,
the parameter and the offending value."""

import inspect

import pytest

import opgraph as og
from opgraph.errors import OpgraphError, ParameterError, ShapeError


def _net():
    g = og.Graph()
    x = g.input("x", (2, 4, 6, 6))
    w = g.param("w", (6, 4, 3, 3))
    return g, x, w


# ---- invalid parameters -------------------------------------------------------------

def _conv(**kw):
    def build():
        g, x, w = _net()
        b = g.param("b", (5,)) if kw.pop("bad_bias", False) else None
        if "weight" in kw:
            w = g.param("w2", kw.pop("weight"))
        return og.conv2d(x, w, b, name="c1", **kw)
    return build


def _pool(builder, *args, **kw):
    def build():
        g, x, w = _net()
        return builder(x, *args, name="p1", **kw)
    return build


# (builder, error type, texts the message must hold: node, parameter, value)
INVALID = {
    "conv stride 0": (_conv(stride=0), ParameterError, ["node c1", "stride=0"]),
    "conv stride (1, 0)": (_conv(stride=(1, 0)), ParameterError, ["node c1", "stride=(1, 0)"]),
    "conv negative padding": (_conv(padding=-1), ParameterError, ["node c1", "padding=", "-1"]),
    "conv negative asymmetric padding": (_conv(padding=((0, -1), (0, 0))), ParameterError,
                                         ["node c1", "padding=((0, -1), (0, 0))"]),
    "conv dilation 0": (_conv(dilation=0), ParameterError, ["node c1", "dilation=0"]),
    "conv groups 0": (_conv(groups=0), ParameterError, ["node c1", "groups=0"]),
    "conv groups not dividing": (_conv(groups=3), ShapeError,
                                 ["node c1", "groups=3", "in_channels=4", "out_channels=6"]),
    "conv weight of other groups": (_conv(weight=(6, 2, 3, 3)), ShapeError,
                                    ["node c1", "(6, 2, 3, 3)", "groups=1"]),
    "conv kernel larger than padded input": (_conv(weight=(6, 4, 9, 9), padding=1), ShapeError,
                                             ["node c1", "kernel (9, 9)", "(8, 8)"]),
    "conv dilated kernel larger than input": (_conv(dilation=4), ShapeError,
                                              ["node c1", "dilation (4, 4)", "(6, 6)"]),
    "conv bad padding string": (_conv(padding="full"), ParameterError, ["node c1", "padding='full'"]),
    "conv bias shape": (_conv(bad_bias=True), ShapeError, ["node c1", "bias shape (5,)", "(6,)"]),
    "pool padding above half kernel": (_pool(og.max_pool2d, 3, padding=2), ParameterError,
                                       ["node p1", "padding=", "2", "half the kernel"]),
    "avg pool asymmetric padding above half": (
        _pool(og.avg_pool2d, (3, 2), padding=((0, 1), (2, 0))), ParameterError,
        ["node p1", "padding=((0, 1), (2, 0))"]),
    "pool kernel larger than padded input": (_pool(og.max_pool2d, 9, padding=1, stride=1),
                                             ShapeError, ["node p1", "kernel_size (9, 9)", "(8, 8)"]),
    "pool stride 0": (_pool(og.avg_pool2d, 2, 0), ParameterError, ["node p1", "stride=0"]),
    "pool kernel 0": (_pool(og.max_pool2d, 0), ParameterError, ["node p1", "kernel_size=0"]),
    "pool bad padding string": (_pool(og.max_pool2d, 2, padding="sam"), ParameterError,
                                ["node p1", "padding='sam'"]),
    "pool ceil_mode not a bool": (_pool(og.max_pool2d, 2, ceil_mode=2), ParameterError,
                                  ["node p1", "ceil_mode=2"]),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_parameter_error_names_node_parameter_value(case):
    build, error, texts = INVALID[case]
    with pytest.raises(error) as info:
        build()
    for text in texts:
        assert text in str(info.value), f"{text!r} not in {str(info.value)!r}"


def test_parameter_error_carries_its_fields():
    with pytest.raises(ParameterError) as info:
        _conv(dilation=(1, -2))()
    e = info.value
    assert (e.node, e.param, e.value) == ("c1 (Conv2d)", "dilation", (1, -2))


def test_automatic_name_is_in_the_error():
    g, x, w = _net()
    og.conv2d(x, w)
    with pytest.raises(ParameterError, match=r"node conv2d_2 \(Conv2d\): parameter stride=0"):
        og.conv2d(x, w, stride=0)


OTHER_INVALID = [
    (lambda x: og.local_response_norm(x, 0, name="n"), ["node n", "size=0"]),
    (lambda x: og.dropout(x, 1.5, training=False, name="d"), ["node d", "p=1.5"]),
    (lambda x: og.softmax(x, 4, name="s"), ["node s", "parameter dim=4"]),
    (lambda x: og.log_softmax(x, -5, name="ls"), ["node ls", "parameter dim=-5"]),
    (lambda x: og.concat([x, x], 4, name="c4"), ["node c4", "parameter dim=4"]),
    (lambda x: og.concat([], name="c0"), ["node c0", "parameter tensors=[]"]),
    (lambda x: og.concat([x, og.max_pool2d(x, 2)], 1, name="cat"),
     ["node cat", "(2, 4, 6, 6)", "(2, 4, 3, 3)"]),
    (lambda x: og.reshape(x, (5, 5), name="r"), ["node r", "shape=(5, 5)"]),
    (lambda x: og.flatten(x, 4, name="f"), ["node f", "start_dim=4"]),
    (lambda x: og.bias_add(x, x.graph.param("b", (3,)), name="ba"), ["node ba", "(3,)"]),
    (lambda x: og.linear(og.flatten(x), x.graph.param("lw", (3, 5)), name="fc"), ["node fc", "144", "5"]),
    (lambda x: og.matmul(og.flatten(x), og.flatten(x), name="mm"), ["node mm", "144", "2"]),
    (lambda x: og.pad(x, ((0, -1), (0, 0)), name="pd"), ["node pd", "padding=((0, -1), (0, 0))"]),
]


@pytest.mark.parametrize("build, texts", OTHER_INVALID)
def test_other_builder_errors_name_the_node(build, texts):
    g, x, w = _net()
    with pytest.raises(OpgraphError) as info:
        build(x)
    for text in texts:
        assert text in str(info.value), f"{text!r} not in {str(info.value)!r}"


def test_cross_entropy_errors():
    g = og.Graph()
    logits = g.input("logits", (4, 3))
    with pytest.raises(ParameterError, match="node ce .*reduction='avg'"):
        og.cross_entropy(logits, g.input("t", (4,), "int64"), "avg", name="ce")
    with pytest.raises(ShapeError, match="node ce2 .*int64"):
        og.cross_entropy(logits, g.input("t2", (4,)), name="ce2")


# ---- 'same' padding and output sizes -------------------------------------------------------

@pytest.mark.parametrize("size, kernel, stride, dilation, pads", [
    (6, 3, 2, 1, (0, 1)),   # out 3, total (3-1)*2 + 3 - 6 = 1: the extra pixel at the end
    (7, 3, 2, 1, (1, 1)),   # out 4, total 6 + 3 - 7 = 2
    (5, 4, 1, 1, (1, 2)),   # even kernel: total 3
    (7, 3, 1, 2, (2, 2)),   # dilated: total 6 + 5 - 7 = 4
    (5, 1, 2, 1, (0, 0)),   # 1x1: never padded
    (4, 3, 3, 1, (1, 1)),   # out ceil(4/3) = 2, total 3 + 3 - 4 = 2
])
def test_conv_same_padding(size, kernel, stride, dilation, pads):
    g = og.Graph()
    x = g.input("x", (1, 2, size, size + 1))
    w = g.param("w", (3, 2, kernel, kernel))
    y = og.conv2d(x, w, stride=stride, dilation=dilation, padding="same")
    out_h = -(-size // stride)
    assert y.op.padding[0] == pads
    assert y.shape[2] == out_h and y.shape[3] == -(-(size + 1) // stride)


def test_same_padding_is_case_insensitive_and_valid_is_zero():
    g, x, w = _net()
    assert og.conv2d(x, w, stride=2, padding="SAME").op.padding == ((0, 1), (0, 1))
    assert og.conv2d(x, w, padding="valid").op.padding == ((0, 0), (0, 0))


def test_pool_same_padding():
    g, x, w = _net()
    y = og.max_pool2d(x, 3, 2, padding="same")  # in 6: out 3, total 1 -> (0, 1)
    assert y.op.padding == ((0, 1), (0, 1)) and y.shape == (2, 4, 3, 3)


@pytest.mark.parametrize("size, kernel, stride, padding, ceil_mode, out", [
    (7, 1, 2, 0, False, 4),     # 1x1 stride 2: rows 0, 2, 4, 6
    (6, 1, 2, 0, False, 3),
    (7, 2, 3, 0, False, 2),     # stride > kernel: windows at 0, 3 (6 would overrun)
    (7, 2, 3, 0, True, 3),      # ceil: window at 6 starts inside the input, kept
    (6, 2, 3, 0, True, 2),      # ceil: (6-2)/3 -> 2; window at 6 would start past the input
    (5, 3, 2, 1, True, 3),      # ceil: 1 + ceil(4/2) = 3; window at 4 starts before 5 + 1
    (6, 3, 2, 1, True, 4),      # ceil: 1 + ceil(5/2) = 4; start 6 < 6 + 1, kept
    (4, 2, 2, 1, True, 3),      # ceil: 1 + ceil(4/2) = 3; start 4 < 4 + 1, kept
])
def test_pool_output_sizes(size, kernel, stride, padding, ceil_mode, out):
    g = og.Graph()
    x = g.input("x", (1, 1, size, size))
    assert og.max_pool2d(x, kernel, stride, padding, ceil_mode).shape == (1, 1, out, out)
    assert og.avg_pool2d(x, kernel, stride, padding, ceil_mode).shape == (1, 1, out, out)


def test_pool_ceil_mode_drops_a_window_starting_in_the_padding():
    """k 2, s 2, pad 1, ceil_mode: a last window whose start (in padded
    coordinates) is at or beyond ``in + pad_begin`` is dropped."""
    g = og.Graph()
    x = g.input("x", (1, 1, 5, 6))
    # H: span 5 + 1 + 1 - 2 = 5 -> ceil(5/2) + 1 = 4; last start 3*2 = 6 >= 5 + 1 -> dropped: 3.
    # W: span 6 + 1 + 1 - 2 = 6 -> 6/2 + 1 = 4; last start 6 < 6 + 1 -> kept: 4.
    y = og.max_pool2d(x, 2, 2, 1, ceil_mode=True)
    assert y.shape == (1, 1, 3, 4)


def test_conv_output_sizes():
    g = og.Graph()
    x = g.input("x", (2, 4, 7, 2))
    # kernel larger than the input (2 wide) but not the padded input (2 + 2).
    w = g.param("w", (3, 4, 1, 3))
    y = og.conv2d(x, w, stride=(2, 1), padding=(0, 1))
    assert y.shape == (2, 3, 4, 2)
    # asymmetric padding: H 7 + 1 + 0 - 3 = 5 // 2 + 1 = 3; W 2 + 0 + 2 - 1 = 3 // 1 + 1 = 4
    w2 = g.param("w2", (6, 2, 3, 1))
    y2 = og.conv2d(x, w2, stride=(2, 1), padding=((1, 0), (0, 2)), groups=2)
    assert y2.shape == (2, 6, 3, 4)


# ---- batch size 0 ----------------------------------------------------------------------------

def test_batch_size_zero_shapes():
    g = og.Graph()
    x = g.input("x", (0, 3, 8, 8))
    w, b = g.param("w", (4, 3, 3, 3)), g.param("b", (4,))
    y = og.relu(og.conv2d(x, w, b, padding=1))
    assert y.shape == (0, 4, 8, 8)
    p = og.avg_pool2d(og.max_pool2d(y, 2), 2)
    assert p.shape == (0, 4, 2, 2)
    f = og.flatten(p)
    assert f.shape == (0, 16)
    fc = og.linear(f, g.param("fw", (10, 16)), g.param("fb", (10,)))
    assert fc.shape == (0, 10)
    assert og.concat([p, p]).shape == (0, 8, 2, 2)
    assert og.cross_entropy(fc, g.input("t", (0,), "int64")).shape == ()


# ---- torch names and defaults ------------------------------------------------------

def test_concat_takes_torch_cats_dim_with_the_channel_default():
    g = og.Graph()
    a, b = g.input("a", (2, 3, 4, 4)), g.input("b", (2, 5, 4, 4))
    assert og.concat([a, b]).shape == (2, 8, 4, 4)  # dim=1: NCHW channels (torch.cat's default is 0)
    assert og.concat((a, a), dim=0).shape == (4, 3, 4, 4)
    last = og.concat([a, a], dim=-1)
    assert last.shape == (2, 3, 4, 8) and last.op.axis == 3  # resolved against the rank
    assert list(inspect.signature(og.concat).parameters) == ["tensors", "dim", "name"]
    with pytest.raises(TypeError, match="axis"):
        og.concat([a, b], axis=1)
    with pytest.raises(ShapeError, match="node cat"):
        og.concat([a, b], dim=0, name="cat")


def test_no_builder_takes_axis():
    """Builders follow torch's names: ``dim`` (``torch.cat``, ``F.softmax``), never ``axis``."""
    import opgraph.builders as builders
    funcs = [f for f in vars(builders).values() if inspect.isfunction(f) and not f.__name__.startswith("_")
             and f.__module__.startswith("opgraph.builders")]
    assert len(funcs) > 30
    assert [f.__name__ for f in funcs if "axis" in inspect.signature(f).parameters] == []


def test_dropout_defaults_are_torch_functional_dropouts():
    F = pytest.importorskip("torch.nn.functional")
    ours, theirs = inspect.signature(og.dropout).parameters, inspect.signature(F.dropout).parameters
    assert [(ours[p].default, p) for p in ("p", "training")] == [(theirs[p].default, p) for p in ("p", "training")]
    g = og.Graph()
    x = g.input("x", (2, 3))
    assert og.dropout(x).op.training is True and og.dropout(x, training=False).op.training is False
