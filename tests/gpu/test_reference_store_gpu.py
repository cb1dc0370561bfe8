"""The float64 reference on the GPU with its kept values past a device budget
in host memory (benchmarks/reference_store.py): the same values as all on the
device, and the same per-node check of a lowering."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.backends.device import cuda_status
from opgraph.benchmarks import check, reference_store
from opgraph.benchmarks.models import build
from opgraph.benchmarks.protocol import random_feeds, training_graph

GPU_OK, GPU_WHY = cuda_status()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU_OK, reason=GPU_WHY)]


def test_a_reference_spilled_to_the_host_checks_as_one_kept_on_the_device(cp):
    model = build("alexnet", batch=4, dtype="bfloat16")
    tg = training_graph(model)
    feeds = {k: cp.asarray(v) for k, v in random_feeds(model, seed=3).items()}
    whole = check.Reference(tg, feeds, "cuda", device_budget=2**62)
    spilled = check.Reference(tg, feeds, "cuda", device_budget=1 << 20)
    assert whole.values.host_bytes == 0 and spilled.values.host_bytes > 0
    assert sorted(spilled.values) == sorted(whole.values)
    for n in whole.values:
        got = spilled.values[n]
        assert isinstance(got, cp.ndarray)  # read back onto the device
        np.testing.assert_array_equal(cp.asnumpy(got), cp.asnumpy(whole.values[n]))
    exe = og.compile(tg.outputs, device="cuda", dtype="bfloat16", policy={"precision": "bf16"})
    a, b = check.check_lowering(exe, whole), check.check_lowering(exe, spilled)
    assert a.passed and b.passed, (a.failures[:2], b.failures[:2])
    assert a.nodes_checked == b.nodes_checked  # cuDNN's split reductions may differ in the last bits run to run
    assert b.max_rel_error == pytest.approx(a.max_rel_error, rel=0.1)
    total = cp.cuda.runtime.memGetInfo()[1]
    assert 0 < reference_store.device_budget("cuda") <= total // 2  # room left for the peers and the column
