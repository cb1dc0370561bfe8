"""The depthwise backward-data kernel (``backends/cuda/depthwise.py``) on the CPU,
through the g++ emulator of its CUDA text: against the float64 reference on
MobileNet-v2's and EfficientNet-B0's geometries (3x3 and 5x5, stride 1 and 2),
asymmetric padding and dilation, in every storage dtype; and the ``cuda``
rule declines what it does not take."""

from __future__ import annotations

import numpy as np
import pytest

from cuda_cpu_emulator import GXX, EmulatedCupy
from cupy_standin import cupy_replaced
from opgraph import ops
from opgraph.backends.cuda import depthwise, pool
from opgraph.backends.reference import conv as ref_conv
from opgraph.backends.registry import rules_for
from opgraph.types import TensorType, is_channels_last, numpy_dtype, to_layout

pytestmark = pytest.mark.skipif(GXX is None, reason="no g++: the kernel's CUDA text cannot run on the CPU")

#: (input (N, C, H, W), kernel, stride, padding ((top, bottom), (left, right)), dilation)
CASES = [
    ((2, 16, 9, 9), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
    ((2, 16, 10, 10), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)),   # MobileNet-v2's stride 2 (even input)
    ((1, 24, 11, 9), (5, 5), (2, 2), ((2, 2), (2, 2)), (1, 1)),    # EfficientNet-B0's 5x5 / 2
    ((1, 8, 8, 7), (3, 3), (2, 1), ((0, 1), (2, 0)), (1, 1)),      # asymmetric padding and stride
    ((1, 8, 9, 9), (3, 3), (1, 1), ((2, 2), (2, 2)), (2, 2)),      # dilation
    ((1, 8, 9, 10), (3, 2), (2, 3), ((1, 2), (0, 1)), (2, 3)),     # non-square kernel, mixed stride and dilation
    ((0, 8, 5, 5), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),      # an empty batch
    ((2, 1, 4, 4), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)),      # one channel: the layouts coincide
]
TOLERANCE = {"float32": 1e-6, "float64": 1e-12, "bfloat16": 1e-2, "float16": 2e-3}


@pytest.fixture
def emu(monkeypatch):
    with cupy_replaced(monkeypatch, EmulatedCupy(), pool._compiled) as e:
        yield e


def _forward_hw(shape, k, s, p, d):
    return tuple((n + p0 + p1 - dd * (kk - 1) - 1) // ss + 1 for n, kk, ss, (p0, p1), dd in zip(shape[2:], k, s, p, d))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-k{c[1][0]}-s{c[2]}-p{c[3]}-d{c[4]}")
def test_matches_the_float64_reference(emu, case, dtype):
    shape, k, s, p, d = case
    n, c = shape[:2]
    rng = np.random.default_rng(sum(shape) + k[0])
    gy = rng.standard_normal((n, c, *_forward_hw(shape, k, s, p, d)))
    w = rng.standard_normal((c, 1, *k))
    store = numpy_dtype(dtype)
    gy_s, w_s = to_layout(np, gy.astype(store), "NHWC"), to_layout(np, w.astype(store), "NHWC")
    out = depthwise.conv2d_backward_data(np, gy_s, w_s, stride=s, padding=p, dilation=d, groups=c, input_shape=shape)
    ref = ref_conv.conv2d_backward_data(np, gy_s.astype(np.float64), w_s.astype(np.float64), stride=s, padding=p,
                                        dilation=d, groups=c, input_shape=shape)
    assert out.shape == shape and out.dtype == store and (is_channels_last(out) or 0 in shape or shape[1] == 1)
    err = np.linalg.norm(out.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-300)
    assert err < TOLERANCE[dtype], err


def test_the_rule_declines_what_it_does_not_take():
    rule = rules_for(ops.Conv2dBackwardData)["cuda"]
    dw = ops.Conv2dBackwardData(stride=(2, 2), padding=((1, 1), (1, 1)), groups=16, input_shape=(2, 16, 10, 10))
    gy, w = TensorType((2, 16, 5, 5), "bfloat16", "NHWC"), TensorType((16, 1, 3, 3), "bfloat16", "NHWC")
    assert rule.check(dw, (gy, w), "cuda") is None
    assert "channels-last" in rule.check(dw, (TensorType((2, 16, 5, 5), "bfloat16"), w), "cuda")
    dense = ops.Conv2dBackwardData(padding=((1, 1), (1, 1)), input_shape=(2, 16, 5, 5))
    assert "not a depthwise" in rule.check(dense, (TensorType((2, 8, 5, 5), "float32", "NHWC"),
                                                   TensorType((8, 16, 3, 3))), "cuda")
    assert "one dtype" in rule.check(dw, (gy, TensorType((16, 1, 3, 3), "float32", "NHWC")), "cuda")
    far = ops.Conv2dBackwardData(padding=((0, 2 ** 32), (0, 0)), dilation=(2 ** 30, 1), groups=2,
                                 input_shape=(1, 2, 1, 3))
    assert "32-bit" in rule.check(far, (TensorType((1, 2, 1, 3), "float32", "NHWC"),
                                        TensorType((2, 1, 5, 1), "float32", "NHWC")), "cuda")
    grouped = ops.Conv2dBackwardData(padding=((1, 1), (1, 1)), groups=8, input_shape=(2, 16, 5, 5))
    assert "multiplier 1" in rule.check(grouped, (TensorType((2, 32, 5, 5), "float32", "NHWC"),
                                                  TensorType((32, 2, 3, 3))), "cuda")
