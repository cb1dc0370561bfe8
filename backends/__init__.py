"""Backends: lowering rules and their kernels, registered in ``registry``.

Importing this package registers every CPU rule (reference, direct, gemm,
fft, winograd) and, where CuPy and the cuDNN frontend import, the GPU ones.
"""

from .reference import rules as _reference_rules  # noqa: F401
from . import conv_rules as _conv_rules  # noqa: F401
