"""Backends: lowering rules and their kernels, registered in ``registry``.

Importing this package registers every rule: the CPU ones (``reference/``;
``algorithms/``: direct, gemm, fft, winograd, the last three also on CuPy
arrays) and the GPU ones (``cuda/``: cuDNN, our own CuPy kernels as ``cuda``,
and cuBLAS matrix products in the policy's precision as ``cublas``), and the
device interface of ``device.py``. The GPU modules import without CuPy or
cuDNN; their rules then decline with the reason.

Each rules module imports its kernels and registers at its import; no kernel
module imports a rules module.
"""

# In this order (a rule table's algorithms are listed in registration order).
from .reference import rules as _reference_rules  # noqa: F401
from . import algorithms as _algorithms  # noqa: F401  (registers the convolution algorithms)
from . import cuda as _cuda  # noqa: F401  (registers the cudnn, cuda and cublas rules)
from . import device as _device  # noqa: F401
