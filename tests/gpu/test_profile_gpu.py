"""``opgraph-bench --profile`` on the GPU (benchmarks/profile.py, step_clock.py):
the limits are measured on the device; every step of AlexNet is timed as a
CUDA-graph replay of that step alone, and those times sum to about the whole
step replayed as CUDA graphs (an eager per-step timing sums to several times
it at a small batch: Python dispatch); each step's replay is dropped before
the next is built and the values are left as they were; each row's fraction
of its limit is a plausible number (never above the limit by more than the
timing noise of a tiny kernel)."""

from __future__ import annotations

import json
import weakref

import attrs
import numpy as np
import pytest

import opgraph as og
from opgraph.backends.copy_bandwidth import measure_copy_bandwidth
from opgraph.backends.cuda.cublas import capture_requirement
from opgraph.backends.device import cuda_status
from opgraph.benchmarks import cli, profile as pf
from opgraph.benchmarks.models import build
from opgraph.benchmarks.protocol import random_feeds, training_graph
from opgraph.benchmarks.step_clock import GraphClock
from opgraph.benchmarks.timer import make_timer
from opgraph.executable import run_step
from opgraph.graph_replay import GraphReplay, capture_stream

GPU_OK, GPU_WHY = cuda_status()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU_OK, reason=GPU_WHY)]
NVMATH = capture_requirement()  # without nvmath-python, the classifier's cuBLAS products cannot be captured
needs_nvmath = pytest.mark.skipif(NVMATH is not None, reason=str(NVMATH))


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
    assert rec["timing"]["clock"] == "graph" and rec["graph_step_ms"] > 0


@pytest.fixture(scope="module")
def alexnet_profile(cp):
    """AlexNet's training step at batch 2 (tiny kernels: Python dispatch
    would dominate an eager timing), profiled on the GPU."""
    model = build("alexnet", batch=2)
    feeds = {k: cp.asarray(v) for k, v in random_feeds(model).items()}
    return pf.profile_steps(training_graph(model), feeds, "cuda", og.LoweringPolicy(), make_timer("cuda"),
                            warmup=2, repeat=5)


@needs_nvmath
def test_every_alexnet_step_is_graph_timed(alexnet_profile):
    prof = alexnet_profile
    eager = {n["name"]: n["eager_reason"] for n in prof["nodes"] if n["timed"] != "graph"}
    assert not eager, eager
    assert prof["timing"]["graph_steps"] == len(prof["nodes"]) and prof["timing"]["eager_steps"] == 0
    assert all(n["ms"] > 0 and 1 <= n["graph_calls"] <= 64 for n in prof["nodes"])
    assert prof["graph_step_capture"]["eager_steps"] == 0


def test_graph_timed_steps_sum_to_about_the_whole_step_as_a_graph(alexnet_profile):
    prof = alexnet_profile
    # each step alone misses the gaps between kernels and may find its inputs in L2: a bit under
    # the whole graph; timed from Python, AlexNet's 48 steps at batch 2 sum to several times it
    ratio = prof["nodes_ms"] / prof["graph_step_ms"]
    assert 0.5 < ratio < 2.0, (prof["nodes_ms"], prof["graph_step_ms"], prof["step_ms"], prof["timing"])


def test_each_step_replay_is_dropped_before_the_next_and_the_values_stay(cp):
    model = build("alexnet", batch=2)
    exe = og.compile(training_graph(model).outputs, device="cuda")
    slots = exe.feed({k: cp.asarray(v) for k, v in random_feeds(model).items()})
    steps = [attrs.evolve(st, free=(), inplace=None) for st in exe.steps]
    for st in steps:
        slots[st.node] = run_step(st, slots)
    before = dict(slots)
    values = {st.node: cp.asnumpy(slots[st.node]) for st in steps}
    built = []

    def recording(*args):
        assert all(ref() is None for ref in built), "a previous step's replay (and its pools) is alive"
        replay = GraphReplay(*args)
        built.append(weakref.ref(replay))
        return replay

    clock = GraphClock(make_timer("cuda"), capture_stream(), replay=recording)
    timed = [clock.step(st, slots, warmup=1, repeat=2) for st in steps]
    assert len(built) >= len(steps) and all(ref() is None for ref in built)
    assert all(slots[n] is before[n] for n in before)
    for st, t in zip(steps, timed):  # deterministic kernels recompute the same values; any garbage fails
        np.testing.assert_allclose(cp.asnumpy(slots[st.node]), values[st.node], rtol=1e-3, atol=1e-5,
                                   err_msg=f"{st.name} ({t.timed})")
