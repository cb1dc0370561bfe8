"""``timer.replayed_ms_per_call`` (the kernel benchmarks' clock) refuses a capture of no call
before it needs CuPy; its GPU behaviour is checked in tests/gpu/test_cuda_graph.py."""

import pytest

from opgraph.benchmarks import timer


@pytest.mark.parametrize("calls", [0, -3])
def test_no_calls_is_refused_before_any_gpu_work(calls):
    ran = []
    with pytest.raises(ValueError, match=f"calls={calls}: must be >= 1"):
        timer.replayed_ms_per_call(lambda: ran.append(1), calls)
    assert ran == []
