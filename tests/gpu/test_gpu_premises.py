"""Premises of GPU tests checked on every machine: the graph a GPU test compiles
lowers for cuda (without a GPU: the passes only ask the rules, cuDNN declines)
to the steps the test is about, so that a change of the default fusion rules
that leaves a GPU test nothing to check fails here, not only on the device.

``test_zero_copy_pool_gpu.test_the_training_step_through_saved_pool_winners``
checks the ``pool-argmax`` rule on both max pools of an inception step; after
``pool-scan`` became a default rule it took the inception's 3x3/1 pool, and the
test failed on the H200 (2026-12-05, twenty-fifth session) for its premise,
not its numbers."""

from __future__ import annotations

import pytest

from opgraph.graph import graph_of
from opgraph.passes.base import PassContext
from opgraph.passes.pipelines import default
from opgraph.passes.policy import LoweringPolicy
from test_zero_copy_pool_gpu import pooled_inception_step


def _pool_steps(exclude) -> list[str]:
    _, _, _, outs = pooled_inception_step()
    policy = LoweringPolicy(layout="NHWC", precision="fp32", exclude=exclude)
    graph, louts = default(policy).run(graph_of(*outs), list(outs), PassContext(device="cuda", policy=policy))
    names = [v.op.op.name for v in graph.nodes_in_order(louts) if hasattr(v.op, "op")]
    return [n for n in names if "Pool" in n]


@pytest.mark.parametrize("exclude, argmax", [(["pool-scan"], 2), (["pool-scan", "pool-argmax"], 0)])
def test_the_saved_pool_winners_test_has_both_pools_as_argmax_and_take(exclude, argmax):
    kinds = _pool_steps(exclude)
    assert kinds.count("MaxPool2dArgmax") == kinds.count("MaxPool2dTake") == argmax, kinds
    assert "MaxPool2dScan" not in kinds, kinds
    if argmax:  # every pooling gradient is the gather of the saved window indices
        assert "MaxPool2dBackward" not in kinds and "MaxPool2dBackwardRelu" not in kinds, kinds
