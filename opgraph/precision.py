"""The precision vocabulary: what a policy's ``precision`` may name, and what it means.

A precision says how a compute-bound kernel (a convolution, a matrix product)
multiplies; storage is the graph's dtype, a separate choice. Each precision
has an operand (I/O) dtype, the type the kernel's operands are rounded to
before the multiplies, and a compute (accumulation) dtype:

=========  ==========  ===========  ================================================
precision  operands    accumulates  notes
=========  ==========  ===========  ================================================
fp32       float32     float32      no TF32 (cuDNN/cuBLAS tensor-core paths off)
tf32       float32     float32      multiplies on TF32 (10-bit mantissa) tensor cores
bf16       bfloat16    float32      operands rounded to nearest even
fp16       float16     float32
=========  ==========  ===========  ================================================

Sources: SEMANTICS.md, "Numbers" (half precision accumulates in fp32); the
cuDNN frontend's and cuBLAS's ``COMPUTE_32F`` / ``COMPUTE_32F_FAST_TF32``.

The policy's precision is resolved once per node (:func:`resolve`, called by
the lower pass's survey, ``passes/candidates.py``) and always handed to the
kernels that take one (rule tag ``option:precision``): a kernel never guesses
what an absent precision means. The one rule that is not "as asked":
``'fp32'`` (the policy's default) on half storage (float16, bfloat16) is the
storage's own precision (:data:`DEFAULT_PRECISION`), because fp32 operands
would only be the half values widened: the products are the same (exact in
fp32) and every precision accumulates in fp32, so it would cost a cast of
every operand and the half-precision engines, and change no value beyond
summation order. Any other precision is what the node gets, whatever its
storage (``tf32`` on bfloat16 storage computes TF32 products of the widened
values; ``fp16`` on float32 storage rounds the operands to float16).
"""

from __future__ import annotations

from .errors import ParameterError, did_you_mean
from .types import HALF_DTYPES

#: Precision names, in the order the CLI and docs list them.
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
#: precision -> the dtype its operands are rounded to (the kernels' I/O type).
IO_DTYPE = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}
#: precision -> the dtype it accumulates in.
COMPUTE_DTYPE = dict.fromkeys(PRECISIONS, "float32")
#: storage dtype -> its default precision, the one whose operands are the
#: storage itself (float64 has none: no precision-taking rule runs it).
DEFAULT_PRECISION = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def check(value, what: str = "precision") -> str:
    """``value`` if it is one of :data:`PRECISIONS`.

    Raises:
        ParameterError: any other value, naming ``what`` and the choices.
    """
    if value not in PRECISIONS:
        raise ParameterError(what, value,
                             f"must be one of {', '.join(PRECISIONS)}{did_you_mean(value, PRECISIONS)}")
    return value


def resolve(precision: str, storage: str | None) -> str:
    """The precision a node runs in: the policy's ``precision``, except that
    ``'fp32'`` on half storage is the storage's own (module docstring).

    Args:
        precision: one of :data:`PRECISIONS` (the policy's).
        storage: the node's floating storage dtype name as it runs
            (``compile(dtype=...)`` applied), or None when it has none.

    Raises:
        ParameterError: ``precision`` is not one of :data:`PRECISIONS`.
    """
    check(precision)
    if precision == "fp32" and storage in HALF_DTYPES:
        return DEFAULT_PRECISION[storage]
    return precision


def unapplied_note(precision: str, applied, storage: str, device: str | None = None) -> str | None:
    """The note for a ``precision`` that no kernel of a compiled graph took, or
    None: ``fp32`` (the default, and on half storage the storage's own), or a
    precision some step took. Only the rules tagged ``option:precision``
    take one (cuDNN's, cuBLAS's, ``unfold``); the CPU has none, so there
    ``tf32`` or ``bf16`` changes nothing: every kernel computes as for its
    storage (float32 for half storage, ``opgraph.types.compute_dtype``).
    ``opgraph.compile`` and ``opgraph-bench`` say it in these words.

    Args:
        precision: the policy's precision.
        applied: the precisions the compiled steps took (a collection).
        storage: the floating storage dtype name the graph runs in.
        device: the compile's device (``'cpu'`` says that no kernel there takes one).
    """
    if precision == "fp32" or precision in applied:
        return None
    computed = "float32" if storage in HALF_DTYPES else storage
    source = f" from {storage} storage" if computed != storage else ""
    where = " (none on the CPU does)" if device == "cpu" else ""
    return (f"precision {precision} requested, but no kernel of this lowering takes a precision option{where}: "
            f"it computed in {computed}{source}")


__all__ = ["PRECISIONS", "IO_DTYPE", "COMPUTE_DTYPE", "DEFAULT_PRECISION", "check", "resolve", "unapplied_note"]
