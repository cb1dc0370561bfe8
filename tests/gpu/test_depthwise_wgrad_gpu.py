"""The depthwise backward-filter kernel (``backends/cuda/depthwise_filter.py``) on
the GPU, on MobileNet-v2's and EfficientNet-B0's shapes: against cuDNN's
backward-filter of the same operands and the float64 reference, in bf16 and
float32, inside a CUDA-graph replay on new input, and with every autotune
variant (each against the reference; each deterministic). Nothing is timed
here (autotune and ``opgraph-bench --profile`` measure)."""

from __future__ import annotations

import numpy as np
import pytest

from opgraph.backends.device import cuda_status

from channels_last_device import check_and_replay, forward_hw, to_device, to_host

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_status()[0], reason=f"no GPU: {cuda_status()[1]}")]

#: (x shape, kernel, stride, padding): EfficientNet-B0's 5x5/2 on 14 x 14 (672 channels), MobileNet-v2's
#: 3x3/1 on 56 x 56 and 3x3/2 on 112 x 112, EfficientNet-B0's 5x5/1 on 28 x 28, MobileNet-v2's last
#: 3x3/1 (7 x 7: a strip past the row's end), and 27 channels (the scalar path, V = 1)
CASES = [((32, 672, 14, 14), (5, 5), (2, 2), ((2, 2), (2, 2))),
         ((32, 144, 56, 56), (3, 3), (1, 1), ((1, 1), (1, 1))),
         ((32, 96, 112, 112), (3, 3), (2, 2), ((1, 1), (1, 1))),
         ((32, 240, 28, 28), (5, 5), (1, 1), ((2, 2), (2, 2))),
         ((32, 960, 7, 7), (3, 3), (1, 1), ((1, 1), (1, 1))),
         ((8, 27, 30, 30), (3, 3), (2, 2), ((1, 1), (1, 1)))]
IDS = ["5x5s2-672", "3x3s1-144", "3x3s2-96", "5x5s1-240", "3x3s1-7x7", "3x3s2-scalar"]


def _operands(cp, rng, case, dtype):
    shape, k, s, p = case
    n, c = shape[:2]
    ho, wo = forward_hw(shape, k, s, p)
    x_host, gy_host = rng.standard_normal(shape), rng.standard_normal((n, c, ho, wo))
    kw = dict(stride=s, padding=p, dilation=(1, 1), groups=c, weight_shape=(c, 1, *k))
    return to_device(cp, x_host, dtype), to_device(cp, gy_host, dtype), kw


TOL = {"bfloat16": 1e-2, "float32": 1e-5}


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_matches_cudnn_and_the_reference_and_replays(cp, rng, case, dtype, captured_replay):
    from opgraph.backends.cuda import cudnn, depthwise_filter
    from opgraph.backends.reference import conv as ref_conv
    x, gy, kw = _operands(cp, rng, case, dtype)
    ref = ref_conv.conv2d_backward_filter(np, to_host(cp, x), to_host(cp, gy), **kw)
    theirs = cudnn.conv2d_backward_filter(cp, x, gy, **kw)
    out = check_and_replay(cp, rng, lambda: depthwise_filter.conv2d_backward_filter(cp, x, gy, **kw), ref, theirs,
                           TOL[dtype], x, dtype, captured_replay)
    assert out.shape == theirs.shape and out.strides == theirs.strides  # cuDNN's channels-last filter


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_every_variant_matches_the_reference_and_repeats(cp, rng, case, dtype):
    """The autotune variants (``depthwise_filter.variants``: strip width, chunks) sum in
    other orders: each against the reference, each the same bits when run twice."""
    from opgraph.backends.cuda import depthwise_filter
    from opgraph.backends.reference import conv as ref_conv
    x, gy, kw = _operands(cp, rng, case, dtype)
    ref = ref_conv.conv2d_backward_filter(np, to_host(cp, x), to_host(cp, gy), **kw)
    for options in depthwise_filter.variants(None, None, "cuda"):
        got = to_host(cp, depthwise_filter.conv2d_backward_filter(cp, x, gy, **kw, **options))
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < TOL[dtype], options
        again = to_host(cp, depthwise_filter.conv2d_backward_filter(cp, x, gy, **kw, **options))
        assert np.array_equal(got, again), options
