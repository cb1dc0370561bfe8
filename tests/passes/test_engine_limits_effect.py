"""On cuda, an ``engine_limits`` key that names nodes none of which autotune
times over cuDNN engines is noted and warned as having no effect (review: only
a key naming no node at all was; a key naming a pooling layer, a node whose
cuDNN rule a fusion rewrote away, or any node on a machine without cuDNN
changed nothing without a word). Run for cuda without a GPU, as
``test_autotune_cuda_candidates`` does."""

from __future__ import annotations

import warnings

import opgraph as og
from test_autotune_cuda_candidates import CUDNN_NODE_FUSIONS, bn_relu_step, oracle_kernels_on_cuda, tune_for_cuda

NO_EFFECT = "names no node of graph"


def _notes(tmp_path, **policy):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        steps = tune_for_cuda(bn_relu_step(), og.LoweringPolicy(
            layout="NHWC", autotune=True, cache=str(tmp_path / "c.json"), engine_limits={"bn*": 2}, **policy),
            "bfloat16")
    return steps, [str(w.message) for w in caught if NO_EFFECT in str(w.message)]


def test_a_key_naming_a_node_timed_over_cudnn_engines_is_not_noted(monkeypatch, tmp_path):
    oracle_kernels_on_cuda(monkeypatch)
    steps, said = _notes(tmp_path, exclude=CUDNN_NODE_FUSIONS)
    bn = steps["bn"][2]
    assert any(c.algorithm == "cudnn" for c in bn.candidates), bn.candidates  # the premise
    assert said == []


def test_a_key_naming_only_nodes_without_cudnn_engines_is_noted(monkeypatch, tmp_path):
    oracle_kernels_on_cuda(monkeypatch)
    steps, said = _notes(tmp_path)  # the default fusions rewrite the batch norm: no cuDNN candidate
    assert not any(c.algorithm == "cudnn" for _, _, rec in steps.values() for c in rec.candidates)
    assert said == ["policy.engine_limits key 'bn*' names no node of graph 'graph' whose cuDNN engines "
                    "autotune times (not a cuDNN node, forced, or cuDNN unavailable): no effect"], said


def test_a_scalar_engine_limit_with_no_cudnn_node_is_noted(monkeypatch, tmp_path):
    """Review: on cuda with no node timed over cuDNN engines (cuDNN missing, or every such node
    rewritten), a non-default ``engine_limit`` changed nothing and was said by no one."""
    oracle_kernels_on_cuda(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tune_for_cuda(bn_relu_step(), og.LoweringPolicy(layout="NHWC", autotune=True, engine_limit=3,
                                                        cache=str(tmp_path / "c.json")), "bfloat16")
    said = [str(w.message) for w in caught if "engine_limit=3" in str(w.message)]
    assert said == ["policy engine_limit=3: no node of graph 'graph' had cuDNN engines to time (no cuDNN "
                    "node, or cuDNN unavailable): no effect"], said
