"""The CUDA backend (device ``cuda``, CuPy arrays).

* cuDNN: ``cudnn`` (convolution kernels), ``cudnn_graph`` (built graphs and
  their cache), ``cudnn_rules``;
* cuBLAS: ``cublas`` (``cublasGemmEx`` in the policy's precision),
  ``cublas_rules``, ``matmul_peak`` (the measured matrix-multiply peak);
* our CuPy kernels: ``storage`` (bfloat16 storage, layouts), ``relu``,
  ``colsum`` (column sums, the bias gradient), ``lrn``, ``pool``, ``loss``;
  ``rules`` registers them as the ``cuda`` lowering;
* generated kernels of memory-bound ops and fused chains: ``codegen/``,
  registered by ``codegen_rules`` as the ``codegen`` lowering.

Importing this package registers the rules; it needs neither CuPy nor cuDNN.
"""

from . import cudnn_rules as _cudnn_rules  # noqa: F401
from . import rules as _rules  # noqa: F401
from . import cublas_rules as _cublas_rules  # noqa: F401
from . import codegen_rules as _codegen_rules  # noqa: F401
