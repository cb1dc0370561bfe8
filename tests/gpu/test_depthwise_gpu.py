"""The depthwise backward-data kernel (``backends/cuda/depthwise.py``) on the GPU,
on MobileNet-v2's and EfficientNet-B0's shapes: against cuDNN's backward-data of
the same operands and the float64 reference, in bf16 and float32, and inside a
CUDA-graph replay on new input. Nothing is timed here (autotune and
``opgraph-bench --profile`` measure)."""

from __future__ import annotations

import numpy as np
import pytest

from opgraph.backends.device import cuda_status

from channels_last_device import check_and_replay, forward_hw, to_device, to_host

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_status()[0], reason=f"no GPU: {cuda_status()[1]}")]

#: (dx shape, kernel, stride, padding): MobileNet-v2's features.2 (3x3/2), a 3x3/1, EfficientNet-B0's 5x5/2,
#: MobileNet-v2's last 3x3/1 (7 x 7: a strip past the row's end), and 27 channels (the scalar path, V = 1)
CASES = [((32, 96, 112, 112), (3, 3), (2, 2), ((1, 1), (1, 1))),
         ((32, 144, 56, 56), (3, 3), (1, 1), ((1, 1), (1, 1))),
         ((32, 240, 28, 28), (5, 5), (2, 2), ((2, 2), (2, 2))),
         ((32, 960, 7, 7), (3, 3), (1, 1), ((1, 1), (1, 1))),
         ((8, 27, 30, 30), (3, 3), (2, 2), ((1, 1), (1, 1)))]
IDS = ["3x3s2", "3x3s1", "5x5s2", "3x3s1-7x7", "3x3s2-scalar"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_matches_cudnn_and_the_reference_and_replays(cp, rng, case, dtype, captured_replay):
    from opgraph.backends.cuda import cudnn, depthwise
    from opgraph.backends.reference import conv as ref_conv
    shape, k, s, p = case
    n, c = shape[:2]
    ho, wo = forward_hw(shape, k, s, p)
    gy_host, w_host = rng.standard_normal((n, c, ho, wo)), rng.standard_normal((c, 1, *k))
    gy, wt = to_device(cp, gy_host, dtype), to_device(cp, w_host, dtype)
    kw = dict(stride=s, padding=p, dilation=(1, 1), groups=c, input_shape=shape)
    ref = ref_conv.conv2d_backward_data(np, to_host(cp, gy), to_host(cp, wt), **kw)
    theirs = cudnn.conv2d_backward_data(cp, gy, wt, **kw)
    check_and_replay(cp, rng, lambda: depthwise.conv2d_backward_data(cp, gy, wt, **kw), ref, theirs,
                     1e-2 if dtype == "bfloat16" else 1e-5, gy, dtype, captured_replay)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_every_variant_is_bit_for_bit_the_default(cp, rng, case, dtype):
    """The autotune variants (``depthwise.variants``: strip width, row tiles) sum each
    pixel's taps in the same order, so they agree bit for bit."""
    from opgraph.backends.cuda import depthwise
    shape, k, s, p = case
    n, c = shape[:2]
    ho, wo = forward_hw(shape, k, s, p)
    gy = to_device(cp, rng.standard_normal((n, c, ho, wo)), dtype)
    wt = to_device(cp, rng.standard_normal((c, 1, *k)), dtype)
    kw = dict(stride=s, padding=p, dilation=(1, 1), groups=c, input_shape=shape)
    want = to_host(cp, depthwise.conv2d_backward_data(cp, gy, wt, **kw))
    for options in depthwise.variants(None, None, "cuda")[1:]:
        assert np.array_equal(to_host(cp, depthwise.conv2d_backward_data(cp, gy, wt, **kw, **options)), want), options


#: the stride-1 forward (``depthwise_forward``): ConvNeXt-tiny's 7x7 layers (stage 1 and 4), a 3x3 and a 5x5,
#: and 27 channels (the scalar path)
FORWARD_CASES = [((32, 96, 56, 56), (7, 7), ((3, 3), (3, 3))), ((32, 768, 7, 7), (7, 7), ((3, 3), (3, 3))),
                 ((32, 144, 56, 56), (3, 3), ((1, 1), (1, 1))), ((32, 240, 28, 28), (5, 5), ((2, 2), (2, 2))),
                 ((8, 27, 30, 30), (3, 3), ((1, 1), (1, 1)))]
FORWARD_IDS = ["7x7-56", "7x7-7", "3x3", "5x5", "3x3-scalar"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("case", FORWARD_CASES, ids=FORWARD_IDS)
def test_forward_matches_cudnn_and_the_reference_and_replays(cp, rng, case, dtype, captured_replay):
    from opgraph.backends.cuda import cudnn, depthwise_forward
    from opgraph.backends.reference import conv as ref_conv
    shape, k, p = case
    c = shape[1]
    x_host, w_host, b_host = rng.standard_normal(shape), rng.standard_normal((c, 1, *k)), rng.standard_normal(c)
    x, wt = to_device(cp, x_host, dtype), to_device(cp, w_host, dtype)
    b = to_device(cp, b_host.reshape(1, c, 1, 1), dtype).reshape(c)
    kw = dict(stride=(1, 1), padding=p, dilation=(1, 1), groups=c)
    ref = ref_conv.conv2d_forward(np, to_host(cp, x), to_host(cp, wt), **kw)
    ref = ref + to_host(cp, b.reshape(1, c, 1, 1)).reshape(1, c, 1, 1)
    theirs = cudnn.conv2d(cp, x, wt, b, **kw, out_shape=ref.shape)
    check_and_replay(cp, rng, lambda: depthwise_forward.conv2d(cp, x, wt, b, **kw), ref, theirs,
                     1e-2 if dtype == "bfloat16" else 1e-5, x, dtype, captured_replay)
