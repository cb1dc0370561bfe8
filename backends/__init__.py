"""Backends: lowering rules and their kernels, registered in ``registry``.

Importing this package registers every rule: the CPU ones (reference, direct,
gemm, fft, winograd; the last three also run on CuPy arrays) and the GPU ones
(cudnn, our own CuPy kernels as ``cuda``, and cuBLAS matrix products in the
policy's precision as ``cublas``). The GPU modules import without
CuPy or cuDNN; their rules then decline with the reason.
"""

from .reference import rules as _reference_rules  # noqa: F401
from . import conv_rules as _conv_rules  # noqa: F401
from . import cudnn as _cudnn  # noqa: F401  (registers the cudnn rules)
from . import cuda_rules as _cuda_rules  # noqa: F401
from . import cublas_matmul as _cublas_matmul  # noqa: F401  (registers the cublas rules)
