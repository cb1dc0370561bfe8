"""The cuDNN batch-norm graphs on the CPU: the 4-D view cuDNN gets of x, and the
frontend calls each graph kind makes, through a stand-in ``cudnn`` module whose
batch-norm builders take the frontend's own port names (``batchnorm``:
input, scale, bias, in_running_mean, in_running_var, epsilon, momentum;
``batchnorm_inference``: input, mean, inv_variance, scale, bias;
``batchnorm_backward``: grad, input, scale, mean, inv_variance), so a wrong
keyword fails here as it would there. The real graphs run in
tests/gpu/test_cudnn_batchnorm.py."""

from __future__ import annotations

import types

import pytest

from opgraph.backends.cuda import cudnn_graph as cg, cudnn_norm, cudnn_norm_graph as ng
from opgraph.errors import LoweringError, ShapeError

from cudnn_fakes import FakeGraphBase, FakeTensor


class FakeGraph(FakeGraphBase):
    """The batch-norm builders of the frontend's graph."""

    def tensor(self, name, dim, stride, data_type, is_pass_by_value=False):
        t = FakeTensor(self, name, dim=dim, stride=stride, data_type=data_type, by_value=is_pass_by_value)
        self.tensors.append(t)
        return t

    def _op(self, op, n_out, **ports):
        self.calls.append((op, {k: v.name for k, v in ports.items()}))
        return [FakeTensor(self, f"{op}:{i}") for i in range(n_out)]

    def batchnorm(self, input, scale, bias, in_running_mean=None, in_running_var=None, epsilon=None,
                  momentum=None, peer_stats=None, name="", compute_data_type=None):
        return self._op("batchnorm", 5, input=input, scale=scale, bias=bias, in_running_mean=in_running_mean,
                        in_running_var=in_running_var, epsilon=epsilon, momentum=momentum)

    def batchnorm_inference(self, input, mean, inv_variance, scale, bias, name="", compute_data_type=None):
        return self._op("batchnorm_inference", 1, input=input, mean=mean, inv_variance=inv_variance,
                        scale=scale, bias=bias)[0]

    def batchnorm_backward(self, grad, input, scale, mean, inv_variance, peer_stats=None, name="",
                           compute_data_type=None):
        return self._op("batchnorm_backward", 3, grad=grad, input=input, scale=scale, mean=mean,
                        inv_variance=inv_variance)


ENUM = types.SimpleNamespace(FLOAT="f32", HALF="f16", BFLOAT16="bf16", A=0, FALLBACK=1)


@pytest.fixture
def frontend(monkeypatch):
    """A stand-in ``cudnn`` module; the graphs it built, in order."""
    built = []

    def pygraph(**kw):
        built.append(FakeGraph(**kw))
        return built[-1]

    fake = types.SimpleNamespace(pygraph=pygraph, data_type=ENUM, heur_mode=ENUM, create_handle=lambda: "h")
    monkeypatch.setattr(cg, "cudnn_module", lambda: fake)
    monkeypatch.setattr(cg, "_HANDLES", {})
    monkeypatch.setattr(ng, "_CACHE", {})
    return built


@pytest.mark.parametrize("shape, cl, dims, strides", [
    ((2, 3, 4, 5), False, (2, 3, 4, 5), (60, 20, 5, 1)),
    ((2, 3, 4, 5), True, (2, 3, 4, 5), (60, 1, 15, 3)),
    ((8, 6), False, (8, 6, 1, 1), (6, 1, 1, 1)),             # after a linear layer
    ((2, 3, 7), False, (2, 3, 7, 1), (21, 7, 1, 1)),
    ((2, 3, 2, 3, 4), False, (2, 3, 24, 1), (72, 24, 1, 1)),  # 3-D batch norm: trailing axes merged
])
def test_geometry_is_the_4d_view_of_x(shape, cl, dims, strides):
    geo = cudnn_norm.geometry(shape, cl)
    assert (geo.dims, geo.strides, geo.channels_last) == (dims, strides, cl)


@pytest.mark.parametrize("shape, cl, match", [((5,), False, "N, C"), ((2, 3, 4), True, "channels-last")])
def test_geometry_refuses_what_cudnn_cannot_view(shape, cl, match):
    with pytest.raises(ShapeError, match=match):
        cudnn_norm.geometry(shape, cl)


@pytest.mark.parametrize("kind, call, ports", [
    ("bn_train", "batchnorm", {"input": "x", "scale": "scale", "bias": "bias", "in_running_mean": "running_mean",
                               "in_running_var": "running_var", "epsilon": "epsilon", "momentum": "momentum"}),
    ("bn_normalize", "batchnorm_inference", {"input": "x", "mean": "mean", "inv_variance": "inv_variance",
                                             "scale": "scale", "bias": "bias"}),
    ("bn_backward", "batchnorm_backward", {"grad": "dy", "input": "x", "scale": "scale", "mean": "mean",
                                           "inv_variance": "inv_variance"}),
])
@pytest.mark.parametrize("cl", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_each_kind_builds_its_cudnn_node(frontend, kind, call, ports, cl, dtype):
    geo = cudnn_norm.geometry((4, 6, 3, 5), cl)
    plan = ng.plan_for(ng.NormSignature(kind, geo.dims, geo.strides, dtype))
    (g,) = frontend
    assert g.kw["io_data_type"] == {"float32": "f32", "bfloat16": "bf16"}[dtype]
    assert g.kw["compute_data_type"] == g.kw["intermediate_data_type"] == "f32"
    assert g.calls == [(call, ports)]
    inputs, outputs = ng.OPERANDS[kind]
    assert [t.name for t in g.tensors] == list(inputs)
    for t in g.tensors + g.outputs:
        name = t.name if t in g.tensors else outputs[g.outputs.index(t)]
        if name in ng.TENSORS:  # x's dims and strides (NHWC: channel stride 1), the I/O dtype
            assert (tuple(t.attrs["dim"]), tuple(t.attrs["stride"])) == (geo.dims, geo.strides)
            assert t.attrs["data_type"] == g.kw["io_data_type"]
        elif name in ng.SCALARS:  # epsilon, momentum: float32 host scalars, bound per call
            assert t.attrs["by_value"] and t.attrs["dim"] == [1, 1, 1, 1]
        else:  # per-channel float32 (1, C, 1, 1)
            assert (t.attrs["dim"], t.attrs["stride"], t.attrs["data_type"]) == ([1, 6, 1, 1], [6, 1, 6, 6], "f32")
    assert len(g.outputs) == len(outputs)
    assert len(plan.uids) == len(inputs) + len(outputs)
    assert plan.engines() == [0] and plan.ensure(0) == 64
    assert ng.plan_for(plan.sig) is plan  # built once


def test_unknown_kind_or_dtype_is_refused_with_the_reason(frontend):
    geo = cudnn_norm.geometry((4, 6), False)
    with pytest.raises(LoweringError, match="unknown batch-norm graph kind 'bn_foo'"):
        ng.plan_for(ng.NormSignature("bn_foo", geo.dims, geo.strides, "float32"))
    with pytest.raises(LoweringError, match="takes .*float64"):
        ng.plan_for(ng.NormSignature("bn_train", geo.dims, geo.strides, "float64"))


def test_a_graph_cudnn_rejects_is_a_lowering_error(frontend, monkeypatch):
    def reject(self):
        raise RuntimeError("cudnnGraphNotSupportedError: no engine")
    monkeypatch.setattr(FakeGraph, "validate", reject)
    geo = cudnn_norm.geometry((4, 6, 2, 2), True)
    with pytest.raises(LoweringError, match="cuDNN rejects bn_backward .*no engine"):
        ng.plan_for(ng.NormSignature("bn_backward", geo.dims, geo.strides, "float16"))


# ----------------------------------------------------------------- the rules on the stand-in

@pytest.fixture
def gpu_like(frontend, monkeypatch):
    """The rules' environment as on a GPU machine: a device, an importable frontend."""
    import sys

    from opgraph.backends.cuda import cudnn_norm_rules as rules, cudnn_rules
    monkeypatch.setattr(cudnn_rules, "cuda_status", lambda: (True, ""))
    monkeypatch.setattr(rules, "_device", lambda: 0)
    monkeypatch.setitem(sys.modules, "cudnn", types.ModuleType("cudnn"))
    return rules


def test_rules_accept_list_engines_and_count_scratch(gpu_like):
    from opgraph import ops
    from opgraph.types import TensorType as T
    x, stats, w = T((4, 6, 3, 5), "bfloat16", layout="NHWC"), T((2, 6), "float32"), T((6,), "bfloat16")
    for op, types_ in [(ops.BatchNormTraining(), (x, stats, w, w)),
                       (ops.BatchNormTrainingBackwardData(), (x, x, stats, w)),
                       (ops.BatchNormTrainingBackwardScale(), (x, stats, x))]:
        assert gpu_like.check(op, types_, "cuda") is None
        assert gpu_like.variants(op, types_, "cuda") == [{"engine": 0}]
        dropped_dx = 2 * 4 * 6 * 3 * 5 if isinstance(op, ops.BatchNormTrainingBackwardScale) else 0
        assert gpu_like.workspace(op, types_, {"engine": 0}) == 64 + 8 * 4 * 6 + dropped_dx


def test_rules_decline_with_cudnn_s_reason(gpu_like, monkeypatch):
    from opgraph import ops
    from opgraph.types import TensorType as T
    monkeypatch.setattr(FakeGraph, "validate", lambda self: (_ for _ in ()).throw(RuntimeError("bad strides")))
    x = T((4, 6, 3, 5), "float16")
    why = gpu_like.check(ops.BatchNormTraining(), (x, T((2, 6), "float32")), "cuda")
    assert why.startswith("cuDNN rejects bn_normalize") and "bad strides" in why
