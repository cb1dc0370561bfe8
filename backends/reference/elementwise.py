"""Reference (oracle) element-wise kernels: ReLU, threshold, add, bias, zeros (dropout: ``dropout.py``).

Every kernel takes the array module ``xp`` (numpy or cupy) first, returns a
fresh array (never a view of an input, so an executor may overwrite its
buffers) and computes in the input dtype. Rules: ``shared/design/SEMANTICS.md``
(Others).

ReLU, threshold, their gradients, ``add`` and ``bias_add`` also take
``out=``: an array of the result's shape and dtype (in the executor, the
input whose buffer dies at this step: ``Rule.inplace`` in
``backends/registry.py``) that receives the result through its own
strides and is returned. The values are those of the call without ``out``,
bit for bit.

Gradient masks use ``where`` rather than a multiplication by a 0/1 mask, so an
infinite output gradient at a blocked position gives 0, not ``inf * 0 = NaN``
(PyTorch's ``threshold_backward`` also selects).
"""

from __future__ import annotations

from opgraph import ops
from opgraph.errors import ShapeError
from opgraph.types import compute_dtype, numpy_dtype

from .kernel import reference, reference_node


@reference(ops.Relu, inplace=0)
def relu(xp, x, *, out=None):
    """``max(x, 0)`` element-wise; NaN propagates (``maximum`` propagates NaN).

    Shapes: any; returns x's shape and dtype (into ``out`` if given, e.g. x
    itself). Source: SEMANTICS.md (ReLU).
    """
    return xp.maximum(x, xp.zeros((), dtype=x.dtype), out=out)


@reference(ops.ReluBackward, inplace=1)  # into gy (input 0 is the ReLU's output, the mask)
def relu_backward(xp, x, gy, *, out=None):
    """``gy`` where ``x > 0``, else 0.

    The gradient at exactly 0 is 0 (SEMANTICS.md) and a NaN ``x`` gives 0
    (``NaN > 0`` is false), the rule fixed for the ``ReluBackward`` op.
    Shapes: x and gy alike; returns gy's dtype (into ``out`` if given, e.g.
    gy itself).
    """
    _same_shape("relu_backward", x, gy)
    zero = xp.zeros((), dtype=gy.dtype)
    if out is None:
        return _select(xp, x > 0, gy, zero)
    return _select_into(xp, out, x > 0, gy, zero)


@reference(ops.Threshold, inplace=0)
def threshold(xp, x, *, threshold, value, out=None):
    """``torch.nn.functional.threshold``: ``x`` if ``x > threshold`` else ``value``.

    Written as ``where(x <= threshold, value, x)`` as PyTorch does, so a NaN
    input propagates (``NaN <= t`` is false); ``threshold(x, 0, 0)`` is ReLU.
    Returns x's shape and dtype (into ``out`` if given, e.g. x itself).
    """
    v = xp.asarray(value, dtype=x.dtype)
    if out is None:
        return _select(xp, x <= threshold, v, x)
    return _select_into(xp, out, ~(x <= threshold), x, v)


@reference(ops.ThresholdBackward, inplace=1)
def threshold_backward(xp, x, gy, *, threshold, out=None):
    """``gy`` where ``x > threshold``, else 0 (the gradient does not depend on
    ``value``). A NaN ``x`` gives 0, as :func:`relu_backward`. Into ``out``
    if given (e.g. gy itself).
    """
    _same_shape("threshold_backward", x, gy)
    zero = xp.zeros((), dtype=gy.dtype)
    if out is None:
        return _select(xp, x > threshold, gy, zero)
    return _select_into(xp, out, x > threshold, gy, zero)


@reference(ops.Add, inplace=(0, 1))  # a gradient sum accumulates into either addend
def add(xp, a, b, *, out=None):
    """``a + b`` for two arrays of the same shape (no broadcasting); into
    ``out`` if given (e.g. a or b itself: a gradient sum accumulated in place).

    Raises:
        ShapeError: the shapes differ.
    """
    _same_shape("add", a, b)
    return xp.add(a, b, out=out)


@reference(ops.BiasAdd, inplace=0)  # into x, not the (C,) bias
def bias_add(xp, x, b, *, out=None):
    """``x + b`` with ``b`` of shape ``(C,)`` broadcast along axis 1 of
    ``x`` (``(N, C, ...)``); into ``out`` if given (e.g. x itself).

    Raises:
        ShapeError: b is not ``(C,)``.
    """
    if b.ndim != 1 or x.ndim < 2 or b.shape[0] != x.shape[1]:
        raise ShapeError(f"bias_add: b must have shape ({x.shape[1] if x.ndim > 1 else '?'},) "
                         f"for x of shape {x.shape}, got {b.shape}")
    return xp.add(x, b.reshape((1, -1) + (1,) * (x.ndim - 2)), out=out)


@reference(ops.BiasAddBackward)
def bias_add_backward(xp, gy):
    """Gradient of the bias of :func:`bias_add`: ``gy`` summed over every axis
    but 1, shape ``(C,)``; fp16 accumulates in fp32, the result has gy's
    dtype. A batch of size 0 gives zeros.
    """
    if gy.ndim < 2:
        raise ShapeError(f"bias_add_backward: gy must be at least 2-D, got shape {gy.shape}")
    acc = compute_dtype(xp, gy.dtype)
    axes = (0,) + tuple(range(2, gy.ndim))
    return gy.sum(axis=axes, dtype=acc).astype(gy.dtype, copy=False)


def zeros(xp, *, type):
    """Zeros of an ``opgraph.types.TensorType`` (its shape and dtype; bfloat16
    is ``ml_dtypes.bfloat16``, which NumPy and CuPy >= 14 take)."""
    return xp.zeros(type.shape, dtype=numpy_dtype(type.dtype))


@reference_node(ops.Zeros)
def zeros_node(ctx, op):
    """A ``Zeros`` node's zeros in the type it runs in (``ctx.out_type``: compile's
    dtype applied, ``opgraph/run_types.py``), else the op's declared type: under
    ``compile(dtype='float64')`` the declared float32 zeros made every op after
    them compute in float32."""
    return zeros(ctx.xp, type=ctx.out_type or op.type)


def _select(xp, keep, a, other):
    """``where(keep, a, other)`` in ``a``'s dtype: CuPy 14 promotes a bfloat16
    ``where`` to float32 (measured on the H200, ``scripts/gpu_probe.py``), which
    would turn every later value of a bf16 graph into float32."""
    out = xp.where(keep, a, other)
    return out if out.dtype == a.dtype else out.astype(a.dtype)


def _select_into(xp, out, keep, a, other):
    """``where(keep, a, other)`` written into ``out`` (which may be ``a``
    itself: the mask is computed before anything is written)."""
    if out is not a:
        xp.copyto(out, a)
    xp.copyto(out, other, where=~keep)
    return out


def _same_shape(what, a, b):
    if tuple(a.shape) != tuple(b.shape):
        raise ShapeError(f"{what}: shapes differ, {a.shape} and {b.shape}")


__all__ = ["relu", "relu_backward", "threshold", "threshold_backward", "add", "bias_add",
           "bias_add_backward", "zeros"]
