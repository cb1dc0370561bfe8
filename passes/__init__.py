"""Rewrite passes: layout -> legalize -> lower (policy) -> fuse -> autotune -> memory -> verify.

``opgraph.compile`` (``passes/compiler.py``) runs a named pipeline
(``passes/pipelines.py``) and returns an ``Executable`` whose ``.report`` is
the :class:`LoweringReport`. ``docs/policy.md`` describes the policy.
"""

from .base import FunctionPass, Pass, PassContext, Pipeline, graph_pass
from .policy import LoweringPolicy, PolicyError
from .report import Candidate, LoweringReport, NodeReport

__all__ = ["Pass", "FunctionPass", "graph_pass", "Pipeline", "PassContext", "LoweringPolicy",
           "PolicyError", "LoweringReport", "NodeReport", "Candidate"]
