"""The four PyTorch peers on the GPU (benchmarks/peer_run.py): eager, the whole step
captured in a CUDA graph, torch.compile and both, on a real model, each checked against
the float64 reference (the converters in float64 first) before it is timed."""

from __future__ import annotations

import pytest

from opgraph.backends.device import cuda_status
from opgraph.benchmarks import check
from opgraph.benchmarks.models import build
from opgraph.benchmarks.peer_run import PEERS, run_peers
from opgraph.benchmarks.protocol import random_feeds, training_graph

GPU_OK, GPU_WHY = cuda_status()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU_OK, reason=GPU_WHY)]


@pytest.mark.slow
@pytest.mark.parametrize("dtype, precision, layout", [("float32", "fp32", "NCHW"),
                                                      ("bfloat16", "bf16", "NHWC")])
def test_every_peer_runs_checked_on_alexnet(cp, dtype, precision, layout):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("this PyTorch has no CUDA")
    model = build("alexnet", batch=4, dtype=dtype)
    feeds = {k: cp.asarray(v) for k, v in random_feeds(model, seed=2).items()}
    ref = check.Reference(training_graph(model), feeds, "cuda")
    out = run_peers(model, feeds, list(PEERS), device="cuda", precision=precision, layout=layout,
                    warmup=2, repeat=3, reference=ref)
    for name, r in out.items():
        assert r["status"] == "ok", (name, r["reason"])
        assert r["converter_check"]["passed"] and r["check"]["passed"], name
        assert r["step"]["median_ms"] > 0 and r["first_call_s"] > 0, name
    for name in ("torch+graph", "torch-compile+graph"):
        assert out[name]["times"] is None and out[name]["capture_s"] > 0
        assert out[name]["memory"]["measured_peak_bytes"] > 0
