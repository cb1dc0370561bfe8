"""Convolution algorithms written against an array module (NumPy or CuPy):
im2col + GEMM (``gemm``), FFT (``fft``) and Winograd (``winograd``); ``rules``
registers them, with the direct reference, as the convolution lowerings."""

from . import rules as _rules  # noqa: F401  (registers the convolution rules)
