"""Device resolution, lazy imports, cuDNN signatures and rule registration.

These run everywhere (no ``gpu`` mark): on a CPU-only machine they check the
fallback and the messages; on a GPU machine the same assertions hold with
``cuda`` available.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from opgraph.backends import device
from opgraph.errors import OpgraphError

GPU_OK, GPU_WHY = device.cuda_status()


def test_cpu_and_auto():
    cpu = device.resolve_device("cpu")
    assert cpu == "cpu" and "cpu" in cpu.reason
    auto = device.resolve_device("auto")
    assert auto == ("cuda" if GPU_OK else "cpu")
    assert auto.reason.startswith("auto: ") and GPU_WHY in auto.reason
    assert device.array_module("cpu") is np
    with pytest.raises(ValueError, match="tpu"):
        device.resolve_device("tpu")


@pytest.mark.skipif(GPU_OK, reason="a GPU is present")
def test_cuda_unavailable_message():
    with pytest.raises(device.DeviceUnavailableError) as info:
        device.resolve_device("cuda")
    assert isinstance(info.value, OpgraphError)
    assert "device 'cuda' is unavailable" in str(info.value) and "device='cpu'" in str(info.value)
    with pytest.raises(device.DeviceUnavailableError):
        device.array_module("cuda")


def test_host_round_trip():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert device.to_host(device.to_device(a, "cpu")) is a
    if GPU_OK:
        d = device.to_device(a, "cuda")
        assert device.is_device_array(d) and not device.is_device_array(a)
        np.testing.assert_array_equal(device.to_host(d), a)
        device.synchronize("cuda")


def test_versions_never_raise():
    v = device.versions()
    assert v["numpy"] == np.__version__
    assert set(v) == {"numpy", "cupy", "cuda_runtime", "cuda_driver", "cudnn_backend",
                      "cudnn_frontend", "gpu"}
    assert (v["cupy"] is not None) == GPU_OK


def test_gpu_modules_import_without_cupy():
    """Importing the GPU backend modules loads neither CuPy nor the frontend."""
    code = ("import sys, opgraph.backends.cuda.cudnn, opgraph.backends.cuda.rules, "
            "opgraph.backends.device; print('cupy' in sys.modules, 'cudnn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_signature_is_a_value():
    from opgraph.backends.cuda import cudnn
    args = ("fprop", "bias", [(2, 4, 8, 8), (6, 4, 3, 3), (1, 6, 1, 1), (2, 6, 7, 8)], "fp32",
            ((1, 0), (2, 1)), (1, 1), (1, 1))
    a, b = cudnn.signature(*args, True), cudnn.signature(*args, True)
    assert a == b and hash(a) == hash(b) and a != cudnn.signature(*args, False)
    assert a.strides[0] == (256, 1, 32, 4)           # NHWC x
    assert a.strides[2] == (6, 1, 1, 1)              # dense bias
    assert a.pre_padding == (1, 2) and a.post_padding == (0, 1)
    assert cudnn.signature(*args, False).strides[0] == (256, 64, 8, 1)
    assert cudnn._unfused(a).dims == (a.dims[0], a.dims[1], a.dims[3])
    with pytest.raises(ValueError, match="precision"):
        cudnn.signature(*args[:3], "fp8", *args[4:], False)


def test_rules_registered_and_decline_on_cpu():
    from opgraph import ops
    from opgraph.backends.cuda import rules as cuda_rules, cudnn_rules  # noqa: F401
    from opgraph.backends.registry import rules_for
    from opgraph.types import TensorType
    op = ops.Conv2d(stride=1, padding=1)
    types = (TensorType((2, 4, 8, 8)), TensorType((6, 4, 3, 3)))
    rule = rules_for(ops.Conv2d)["cudnn"]
    assert rule.devices == {"cuda"}
    assert rule.decline_reason(op, types, "cpu") == "cudnn has no cpu implementation"
    f64 = tuple(TensorType(t.shape, "float64") for t in types)
    assert "float64" in rule.decline_reason(op, f64, "cuda")
    if not GPU_OK:
        assert rule.decline_reason(op, types, "cuda").startswith("no GPU")
    for op_type in (*cuda_rules.NODE_KERNELS, *cuda_rules.CUDA_KERNELS):
        assert rules_for(op_type)["cuda"].devices == {"cuda"}
    pool = rules_for(ops.MaxPool2d)["cuda"]
    # bfloat16 is taken: stored bf16, computed in float32 inside our kernels
    assert pool.decline_reason(ops.MaxPool2d(kernel_size=2, stride=2),
                               (TensorType((1, 1, 4, 4), "bfloat16"),), "cuda") is None


def test_fused_rule_signature():
    """The fused conv + bias + ReLU op gets the bias_relu graph's signature, its
    output shape from the op's own inference."""
    from opgraph import ops
    from opgraph.backends.cuda import cudnn_rules
    from opgraph.backends.registry import rules_for
    from opgraph.types import TensorType

    op = ops.Conv2dBiasRelu(stride=2, padding=((1, 1), (0, 0)))
    types = (TensorType((2, 4, 9, 8), layout="NHWC"), TensorType((6, 4, 3, 3)), TensorType((6,)))
    sig = cudnn_rules._signature(op, types)
    assert sig.kind == "fprop" and sig.epilogue == "bias_relu" and sig.channels_last
    assert sig.dims == ((2, 4, 9, 8), (6, 4, 3, 3), (1, 6, 1, 1), (2, 6, 5, 3))
    rule = rules_for(ops.Conv2dBiasRelu)["cudnn"]
    assert "fused" in rule.tags and rule.devices == {"cuda"}
