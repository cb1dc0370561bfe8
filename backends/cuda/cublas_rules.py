"""Registry rules of the ``cublas`` algorithm (device ``cuda``): ``Linear`` and
``MatMul`` through ``cublasGemmEx`` in the policy's precision (:mod:`.cublas`).
"""

from __future__ import annotations

from opgraph import ops

from ..reference.kernel import params_kernel
from ..registry import Rule, register
from .cublas import linear, matmul

_DTYPES = ("float32", "float16", "bfloat16")


def check(op, in_types, device):
    """cuBLAS takes 2-D float32/float16/bfloat16 operands here (float64 stays on
    the reference)."""
    bad = sorted({t.dtype for t in in_types if t.dtype not in _DTYPES})
    if bad:
        return f"the cublas rule takes {', '.join(_DTYPES)}; got {', '.join(bad)}"
    if any(t.ndim != (1 if i == 2 else 2) for i, t in enumerate(in_types)):
        return "the cublas rule takes 2-D operands (and a 1-D bias)"
    return None


def register_rules() -> None:
    """Register the ``cublas`` rules of ``Linear`` and ``MatMul`` (idempotent);
    their outputs are new arrays (``fresh_output``). In the cuda default order
    before the reference (``passes/policy.py``): capturable into CUDA graphs
    through nvmath-python, where CuPy's own product is not."""
    for op_type, fn in ((ops.Linear, linear), (ops.MatMul, matmul)):
        register(Rule(op_type, "cublas", params_kernel(fn, "cublas", ("precision",)),
                      devices={"cuda"}, check=check,
                      tags={"cublas", "gpu", "option:precision"}, fresh_output=True))


register_rules()

__all__ = ["check", "register_rules"]
