"""``opgraph-bench --profile`` on the GPU (benchmarks/profile.py): the limits are
measured on the device, every step is timed with CUDA events, and each row's
fraction of its limit is a plausible number (never above the limit by more
than the timing noise of a tiny kernel)."""

from __future__ import annotations

import json

import pytest

from opgraph.backends.copy_bandwidth import measure_copy_bandwidth
from opgraph.backends.device import cuda_status
from opgraph.benchmarks import cli

GPU_OK, GPU_WHY = cuda_status()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU_OK, reason=GPU_WHY)]


def test_the_device_copy_bandwidth_is_measured():
    got = measure_copy_bandwidth("cuda", nbytes=1 << 28, repeat=5)
    assert got["gbps"] > 100 and "CUDA events" in got["method"]  # any datacenter GPU copies faster


def test_a_bf16_nhwc_profile_of_alexnet(tmp_path):
    out = tmp_path / "profile.json"
    assert cli.main(["--profile", "--model", "alexnet", "--batch", "16", "--dtype", "bfloat16",
                     "--precision", "bf16", "--layout", "nhwc", "--lowering", "cudnn", "--warmup", "2",
                     "--repeat", "5", "--json", str(out), "--quiet"]) == 0
    doc = json.loads(out.read_text())
    (rec,) = doc["models"]
    assert doc["limits"]["copy"]["gbps"] > 100 and doc["limits"]["matmul"]["bf16"]["tflops"] > 10
    assert rec["dtype"] == "bfloat16" and rec["layout"] == "NHWC"
    convs = [r for r in rec["by_op"] if r["kind"] == "compute"]
    assert convs and all(0 < r["fraction"] < 1.2 for r in convs), convs
    assert {r["direction"] for r in convs} >= {"fprop", "dgrad", "wgrad"}
