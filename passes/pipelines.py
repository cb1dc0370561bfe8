"""Named pass pipelines: explicit lists, one comment per step.

``opgraph.compile(..., pipeline=NAME)`` builds one of these for its policy;
a ``Pipeline`` object may be passed instead for a custom list.
"""

from __future__ import annotations

from typing import Callable

from .autotune import AutotunePass
from .base import Pipeline
from .fuse import FusePass
from .layout import LayoutPass
from .legalize import LegalizePass
from .lower import LowerPass
from .memory import MemoryPass
from .policy import LoweringPolicy
from .verify import VerifyPass

#: Everything to the oracle: ``reference`` for every op, ``direct`` for convolutions
#: (the conv rules register both names; either is the same code).
REFERENCE_POLICY = LoweringPolicy(prefer={"*": ["reference", "direct"]})


def default(policy: LoweringPolicy) -> Pipeline:
    """The pipeline ``og.compile`` runs unless told otherwise."""
    return Pipeline("default", [
        # physical layout of 4-D values (NHWC on cuda when asked); first, so that
        # every rule's check sees the layout the node will run in: a rule that
        # takes NHWC only (unfold) is a candidate of legalize and lower too (under
        # a workspace limit it may be the only one left), and autotune times
        # candidates in the layout they will run in
        LayoutPass(),
        # explicit Pad nodes where the algorithm the node will get cannot pad
        # (must run before lower: it changes which ops exist); they keep the layout
        LegalizePass(),
        # every abstract node -> Lowered(op, algorithm): policy order, declines kept
        LowerPass(),
        # the fusion rule table, in order: conv + bias (+ residual add) + ReLU/ReLU6
        # -> one fused convolution node, backward-data + ReLU gradient -> one node,
        # the gradient through a pooled ReLU -> one MaxPool2dBackwardRelu node,
        # a batch norm's three gradients share one pass of per-channel sums,
        # gradient sums -> one n-ary sum, element-wise chains -> one generated
        # kernel, where the algorithm has a fused kernel; after layout (the
        # generator plans in the stored layout), before autotune, which times
        # and checks the fused candidates
        FusePass(),
        # re-choose by timing checked candidates (the meta-optimizer), cached
        *([AutotunePass()] if policy.autotune else []),
        # zero-copy concats and slices (producers write into their slice of
        # the concat's buffer, slices are views), in-place steps, and the
        # liveness plan of the schedule: planned peak bytes in the report
        MemoryPass(),
        # nothing abstract or unregistered left among the outputs' ancestors
        VerifyPass(),
    ])


def reference(policy: LoweringPolicy) -> Pipeline:
    """Every node on the float64-capable oracle kernels (the check baseline)."""
    return Pipeline("reference", [
        # the oracle for every node; the user's policy is ignored on purpose
        LowerPass(REFERENCE_POLICY),
        # in-place steps only: the oracle keeps every concat and slice a copy
        MemoryPass(zero_copy=False),
        VerifyPass(),
    ])


PIPELINES: dict[str, Callable[[LoweringPolicy], Pipeline]] = {"default": default, "reference": reference}


def build(name: str, policy: LoweringPolicy) -> Pipeline:
    """The pipeline called ``name`` for ``policy``.

    Raises:
        ParameterError: unknown name (lists the known ones, and the close ones).
    """
    from opgraph.errors import ParameterError, did_you_mean

    if not isinstance(name, str) or name not in PIPELINES:
        raise ParameterError("pipeline", name, f"must be a Pipeline or one of {', '.join(map(repr, sorted(PIPELINES)))}"
                                               f"{did_you_mean(name, PIPELINES)}")
    return PIPELINES[name](policy)


__all__ = ["PIPELINES", "build", "default", "reference", "REFERENCE_POLICY"]
