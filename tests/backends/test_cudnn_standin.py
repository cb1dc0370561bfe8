"""The cuDNN graphs of the fused convolutions, on the CPU: the signature each
rule builds, the frontend calls each epilogue becomes (a stand-in of the
``cudnn`` module whose pointwise methods take the frontend's own parameter
names: ``python/pygraph/pointwise.cpp`` of NVIDIA/cudnn-frontend), and the
fallback to the unfused graph. The real graphs run in tests/gpu/test_cudnn_fusion.py."""

from __future__ import annotations

import re
import types

import pytest

from opgraph import ops
from opgraph.backends.cuda import cudnn, cudnn_graph as cg, cudnn_rules
from opgraph.backends.registry import rules_for
from opgraph.errors import LoweringError
from opgraph.types import TensorType as T

from cudnn_fakes import FakeGraphBase, FakeTensor

P = dict(stride=1, padding=1, dilation=1, groups=1)


class FakeGraph(FakeGraphBase):
    """Records ``(op, inputs, parameters)``; each pointwise method has the
    frontend's signature, so a wrong keyword fails here as it would there."""

    def tensor(self, name, dim, stride, data_type):
        t = FakeTensor(self, name, dim=dim, stride=stride)
        self.tensors.append(t)
        return t

    def _op(self, op, *inputs, **params):
        self.calls.append((op, tuple(t.name for t in inputs), params))
        return FakeTensor(self, op)

    def conv_fprop(self, image, weight, **kw):
        return self._op("conv_fprop", image, weight)

    def conv_dgrad(self, loss, filter, **kw):
        return self._op("conv_dgrad", loss, filter)

    def conv_wgrad(self, image, loss, **kw):
        return self._op("conv_wgrad", image, loss)

    def bias(self, input, bias, compute_data_type=None, name=""):
        return self._op("bias", input, bias)

    def add(self, a, b, compute_data_type=None, name=""):
        return self._op("add", a, b)

    def relu(self, input, negative_slope=None, lower_clip=None, upper_clip=None, compute_data_type=None,
             name=""):
        return self._op("relu", input, lower_clip=lower_clip, upper_clip=upper_clip)

    def relu_backward(self, loss, input, negative_slope=None, lower_clip=None, upper_clip=None,
                      compute_data_type=None, name=""):
        return self._op("relu_backward", loss, input, lower_clip=lower_clip, upper_clip=upper_clip)


@pytest.fixture
def frontend(monkeypatch):
    """A stand-in ``cudnn`` module; the graphs it built, by signature."""
    built = {}

    def pygraph(**kw):
        g = FakeGraph(**kw)
        built[len(built)] = g
        return g

    enum = types.SimpleNamespace(FLOAT=0, HALF=1, BFLOAT16=2, A=0, FALLBACK=1, DOWN_CONVERT_INPUTS=0,
                                 TENSOR_CORE=1)
    fake = types.SimpleNamespace(pygraph=pygraph, data_type=enum, numerical_note=enum, heur_mode=enum,
                                 create_handle=lambda: "handle")
    monkeypatch.setattr(cg, "cudnn_module", lambda: fake)
    monkeypatch.setattr(cg, "_CACHE", {})
    monkeypatch.setattr(cg, "_HANDLES", {})
    monkeypatch.setattr(cudnn, "_ROUTES", {})
    return built


def _graph(frontend, sig):
    cg.plan_for(sig, need_default=False)
    return frontend[len(frontend) - 1]


NHWC = "NHWC"
X, W, B = T((2, 4, 8, 8), layout=NHWC), T((6, 4, 3, 3), layout=NHWC), T((6,))
Y = T((2, 6, 8, 8), layout=NHWC)


@pytest.mark.parametrize("op, inputs, epilogue, calls", [
    (ops.Conv2d(**P), (X, W), "none", [("conv_fprop", ("x", "w"), {})]),
    (ops.Conv2d(**P), (X, W, B), "bias", [("conv_fprop", ("x", "w"), {}), ("bias", ("conv_fprop", "b"), {})]),
    (ops.Conv2dBiasRelu(**P), (X, W, B), "bias_relu",
     [("conv_fprop", ("x", "w"), {}), ("bias", ("conv_fprop", "b"), {}),
      ("relu", ("bias",), {"lower_clip": None, "upper_clip": None})]),
    (ops.Conv2dBiasActivation(**P, activation="relu6", residual=True), (X, W, B, Y), "bias_add_relu6",
     [("conv_fprop", ("x", "w"), {}), ("bias", ("conv_fprop", "b"), {}), ("add", ("bias", "r"), {}),
      ("relu", ("add",), {"lower_clip": 0.0, "upper_clip": 6.0})]),
    (ops.Conv2dBiasActivation(**P, activation="none", residual=True), (X, W, B, Y), "bias_add",
     [("conv_fprop", ("x", "w"), {}), ("bias", ("conv_fprop", "b"), {}), ("add", ("bias", "r"), {})]),
    (ops.Conv2dBackwardDataRelu(**P, input_shape=(2, 4, 8, 8)), (Y, W, X), "drelu",
     [("conv_dgrad", ("dy", "w"), {}),
      ("relu_backward", ("conv_dgrad", "y"), {"lower_clip": None, "upper_clip": None})]),
])
def test_each_op_builds_its_epilogue_into_one_graph(frontend, op, inputs, epilogue, calls):
    sig = cudnn_rules._signature(op, inputs)
    assert sig.epilogue == epilogue and sig.channels_last
    g = _graph(frontend, sig)
    assert g.calls == calls
    # operands in signature order, each with its dims and strides; the bias dense, the rest NHWC
    names = [t.name for t in g.tensors]
    assert len(names) == len(sig.dims) - 1 and names[:2] == list(cg.OPERANDS[sig.kind][:2])
    for t, dims, strides in zip(g.tensors, sig.dims, sig.strides):
        assert (tuple(t.attrs["dim"]), tuple(t.attrs["stride"])) == (dims, strides)
        if t.name == "b":
            assert strides == (6, 1, 1, 1)
        else:
            assert strides[1] == 1  # channels-last
    assert tuple(g.output.attrs["dim"]) == sig.dims[-1] == op.infer(*inputs).shape


def test_a_step_the_operation_does_not_take_is_refused(frontend):
    sig = cudnn.signature("wgrad", "drelu", [(2, 4, 8, 8), (2, 6, 8, 8), (2, 4, 8, 8), (6, 4, 3, 3)],
                          "fp32", ((1, 1), (1, 1)), (1, 1), (1, 1), False)
    with pytest.raises(LoweringError, match="wgrad takes the epilogue steps"):
        cg.plan_for(sig, need_default=False)


def test_route_falls_back_to_the_unfused_graph(frontend, monkeypatch):
    """No engine for the fused graph: the plain convolution's graph, the
    epilogue left to CuPy (``reference.conv_epilogue``)."""
    real = cg.plan_for

    def plan_for(sig, need_default=True):
        if sig.epilogue != "none":
            raise LoweringError("no engine fuses it")
        return real(sig, need_default=False)

    monkeypatch.setattr(cg, "plan_for", plan_for)
    op = ops.Conv2dBiasActivation(**P, activation="relu6", residual=True)
    sig = cudnn_rules._signature(op, (X, W, B, Y))
    plan, left = cudnn.route(sig)
    assert left == "bias_add_relu6"
    assert plan.sig.epilogue == "none" and plan.sig.dims == (sig.dims[0], sig.dims[1], sig.dims[-1])
    assert cudnn.route(sig)[0] is plan  # remembered
    monkeypatch.setattr(cg, "plan_for", lambda sig, need_default=True: (_ for _ in ()).throw(
        LoweringError(f"rejects {sig.epilogue}")))
    monkeypatch.setattr(cudnn, "_ROUTES", {})
    with pytest.raises(LoweringError, match=re.escape("in any form: rejects bias_add_relu6 | rejects none")):
        cudnn.route(sig)


def test_asymmetric_padding_is_the_legalize_pass_s(frontend):
    """The rules declare it; the kernels refuse it (they never pad on their own)."""
    for op_type in ops.of_family("conv"):
        assert "symmetric_padding_only" in rules_for(op_type)["cudnn"].tags
    with pytest.raises(LoweringError, match="asymmetric"):
        cudnn._require_symmetric("fprop", ((1, 0), (1, 1)))
    cudnn._require_symmetric("fprop", ((2, 2), (0, 0)))


def test_a_strided_output_view_is_the_graph_s_output_tensor(frontend):
    """A producer of a zero-copy concat: the output tensor takes the view's
    strides (a 6-channel slice of a 16-channel NHWC buffer), the inputs keep theirs."""
    buffer_channels = 16
    out_strides = (8 * 8 * buffer_channels, 1, 8 * buffer_channels, buffer_channels)
    sig = cudnn.signature("fprop", "bias_relu", [X.shape, W.shape, (1, 6, 1, 1), Y.shape], "bf16",
                          ((1, 1), (1, 1)), (1, 1), (1, 1), True, out_strides=out_strides)
    dense = cudnn.signature("fprop", "bias_relu", [X.shape, W.shape, (1, 6, 1, 1), Y.shape], "bf16",
                            ((1, 1), (1, 1)), (1, 1), (1, 1), True)
    assert sig.strides[:-1] == dense.strides[:-1] and sig.strides[-1] == out_strides != dense.strides[-1]
    g = _graph(frontend, sig)
    assert tuple(g.output.attrs["stride"]) == out_strides
    forward = [rules_for(t)["cudnn"].writes_strided_out for t in ops.of_family("conv", "fwd")]
    others = [rules_for(t)["cudnn"].writes_strided_out for t in ops.of_family("conv")
              if t.direction != "fwd"]
    assert forward and all(forward) and others and not any(others)
    # only NHWC outputs (fp32 NCHW slices ran 2.6x slower on the H200): NCHW ones are copied in
    assert all(rules_for(t)["cudnn"].writes_strided("NHWC") and not rules_for(t)["cudnn"].writes_strided("NCHW")
               for t in ops.of_family("conv", "fwd"))
