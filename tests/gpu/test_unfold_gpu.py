"""The few-channel convolution on cuBLAS (``backends/cuda/unfold.py``) on the
GPU, on the stems of the benchmark models (OverFeat's 11x11/4, AlexNet's
11x11/4 padded, the 7x7/2 of ResNet-50, GoogLeNet and DenseNet-121, the 3x3/2
of MobileNet-v2 and EfficientNet-B0, VGG-A's 3x3/1): forward with bias and
ReLU and backward-filter against cuDNN on the same operands and the float64
reference, in bf16 and float32 (fp32 and tf32), inside a CUDA-graph replay on
new input, and with every autotune variant. Nothing is timed here (autotune
and ``opgraph-bench --profile`` measure)."""

from __future__ import annotations

import numpy as np
import pytest

from opgraph.backends.device import cuda_status

from channels_last_device import check_and_replay, forward_hw, relative_error as _err, to_device, to_host

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_status()[0], reason=f"no GPU: {cuda_status()[1]}")]

#: (x shape, output channels, kernel, stride, padding), batch 8 of the models' stems
CASES = [((8, 3, 231, 231), 96, (11, 11), (4, 4), ((0, 0), (0, 0))),
         ((8, 3, 224, 224), 64, (11, 11), (4, 4), ((2, 2), (2, 2))),
         ((8, 3, 224, 224), 64, (7, 7), (2, 2), ((3, 3), (3, 3))),
         ((8, 3, 224, 224), 32, (3, 3), (2, 2), ((1, 1), (1, 1))),
         ((8, 3, 224, 224), 64, (3, 3), (1, 1), ((1, 1), (1, 1)))]
IDS = ["overfeat", "alexnet", "7x7s2", "3x3s2", "vgg"]
#: (storage, precision, tolerance against float64: relative, Frobenius)
PAIRS = [("bfloat16", "bf16", 1e-2), ("float32", "tf32", 5e-3), ("float32", "fp32", 1e-5)]


def _operands(cp, rng, case, dtype):
    shape, o, k, s, p = case
    n, c = shape[:2]
    ho, wo = forward_hw(shape, k, s, p)
    x = to_device(cp, rng.standard_normal(shape), dtype)
    w = to_device(cp, rng.standard_normal((o, c, *k)) / np.sqrt(c * k[0] * k[1]), dtype)
    b_host = rng.standard_normal((1, o, 1, 1))
    b = to_device(cp, b_host, dtype).reshape(o)
    gy = to_device(cp, rng.standard_normal((n, o, ho, wo)), dtype)
    return x, w, b, gy, dict(stride=s, padding=p, dilation=(1, 1), groups=1)


def _check(cp, rng, run, ref, theirs, tol, changed, dtype, captured_replay):
    """``check_and_replay``, and the result stored as cuDNN stores its own (channels-last)."""
    out = check_and_replay(cp, rng, run, ref, theirs, tol, changed, dtype, captured_replay)
    assert out.shape == theirs.shape and out.strides == theirs.strides


@pytest.mark.parametrize("dtype, precision, tol", PAIRS, ids=[p[1] for p in PAIRS])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_matches_cudnn_and_the_reference_and_replays(cp, rng, case, dtype, precision, tol, captured_replay):
    from opgraph.backends.cuda import cudnn, unfold
    from opgraph.backends.reference import conv as ref_conv
    x, w, b, gy, kw = _operands(cp, rng, case, dtype)
    run = lambda: unfold.conv2d_forward(cp, x, w, b, **kw, precision=precision, activation="relu")  # noqa: E731
    b_host = to_host(cp, b.reshape(1, -1, 1, 1))
    ref = np.maximum(ref_conv.conv2d_forward(np, to_host(cp, x), to_host(cp, w), **kw) + b_host, 0)
    theirs = cudnn.conv2d(cp, x, w, b, **kw, out_shape=ref.shape, precision=precision, activation="relu")
    _check(cp, rng, run, ref, theirs, tol, x, dtype, captured_replay)


@pytest.mark.parametrize("dtype, precision, tol", PAIRS, ids=[p[1] for p in PAIRS])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_backward_filter_matches_cudnn_and_the_reference_and_replays(cp, rng, case, dtype, precision, tol,
                                                                     captured_replay):
    from opgraph.backends.cuda import cudnn, unfold
    from opgraph.backends.reference import conv as ref_conv
    x, w, _, gy, kw = _operands(cp, rng, case, dtype)
    run = lambda: unfold.conv2d_backward_filter(cp, x, gy, **kw, weight_shape=w.shape,  # noqa: E731
                                                precision=precision)
    ref = ref_conv.conv2d_backward_filter(np, to_host(cp, x), to_host(cp, gy), **kw, weight_shape=w.shape)
    theirs = cudnn.conv2d_backward_filter(cp, x, gy, **kw, weight_shape=w.shape, precision=precision)
    _check(cp, rng, run, ref, theirs, tol, gy, dtype, captured_replay)


@pytest.mark.parametrize("case", CASES[:3], ids=IDS[:3])
def test_every_variant_matches_the_reference(cp, rng, case):
    from opgraph.backends.cuda import unfold
    from opgraph.backends.reference import conv as ref_conv
    x, w, b, gy, kw = _operands(cp, rng, case, "bfloat16")
    ref_y = ref_conv.conv2d_forward(np, to_host(cp, x), to_host(cp, w), **kw) + to_host(cp, b.reshape(1, -1, 1, 1))
    ref_dw = ref_conv.conv2d_backward_filter(np, to_host(cp, x), to_host(cp, gy), **kw, weight_shape=w.shape)
    for options in unfold.variants(None, None, "cuda"):
        # each against the reference: cuBLAS may pick another kernel (another sum order) for a piece's rows
        y = to_host(cp, unfold.conv2d_forward(cp, x, w, b, **kw, precision="bf16", **options))
        assert _err(y, ref_y) < 1e-2, options
        dw = to_host(cp, unfold.conv2d_backward_filter(cp, x, gy, **kw, weight_shape=w.shape, precision="bf16",
                                                       **options))
        assert _err(dw, ref_dw) < 1e-2, options
