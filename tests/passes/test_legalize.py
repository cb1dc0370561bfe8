"""The legalize pass: explicit Pad nodes, golden graphs and numeric equivalence."""

import attrs
import numpy as np
import pytest

import opgraph as og
from opgraph.backends.registry import rules_for
from opgraph.ops import Conv2d, Conv2dBackwardData, Conv2dBackwardFilter
from opgraph.passes.base import PassContext, Pipeline
from opgraph.passes.legalize import LegalizePass
from opgraph.passes.lower import LowerPass
from opgraph.passes.pipelines import REFERENCE_POLICY
from opgraph.passes.policy import LoweringPolicy
from opgraph.passes.verify import VerifyPass

from passes_stubs import install_rule

PAD = ((0, 1), (1, 0))
FFT_EXPLICIT = LoweringPolicy(prefer={"conv": ["fft"]}, explicit_padding=["fft"])


def legalize(g, outs, policy):
    ctx = PassContext(policy=policy)
    return LegalizePass()(g, outs, ctx), ctx


def forward_graph(padding=PAD):
    g = og.Graph()
    x = g.input("x", (1, 2, 6, 6))
    w = g.param("w", (3, 2, 3, 3))
    p = og.max_pool2d(og.relu(og.conv2d(x, w, padding=padding, name="conv1"), name="relu1"), 2, name="pool1")
    return g, p


GOLDEN_FORWARD = """\
%0 x = Input(float32[1, 2, 6, 6])() -> float32[1, 2, 6, 6]
%1 w = Param(float32[3, 2, 3, 3])() -> float32[3, 2, 3, 3]
%5 conv1/pad = Pad(padding=((0, 1), (1, 0)), value=0.0)(%0) -> float32[1, 2, 7, 7]
%2 conv1 = Conv2d(stride=1, padding=0, dilation=1, groups=1)(%5, %1) -> float32[1, 3, 5, 5]
%3 relu1 = Relu()(%2) -> float32[1, 3, 5, 5]
%4 pool1 = MaxPool2d(kernel_size=2, stride=2, padding=0, ceil_mode=False)(%3) -> float32[1, 3, 2, 2]"""


def test_golden_forward():
    g, p = forward_graph()
    before = g.dump()
    out, ctx = legalize(g, [p], FFT_EXPLICIT)
    assert out.dump([p]) == GOLDEN_FORWARD
    assert g.dump() == before
    assert any("conv1" in n and "Pad before" in n for n in ctx.report.notes)


def test_untouched_when_the_algorithm_pads_itself_or_there_is_no_padding():
    g, p = forward_graph()
    assert legalize(g, [p], LoweringPolicy(prefer={"conv": ["fft"]}))[0].dump() == g.dump()
    g, p = forward_graph(padding=0)
    assert legalize(g, [p], FFT_EXPLICIT)[0].dump() == g.dump()
    # explicit padding for fft, but gemm is what this node will get
    g, p = forward_graph()
    assert legalize(g, [p], LoweringPolicy(explicit_padding=["fft"]))[0].dump() == g.dump()


GOLDEN_DGRAD = """\
%0 gy = Input(float32[1, 3, 5, 5])() -> float32[1, 3, 5, 5]
%1 w = Param(float32[3, 2, 3, 3])() -> float32[3, 2, 3, 3]
%3 dx/unpadded = Conv2dBackwardData(stride=1, padding=0, dilation=1, groups=1, input_shape=(1, 2, 7, 7))(%0, %1) -> float32[1, 2, 7, 7]
%2 dx = PadBackward(padding=((0, 1), (1, 0)))(%3) -> float32[1, 2, 6, 6]"""


def test_golden_backward_data():
    g = og.Graph()
    gy, w = g.input("gy", (1, 3, 5, 5)), g.param("w", (3, 2, 3, 3))
    dx = g.apply(Conv2dBackwardData, dict(padding=PAD, input_shape=(1, 2, 6, 6)), [gy, w], name="dx")
    out, _ = legalize(g, [dx], FFT_EXPLICIT)
    assert out.dump([dx]) == GOLDEN_DGRAD


GOLDEN_WGRAD = """\
%0 x = Input(float32[1, 2, 6, 6])() -> float32[1, 2, 6, 6]
%1 gy = Input(float32[1, 3, 5, 5])() -> float32[1, 3, 5, 5]
%3 dw/pad = Pad(padding=((0, 1), (1, 0)), value=0.0)(%0) -> float32[1, 2, 7, 7]
%2 dw = Conv2dBackwardFilter(stride=1, padding=0, dilation=1, groups=1, weight_shape=(3, 2, 3, 3))(%3, %1) -> float32[3, 2, 3, 3]"""


def test_golden_backward_filter():
    g = og.Graph()
    x, gy = g.input("x", (1, 2, 6, 6)), g.input("gy", (1, 3, 5, 5))
    dw = g.apply(Conv2dBackwardFilter, dict(padding=PAD, weight_shape=(3, 2, 3, 3)), [x, gy], name="dw")
    out, _ = legalize(g, [dw], FFT_EXPLICIT)
    assert out.dump([dw]) == GOLDEN_WGRAD


CASES = [  # (x shape, w shape, conv params)
    ((2, 3, 9, 8), (4, 3, 3, 3), dict(padding=((0, 2), (1, 0)))),
    ((2, 4, 11, 10), (6, 2, 3, 2), dict(padding=((2, 1), (0, 3)), stride=2, groups=2)),
    ((1, 2, 10, 10), (3, 2, 3, 3), dict(padding=2, dilation=2, stride=(1, 3))),
    ((2, 3, 7, 7), (2, 3, 5, 5), dict(padding="same")),
]


def grads_graph(xs, ws, params):
    g = og.Graph()
    x, w = g.input("x", xs), g.param("w", ws)
    b = g.param("b", (ws[0],))
    y = og.conv2d(x, w, b, name="conv", **params)
    return g, [y, *og.grad(y, [x, w])]


def run(outs, pipeline, policy, feeds, gy):
    exe = og.compile(outs, policy=policy, pipeline=pipeline, dtype="float64")
    return exe, exe(grad_outputs={outs[0]: gy}, **feeds)


@pytest.mark.parametrize("xs, ws, params", CASES)
def test_numeric_equivalence_before_and_after(xs, ws, params):
    g, outs = grads_graph(xs, ws, params)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal(xs), "w": rng.standard_normal(ws), "b": rng.standard_normal(ws[0])}
    gy = rng.standard_normal(outs[0].shape)
    _, before = run(outs, "reference", None, feeds, gy)
    legal = Pipeline("legal-ref", [LegalizePass(), LowerPass(REFERENCE_POLICY), VerifyPass()])
    exe, after = run(outs, legal, LoweringPolicy(explicit_padding=["*"]), feeds, gy)
    assert sum(type(s.op.op).__name__ in ("Pad", "PadBackward") for s in exe.steps) == 3
    for a, b in zip(after, before):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_symmetric_only_rule_gets_the_asymmetric_excess(monkeypatch):
    for t in (Conv2d, Conv2dBackwardData, Conv2dBackwardFilter):
        install_rule(monkeypatch, t, attrs.evolve(rules_for(t)["gemm"], algorithm="sympad",
                                                  tags={"symmetric_padding_only"}))
    xs, ws, params = (2, 3, 9, 8), (4, 3, 3, 3), dict(padding=((1, 2), (3, 1)))
    g, outs = grads_graph(xs, ws, params)
    policy = LoweringPolicy(prefer={"conv": ["sympad"]})
    exe = og.compile(outs, policy=policy)
    pads = [s.op.op.padding for s in exe.steps if type(s.op.op).__name__ in ("Pad", "PadBackward")]
    assert pads == [((0, 1), (2, 0))] * 3
    convs = [s for s in exe.steps if type(s.op.op).__name__.startswith("Conv2d")]
    assert {s.op.algorithm for s in convs} == {"sympad"}
    assert {s.op.op.padding for s in convs} == {((1, 1), (1, 1))}
    rng = np.random.default_rng(2)
    feeds = {"x": rng.standard_normal(xs), "w": rng.standard_normal(ws), "b": rng.standard_normal(4)}
    gy = rng.standard_normal(outs[0].shape)
    _, ref = run(outs, "reference", None, feeds, gy)
    for a, b in zip(exe(grad_outputs={outs[0]: gy}, **feeds), ref):
        assert np.linalg.norm(a - b) <= 1e-5 * np.linalg.norm(b)


def test_needs_explicit_padding_tag_declines_in_lower_and_is_legalized(monkeypatch):
    install_rule(monkeypatch, Conv2d, attrs.evolve(rules_for(Conv2d)["gemm"], algorithm="nopad",
                                                   tags={"needs_explicit_padding"}))
    g, p = forward_graph()
    policy = LoweringPolicy(prefer={"conv_fwd": ["nopad"]})
    ctx = PassContext(policy=policy)
    LowerPass()(g, [p], ctx)
    assert "explicit padding" in ctx.report.node("conv1").declined["nopad"]
    assert ctx.report.node("conv1").algorithm == "gemm"
    exe = og.compile([p], policy=policy)
    assert exe.report.node("conv1").algorithm == "nopad"
    assert exe.report.node("conv1/pad").algorithm == "reference"


def test_force_follows_the_conv_not_the_new_nodes():
    g, outs = grads_graph((1, 2, 6, 6), (3, 2, 3, 3), dict(padding=PAD))
    dgrad = outs[1].name
    policy = LoweringPolicy(force={"conv*": "fft"}, explicit_padding=["fft"])
    exe = og.compile(outs, policy=policy)
    r = exe.report
    assert r.node("conv").algorithm == "fft" and r.node("conv").how == "forced"
    assert r.node("conv/pad").algorithm == "reference"  # 'conv*' matches it, but Pad is not forceable
    assert r.node(dgrad).algorithm == "reference"  # now the PadBackward crop
    assert r.node(f"{dgrad}/unpadded").algorithm == "fft"


def test_autotune_legalizes_when_any_candidate_needs_it():
    g, p = forward_graph()
    out, _ = legalize(g, [p], LoweringPolicy(explicit_padding=["winograd"], autotune=True))
    assert "conv1/pad" in out


def symmetric_only(rule):
    """A stand-in for a backend that takes symmetric padding only (as cuDNN's
    rules declare; it needs a GPU): ``rule`` renamed
    ``sympad``, tagged ``symmetric_padding_only``, whose kernel refuses any
    asymmetric padding, so a node legalize missed fails loudly."""
    def kernel(ctx, op, *arrays, **kw):
        (t, b), (l, r) = op.padding
        if t != b or l != r:
            raise AssertionError(f"asymmetric padding {op.padding} reached a symmetric-only kernel")
        return rule.kernel(ctx, op, *arrays, **kw)

    return attrs.evolve(rule, algorithm="sympad", kernel=kernel, tags={"symmetric_padding_only"})


@pytest.fixture
def sympad(monkeypatch):
    """``sympad`` (:func:`symmetric_only` of gemm) on every op of the conv family."""
    from opgraph.ops import of_family

    for t in of_family("conv"):
        install_rule(monkeypatch, t, symmetric_only(rules_for(t)["gemm"]))
    return LoweringPolicy(prefer={"conv": ["sympad"]})


def check_against_reference(outs, policy, feeds, gy=None):
    """Compile ``outs`` under ``policy`` and check every output against the
    float64 reference pipeline; returns the executable."""
    grads = {} if gy is None else {"grad_outputs": {outs[0]: gy}}
    exe = og.compile(outs, policy=policy, dtype="float64")
    ref = og.compile(outs, pipeline="reference", dtype="float64")
    for a, b in zip(exe(**grads, **feeds), ref(**grads, **feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    return exe


@pytest.mark.parametrize("fused", [True, False])
def test_a_symmetric_only_rule_runs_every_conv_op_of_a_training_graph(sympad, fused):
    """conv + bias + relu + pool with its gradients: the forward (fused into
    Conv2dBiasRelu after legalize when fusion is on), backward-data and
    backward-filter convolutions all get the rule, each with the asymmetric
    excess made explicit, and the values are the reference's."""
    g = og.Graph()
    x, w, b = g.input("x", (2, 3, 9, 8)), g.param("w", (4, 3, 3, 3)), g.param("b", (4,))
    relu = og.relu(og.conv2d(x, w, b, padding=((1, 2), (3, 1)), name="conv"), name="relu")
    y = og.max_pool2d(relu, 2, name="pool")
    outs = [y, *og.grad(y, [x, w, b])]
    policy = sympad if fused else attrs.evolve(sympad, exclude=["fused"])
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((2, 3, 9, 8)), "w": rng.standard_normal((4, 3, 3, 3)),
             "b": rng.standard_normal(4)}
    exe = check_against_reference(outs, policy, feeds, rng.standard_normal(y.shape))
    convs = [s for s in exe.steps if s.op.family == "conv"]
    assert {s.op.algorithm for s in convs} == {"sympad"}
    assert {s.op.op.padding for s in convs} == {((1, 1), (1, 1))}
    forward = {"Conv2dBiasRelu"} if fused else {"Conv2d"}
    assert {s.op.op.name for s in convs} == forward | {"Conv2dBackwardData", "Conv2dBackwardFilter"}
    pads = [s.op.op.padding for s in exe.steps if s.op.op.name in ("Pad", "PadBackward")]
    assert pads == [((0, 1), (2, 0))] * 3


def test_a_fused_conv_node_is_legalized_like_a_forward_one(sympad):
    """A Conv2dBiasRelu built directly (not by the fuse pass) with asymmetric
    padding: its image input is padded by the excess, as for Conv2d."""
    from opgraph.ops import Conv2dBiasRelu

    g = og.Graph()
    x, w, b = g.input("x", (1, 2, 7, 6)), g.param("w", (3, 2, 3, 2)), g.param("b", (3,))
    y = g.apply(Conv2dBiasRelu, dict(padding=((1, 2), (1, 0)), stride=(2, 1)), [x, w, b], name="cbr")
    out, _ = legalize(g, [y], sympad)
    assert out.dump([y]).splitlines()[-2:] == [
        "%4 cbr/pad = Pad(padding=((0, 1), (1, 0)), value=0.0)(%0) -> float32[1, 2, 8, 7]",
        "%3 cbr = Conv2dBiasRelu(stride=(2, 1), padding=(1, 0), dilation=1, groups=1)"
        "(%4, %1, %2) -> float32[1, 3, 4, 6]"]
    rng = np.random.default_rng(4)
    feeds = {"x": rng.standard_normal((1, 2, 7, 6)), "w": rng.standard_normal((3, 2, 3, 2)),
             "b": rng.standard_normal(3)}
    exe = check_against_reference([y], sympad, feeds)
    assert exe.report.node("cbr").algorithm == "sympad"
