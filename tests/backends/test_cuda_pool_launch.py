"""How the CUDA pooling kernels are launched, checked without a GPU.

The kernels themselves run in tests/gpu (against the reference, both
variants); here a recording stand-in replaces the compiled CuPy kernel, so
the launch plumbing is checked on NumPy arrays: the geometry passed as
arguments in declaration order, or compiled in as constants (and then not
passed), the index width chosen from the tensor sizes, and the ``cuda``
rules offering both variants to the autotuner.
"""


import numpy as np
import pytest

from opgraph import ops
from opgraph.backends.cuda import pool as cuda_pool, rules as cuda_rules
from opgraph.backends.registry import KernelContext, rules_for
from cupy_standin import cupy_replaced


class Recorder:
    """Stands in for ``cupy.ElementwiseKernel``: records each kernel built and each launch."""

    def __init__(self):
        self.calls = []

    def ElementwiseKernel(self, in_params, out_params, body, name, preamble=""):
        def kernel(*args, size):
            self.calls.append(dict(name=name, in_params=in_params, body=body, preamble=preamble,
                                   args=args, size=size))
        return kernel


@pytest.fixture
def recorder(monkeypatch):
    with cupy_replaced(monkeypatch, Recorder(), cuda_pool._compiled) as rec:
        yield rec


KW = dict(kernel_size=(3, 3), stride=(2, 2), padding=((1, 0), (1, 1)), ceil_mode=True)


def test_generic_launch_passes_the_geometry_in_declaration_order(recorder):
    x = np.zeros((2, 5, 9, 8), np.float32)
    cuda_pool.max_pool2d(np, x, **KW)
    (call,) = recorder.calls
    assert call["in_params"] == "raw T x, " + cuda_pool._GEO.replace("int64", "int32")
    assert call["name"] == "opgraph_maxpool_i32" and "typedef int IDX;" in call["preamble"]
    geo = dict(zip(cuda_pool._GEO_NAMES, call["args"][1:1 + len(cuda_pool._GEO_NAMES)]))
    # out: ceil((9 + 1 - 3) / 2) + 1 = 5 rows, ceil((8 + 2 - 3) / 2) + 1 = 5 columns
    assert geo == dict(C=5, H=9, W=8, OH=5, OW=5, A=5, B=5, cl=False, kh=3, kw=3, sh=2, sw=2,
                       pt=1, pb=0, pl=1, pr=1)
    assert call["size"] == 2 * 5 * 5 * 5


def test_specialized_launch_compiles_the_geometry_in(recorder):
    x = np.zeros((2, 5, 9, 8), np.float32)
    cuda_pool.max_pool2d_backward(np, x, np.zeros((2, 5, 5, 5), np.float32), **KW, specialize=True)
    arg_pass, gather = recorder.calls  # argmax recompute, then the gather
    for call in (arg_pass, gather):
        assert call["name"].endswith("_const_i32")
        assert "int64" not in call["in_params"] and " C" not in call["in_params"]
        assert "const IDX kh = 3;" in call["body"] and "const bool cl = false;" in call["body"]
    assert "const IDX A = 9;" in gather["body"] and "const IDX B = 8;" in gather["body"]
    assert len(gather["args"]) == 3  # gy, arg, gx: no geometry arguments


def test_channels_last_and_average_pooling_specialize_too(recorder):
    x = np.zeros((1, 4, 6, 6), np.float32)
    cl = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    cuda_pool.avg_pool2d(np, cl, kernel_size=(2, 2), stride=(2, 2), padding=((0, 0), (0, 0)),
                         ceil_mode=False, count_include_pad=True, specialize=True)
    (call,) = recorder.calls
    assert "const bool cl = true;" in call["body"] and call["args"][1] is True  # include_pad kept


def test_index_width_follows_the_largest_tensor(recorder, monkeypatch):
    monkeypatch.setattr(cuda_pool, "_INT32_LIMIT", 100)
    cuda_pool.max_pool2d(np, np.zeros((1, 1, 10, 10), np.float32), **KW)
    cuda_pool.max_pool2d(np, np.zeros((1, 1, 9, 9), np.float32), **KW)
    assert ["typedef long long IDX;" in c["preamble"] for c in recorder.calls] == [True, False]
    assert recorder.calls[0]["name"].endswith("_i64") and "int64 C" in recorder.calls[0]["in_params"]


def test_cuda_rules_offer_both_variants_and_pass_the_option(recorder):
    cuda_rules.register_rules()
    rule = rules_for(ops.MaxPool2d)["cuda"]
    op = ops.MaxPool2d(**KW)
    assert rule.variants(op, [], "cuda") == [{}, {"specialize": True}]
    x = np.zeros((1, 2, 9, 8), np.float32)
    rule.kernel(KernelContext(np, "cuda", {"specialize": True}), op, x)
    rule.kernel(KernelContext(np, "cuda", {}), op, x)
    assert [c["name"] for c in recorder.calls] == ["opgraph_maxpool_const_i32", "opgraph_maxpool_i32"]
    assert rules_for(ops.Relu)["cuda"].variants(ops.Relu(), [], "cuda") == [{}]


def test_pool_relu_backward_masks_in_the_argmax_kernel(recorder):
    x, gy = np.zeros((2, 5, 9, 8), np.float32), np.zeros((2, 5, 5, 5), np.float32)
    cuda_pool.max_pool2d_backward_relu(np, x, gy, **KW)
    cuda_pool.max_pool2d_backward(np, x, gy, **KW)
    fused_arg, fused_gather, arg, gather = recorder.calls
    # a window whose maximum fails ReLU's mask stores -1, which no input cell (>= 0) matches
    assert fused_arg["name"] == "opgraph_maxpool_arg_relu_i32"
    assert "arg[t] = best > (CT)0 ? (int)win : -1;" in fused_arg["body"]  # CT: compute type (float for bf16)
    assert arg["name"] == "opgraph_maxpool_arg_i32" and "arg[t] = (int)win;" in arg["body"]
    assert "if (arg[o] == me)" in gather["body"] and "const int me = (int)(a * W + b);" in gather["body"]
    assert fused_gather["body"] == gather["body"] and fused_gather["name"] == gather["name"]
    rule = rules_for(ops.MaxPool2dBackwardRelu)["cuda"]
    assert "fused" in rule.tags and rule.variants(ops.MaxPool2dBackwardRelu(**KW), [], "cuda") == [
        {}, {"specialize": True}]
