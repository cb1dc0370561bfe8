"""Layer operators (Conv, pooling, LRN, BatchNormalization, Gemm, MatMul,
Relu, Softmax, LogSoftmax, Dropout) imported from one-node ONNX models and
compared with ``onnx.reference.ReferenceEvaluator``, attribute form by
attribute form."""

import numpy as np
import pytest

pytest.importorskip("onnx.reference")

from onnx import helper  # noqa: E402

from onnxcheck import compare, model, randn, reference, rel_error, run, single  # noqa: E402

import opgraph.onnx as oxi  # noqa: E402
from opgraph import ops  # noqa: E402


# ---- Conv -------------------------------------------------------------------
CONV_CASES = {
    "plain": dict(x=(2, 3, 7, 7), w=(4, 3, 3, 3), attrs={}),
    "bias": dict(x=(2, 3, 7, 7), w=(4, 3, 3, 3), attrs={}, bias=True),
    "asymmetric_pads_strides": dict(x=(1, 3, 9, 8), w=(4, 3, 3, 3),
                                    attrs=dict(pads=[1, 0, 2, 1], strides=[2, 1]), bias=True),
    "dilations": dict(x=(1, 2, 9, 9), w=(3, 2, 3, 2), attrs=dict(dilations=[2, 3], pads=[2, 1, 2, 1])),
    "group": dict(x=(2, 4, 6, 6), w=(6, 2, 3, 3), attrs=dict(group=2, pads=[1, 1, 1, 1]), bias=True),
    "depthwise": dict(x=(1, 4, 6, 6), w=(4, 1, 3, 3), attrs=dict(group=4, strides=[2, 2])),
    "kernel_shape_1x1_stride2": dict(x=(1, 3, 7, 7), w=(5, 3, 1, 1), attrs=dict(kernel_shape=[1, 1], strides=[2, 2])),
    "same_upper_odd": dict(x=(1, 2, 7, 7), w=(3, 2, 3, 3), attrs=dict(auto_pad="SAME_UPPER", strides=[2, 2])),
    "same_upper_even": dict(x=(1, 2, 8, 8), w=(3, 2, 3, 3), attrs=dict(auto_pad="SAME_UPPER", strides=[2, 2])),
    "same_lower_even_kernel": dict(x=(1, 2, 7, 6), w=(3, 2, 2, 2), attrs=dict(auto_pad="SAME_LOWER")),
    "same_lower_stride": dict(x=(1, 2, 8, 8), w=(3, 2, 3, 3), attrs=dict(auto_pad="SAME_LOWER", strides=[2, 2])),
    "same_upper_dilated": dict(x=(1, 2, 7, 7), w=(3, 2, 3, 3), attrs=dict(auto_pad="SAME_UPPER", dilations=[2, 2])),
    "valid": dict(x=(1, 2, 7, 6), w=(3, 2, 3, 2), attrs=dict(auto_pad="VALID", strides=[2, 2])),
    "notset_explicit": dict(x=(1, 2, 5, 5), w=(3, 2, 3, 3), attrs=dict(auto_pad="NOTSET", pads=[0, 1, 1, 0])),
}


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv(case):
    c = CONV_CASES[case]
    x, w = randn(*c["x"]), randn(*c["w"], seed=1)
    inits, names = {"w": w}, ["w"]
    if c.get("bias"):
        inits["b"], names = randn(c["w"][0], seed=2), ["w", "b"]
    compare(single("Conv", x, inits, names, **c["attrs"]), {"x": x})


def test_conv_weight_as_graph_input_and_params_named_as_initializers():
    x, w = randn(1, 2, 5, 5), randn(3, 2, 3, 3, seed=1)
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="c")
    m = model([node], {"x": x, "w": w}, ["y"])
    compare(m, {"x": x, "w": w})
    m2 = single("Conv", x, {"w": w}, ["w"])
    g, ins, _ = oxi.load(m2)
    assert [v.name for v in ins] == ["x"]
    assert [s.name for s in g.sources("param")] == ["w"]
    np.testing.assert_array_equal(g.param_values["w"], w)


# ---- pooling ------------------------------------------------------------------
POOL_CASES = {
    "k2s2": dict(kernel_shape=[2, 2], strides=[2, 2]),
    "k3s2_pads": dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    "asymmetric_pads": dict(kernel_shape=[3, 2], strides=[2, 1], pads=[0, 1, 1, 0]),
    "ceil_k3s2": dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
    "ceil_k2s2_overhang": dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
    "ceil_with_pads": dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
    "ceil_drops_window_in_padding": dict(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
    "same_upper_stride1": dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER"),
    "same_upper_stride2": dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
    "same_lower_stride1_even": dict(kernel_shape=[2, 2], auto_pad="SAME_LOWER"),
    "valid": dict(kernel_shape=[3, 2], strides=[2, 2], auto_pad="VALID"),
}


@pytest.mark.parametrize("case", POOL_CASES)
@pytest.mark.parametrize("hw", [(7, 7), (8, 6)])
def test_max_pool(case, hw):
    x = randn(2, 3, *hw)
    compare(single("MaxPool", x, **POOL_CASES[case]), {"x": x})


@pytest.mark.parametrize("case", POOL_CASES)
@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("hw", [(7, 7), (8, 6)])
def test_average_pool(case, count_include_pad, hw):
    x = randn(2, 3, *hw)
    compare(single("AveragePool", x, count_include_pad=count_include_pad, **POOL_CASES[case]), {"x": x})


def test_pool_older_opsets():
    """MaxPool 8 (no ceil_mode yet) and AveragePool 7 (count_include_pad added)."""
    x = randn(1, 2, 7, 7)
    compare(single("MaxPool", x, opset=8, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), {"x": x})
    compare(single("AveragePool", x, opset=7, kernel_shape=[3, 3], pads=[1, 0, 1, 0], count_include_pad=1),
            {"x": x})


# Cases where onnx 1.23's ReferenceEvaluator departs from the operator spec,
# checked against the reference of an equivalent model instead:
# * MaxPool with auto_pad=SAME_LOWER and stride > 1 sizes the output with
#   floor(in / s) and splits the padding the SAME_UPPER way; the spec says
#   out = ceil(in / s) with the odd pixel at the beginning. The equivalent
#   explicit pads (spec formula, worked by hand) are given.
# * ceil_mode whose overhang is 2 or more cells (stride 3) shifts the windows
#   (the reference pads half the overhang at the beginning); and MaxPool with
#   ceil_mode and unit strides returns a larger output than the spec formula.
#   The equivalents pad the end explicitly (AveragePool: count_include_pad=0,
#   so the overhang is never counted) or use floor mode where ceil changes nothing.
SPEC_EQUIVALENTS = [
    ("MaxPool", (7, 7), dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_LOWER"),
     dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),          # out 4, total 2
    ("MaxPool", (8, 8), dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_LOWER"),
     dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 0, 0])),          # out 4, total 1 -> begin
    ("MaxPool", (7, 8), dict(kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_LOWER"),
     dict(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 0, 0, 0])),          # H: total 1 -> begin; W: 0
    ("MaxPool", (7, 7), dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], ceil_mode=1),
     dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])),
    ("MaxPool", (7, 7), dict(kernel_shape=[3, 3], strides=[3, 3], ceil_mode=1),
     dict(kernel_shape=[3, 3], strides=[3, 3], pads=[0, 0, 2, 2])),          # windows 0, 3, 6
    ("AveragePool", (7, 7), dict(kernel_shape=[3, 3], strides=[3, 3], ceil_mode=1, count_include_pad=1),
     dict(kernel_shape=[3, 3], strides=[3, 3], pads=[0, 0, 2, 2], count_include_pad=0)),
    ("AveragePool", (7, 7), dict(kernel_shape=[3, 3], strides=[3, 3], ceil_mode=1, count_include_pad=0),
     dict(kernel_shape=[3, 3], strides=[3, 3], pads=[0, 0, 2, 2], count_include_pad=0)),
]


@pytest.mark.parametrize("op_type,hw,attrs,equivalent", SPEC_EQUIVALENTS)
def test_pool_spec_cases_against_equivalent_reference(op_type, hw, attrs, equivalent):
    x = randn(1, 2, *hw)
    want = reference(single(op_type, x, **equivalent), {"x": x})[0]
    got = run(single(op_type, x, **attrs), {"x": x})[0]
    assert rel_error(got, want) <= 1e-6


def test_global_average_pool():
    x = randn(2, 3, 5, 4)
    compare(single("GlobalAveragePool", x), {"x": x})


# ---- LRN, BatchNormalization, Relu ----------------------------------------------
@pytest.mark.parametrize("attrs", [dict(size=3), dict(size=5, alpha=1e-2, beta=0.5, bias=2.0),
                                   dict(size=4, alpha=0.3), dict(size=1, beta=1.0)])
def test_lrn(attrs):
    # onnx 1.23's own reference LRN is right only when N == C (it loops over
    # x.shape[0]): compare with it there, and with the spec-written LRN of
    # onnxcheck for N != C.
    x = randn(5, 5, 3, 3) * 3
    compare(single("LRN", x, **attrs), {"x": x}, spec_lrn=False)
    x = randn(2, 7, 3, 2) * 3
    compare(single("LRN", x, **attrs), {"x": x})


@pytest.mark.parametrize("opset,attrs", [(15, dict(epsilon=1e-3)), (14, dict(training_mode=0)),
                                         (9, dict(epsilon=1e-3)), (7, dict(spatial=1, momentum=0.8))])
def test_batch_normalization(opset, attrs):
    x = randn(2, 3, 4, 4)
    inits = {"s": randn(3, seed=1), "b": randn(3, seed=2), "m": randn(3, seed=3),
             "v": np.abs(randn(3, seed=4)) + 0.5}
    m = single("BatchNormalization", x, inits, ["s", "b", "m", "v"], opset=opset, y_shape=x.shape, **attrs)
    if opset >= 14:
        compare(m, {"x": x})
    else:
        # onnx 1.23's reference runs versions 7 and 9 in training mode (it keys on
        # momentum / is_test); a single-output node is the inference form, so the
        # version-15 reference with training_mode=0 is the expectation.
        eps = {"epsilon": attrs["epsilon"]} if "epsilon" in attrs else {}
        m15 = single("BatchNormalization", x, inits, ["s", "b", "m", "v"], opset=15, **eps)
        assert rel_error(run(m, {"x": x})[0], reference(m15, {"x": x})[0]) <= 1e-6
    g, _, outs = oxi.load(m)
    assert isinstance(outs[0].op, ops.BatchNorm)
    assert sorted(s.name for s in g.sources("param")) == ["b", "s"]  # running stats are constants


def test_relu():
    x = randn(2, 3, 4)
    x[0, 0, 0] = 0.0
    compare(single("Relu", x), {"x": x}, tol=0.0)


# ---- Gemm, MatMul -------------------------------------------------------------
GEMM_CASES = [
    dict(a=(3, 4), b=(5, 4), c=(5,), attrs=dict(transB=1)),                          # Linear form
    dict(a=(3, 4), b=(5, 4), c=None, attrs=dict(transB=1)),
    dict(a=(3, 4), b=(4, 5), c=(5,), attrs={}),
    dict(a=(4, 3), b=(4, 5), c=(3, 5), attrs=dict(transA=1, alpha=0.5, beta=2.0)),
    dict(a=(4, 3), b=(5, 4), c=(1, 5), attrs=dict(transA=1, transB=1, beta=-1.5)),
    dict(a=(3, 4), b=(4, 5), c=(3, 1), attrs=dict(alpha=2.0)),
    dict(a=(3, 4), b=(4, 5), c=(), attrs=dict(beta=0.25)),
    dict(a=(3, 4), b=(5, 4), c=(5,), attrs=dict(transB=1, alpha=3.0)),
]


@pytest.mark.parametrize("case,c_as_input", [(i, f) for i, c in enumerate(GEMM_CASES)
                                              for f in ((False, True) if c["c"] is not None else (False,))])
def test_gemm(case, c_as_input):
    c = GEMM_CASES[case]
    a, b = randn(*c["a"]), randn(*c["b"], seed=1)
    inits, feeds, names = {"b": b}, {"x": a}, ["b"]
    if c["c"] is not None:
        cv = randn(*c["c"], seed=2) if c["c"] else np.float32(0.7)
        names.append("c")
        if c_as_input:
            feeds["c"] = np.asarray(cv)
        else:
            inits["c"] = cv
    node = helper.make_node("Gemm", ["x", *names], ["y"], name="fc", **c["attrs"])
    compare(model([node], feeds, ["y"], inits), feeds)


def test_gemm_fc_form_is_one_linear_node():
    a, b, c = randn(3, 4), randn(5, 4, seed=1), randn(5, seed=2)
    m = single("Gemm", a, {"w": b, "c": c}, ["w", "c"], transB=1)
    g, _, outs = oxi.load(m)
    assert isinstance(outs[0].op, ops.Linear) and outs[0].name == "n0"


@pytest.mark.parametrize("a,b", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 2, 3, 4), (4, 2))])
def test_matmul(a, b):
    x, w = randn(*a), randn(*b, seed=1)
    compare(single("MatMul", x, {"w": w}, ["w"]), {"x": x})


# ---- Softmax, LogSoftmax ---------------------------------------------------------
@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [None, 1, -2, 3])
def test_softmax_opset13_single_axis(op_type, axis):
    x = randn(2, 3, 2, 4) * 4
    attrs = {} if axis is None else {"axis": axis}
    compare(single(op_type, x, opset=13, **attrs), {"x": x})


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset,axis", [(11, None), (11, 1), (11, 3), (11, -3), (11, 2), (1, None), (1, 0)])
def test_softmax_before_opset13_coerces_to_2d(op_type, opset, axis):
    """Versions 1 and 11 normalise over all axes from ``axis`` on (the input is
    coerced to 2-D); onnx 1.23's reference implements only the single-axis
    form, so the expectation is the reference of the spelled-out equivalent
    Flatten(axis) -> Softmax-13(axis=1) -> Reshape."""
    x = randn(2, 3, 2, 4) * 4
    attrs = {} if axis is None else {"axis": axis}
    k = (1 if axis is None else axis) % 4
    nodes = [helper.make_node("Flatten", ["x"], ["f"], axis=k),
             helper.make_node(op_type, ["f"], ["s"], axis=1),
             helper.make_node("Reshape", ["s", "shape"], ["y"])]
    spelled = model(nodes, {"x": x}, ["y"], {"shape": np.array(x.shape, np.int64)}, opset=13)
    want = reference(spelled, {"x": x})[0]
    got = run(single(op_type, x, opset=opset, **attrs), {"x": x})[0]
    assert rel_error(got, want) <= 1e-6


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
def test_softmax_huge_logits_are_finite():
    x = np.array([[1e30, 0.0, -1e30]], np.float32)
    compare(single("Softmax", x, axis=1), {"x": x})
    # log-softmax by log-sum-exp is exactly x - max here; the reference's
    # log(softmax) gives -inf for the underflowed entries.
    got = run(single("LogSoftmax", x, axis=1), {"x": x})[0]
    np.testing.assert_array_equal(got, np.array([[0.0, -1e30, -2e30]], np.float32))


# ---- Dropout ----------------------------------------------------------------
def test_dropout_is_identity_at_inference():
    x = randn(2, 5)
    node12 = helper.make_node("Dropout", ["x", "r", "t"], ["y"], name="d", seed=3)
    m = model([node12], {"x": x}, ["y"], {"r": np.array(0.4, np.float32), "t": np.array(False)})
    compare(m, {"x": x}, tol=0.0)
    compare(single("Dropout", x, opset=10, ratio=0.3), {"x": x}, tol=0.0)
    relu = helper.make_node("Relu", ["y"], ["z"], name="r")
    m = model([helper.make_node("Dropout", ["x"], ["y"], name="d"), relu], {"x": x}, ["z"])
    g, _, outs = oxi.load(m)
    assert not any(isinstance(v.op, ops.Dropout) for v in g.nodes_in_order(outs))
    compare(m, {"x": x})


@pytest.mark.parametrize("axis,affine", [(-1, "scale_bias"), (-1, "scale"), (1, "scale_bias"), (2, "scale_bias"),
                                         (-1, "scale_1c")])
def test_layer_normalization(axis, affine):
    """Normalised over axes ``axis ..`` (biased variance), as the opset 17 spec;
    ConvNeXt's form is axis -1 after a channels-last Transpose."""
    x = randn(2, 3, 4, 5) * 3 + 1
    shape = x.shape[axis % 4:]
    inits = {"s": randn(*shape, seed=1), "b": randn(*shape, seed=2)}
    if affine == "scale_1c":
        inits = {"s": randn(1, *shape, seed=1)}
    names = ["x", "s", "b"][:3 if affine == "scale_bias" else 2]
    node = helper.make_node("LayerNormalization", names, ["y"], axis=axis, epsilon=1e-3)
    m = model([node], {"x": x}, ["y"], {k: inits[k] for k in names[1:]})
    compare(m, {"x": x}, tol=1e-5)
    _, _, (y,) = oxi.load(m)
    assert isinstance(y.op, ops.LayerNorm) and y.op.normalized_shape == shape and y.op.eps == pytest.approx(1e-3)


def test_layer_normalization_refuses_used_statistics_and_other_stash_types():
    x = randn(2, 3)
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y", "mean"], name="ln")
    m = model([node], {"x": x}, ["y", "mean"], {"s": randn(3, seed=1)})
    with pytest.raises(oxi.OnnxImportError, match="ONNX node 'ln' \\(LayerNormalization\\): output 1 \\('mean'\\)"):
        oxi.load(m)
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y"], name="ln", stash_type=11)
    m = model([node], {"x": x}, ["y"], {"s": randn(3, seed=1)}, check=False, output_shapes={"y": (2, 3)})
    with pytest.raises(oxi.OnnxImportError, match="stash_type=11"):
        oxi.load(m)
