"""The cuBLAS matrix-product rules (backends/cuda/cublas.py, cublas_rules.py) on the CPU.

What can go wrong without a GPU is the mapping of row-major operands onto
column-major ``cublasGemmEx`` arguments. ``colmajor_gemm`` below does what
the cuBLAS documentation says ``gemmEx`` does with those arguments, on flat
NumPy buffers read in column-major order, so every transpose combination is
checked against ``op(a) @ op(b)``.
"""

from __future__ import annotations

import numpy as np
import pytest

from opgraph import ops
from opgraph.backends.cuda import cublas as cm, cublas_rules
from opgraph.backends.reference.linear import matmul_dims
from opgraph.backends.registry import rules_for
from opgraph.errors import ShapeError
from opgraph.types import TensorType


def colmajor(buf, rows, cols, ld):
    """The column-major ``(rows, cols)`` matrix with leading dimension ``ld`` in ``buf``."""
    assert ld >= rows and buf.size >= ld * (cols - 1) + rows
    return np.lib.stride_tricks.as_strided(buf, (rows, cols), (buf.itemsize, ld * buf.itemsize))


def colmajor_gemm(args, a_buf, b_buf):
    """cuBLAS ``C = op(A) op(B)`` (alpha 1, beta 0): A is the first operand."""
    m, n, k = args["m"], args["n"], args["k"]
    a_rows, a_cols = (k, m) if args["transa"] == cm.CUBLAS_OP_T else (m, k)
    b_rows, b_cols = (n, k) if args["transb"] == cm.CUBLAS_OP_T else (k, n)
    A = colmajor(a_buf, a_rows, a_cols, args["lda"])
    B = colmajor(b_buf, b_rows, b_cols, args["ldb"])
    opA = A.T if args["transa"] == cm.CUBLAS_OP_T else A
    opB = B.T if args["transb"] == cm.CUBLAS_OP_T else B
    c = np.zeros(args["ldc"] * n)
    colmajor(c, m, n, args["ldc"])[...] = opA @ opB
    return c


@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("m,k,p", [(3, 5, 4), (1, 7, 1), (128, 64, 10)])
def test_gemm_ex_arguments_compute_the_row_major_product(transpose_a, transpose_b, m, k, p):
    rng = np.random.default_rng(m * 100 + k * 10 + p)
    a = rng.standard_normal((k, m) if transpose_a else (m, k))
    b = rng.standard_normal((p, k) if transpose_b else (k, p))
    args = cm.gemm_ex_args(a.shape, b.shape, transpose_a, transpose_b)
    # cuBLAS's first operand is b, its second a, both as their C-order buffers
    c = colmajor_gemm(args, np.ascontiguousarray(b).ravel(), np.ascontiguousarray(a).ravel())
    got = c.reshape(m, p)  # column-major (P, M) with ldc = P is row-major (M, P)
    want = (a.T if transpose_a else a) @ (b.T if transpose_b else b)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_shapes_that_do_not_fit_are_refused():
    with pytest.raises(ShapeError, match="inner extents differ"):
        cm.gemm_ex_args((2, 3), (4, 5), False, False)
    with pytest.raises(ShapeError, match="2-D"):
        matmul_dims((2, 3, 4), (4, 5), False, False)
    assert matmul_dims((3, 2), (5, 3), True, True) == (2, 3, 5)


def test_rules_are_registered_for_cuda_only_and_take_the_precision():
    for op_type in (ops.Linear, ops.MatMul):
        rule = rules_for(op_type)["cublas"]
        assert rule.devices == frozenset({"cuda"}) and "option:precision" in rule.tags
    f32 = TensorType((4, 3), "float32")
    lin = ops.Linear()
    assert cublas_rules.check(lin, [f32, TensorType((5, 3), "float32"), TensorType((5,), "float32")], "cuda") is None
    assert "float64" in cublas_rules.check(lin, [TensorType((4, 3), "float64"), TensorType((5, 3), "float64")], "cuda")
    assert "2-D" in cublas_rules.check(lin, [TensorType((4, 3, 2), "float32"), f32], "cuda")


def test_gemm_types_are_the_cublas_enums_of_each_precision():
    # library_types.h: CUDA_R_32F 0, CUDA_R_16F 2, CUDA_R_16BF 14; cublas_api.h:
    # CUBLAS_COMPUTE_32F 68, CUBLAS_COMPUTE_32F_FAST_TF32 77
    assert cm.GEMM_TYPES == {"fp32": (0, 68), "tf32": (0, 77), "bf16": (14, 68), "fp16": (2, 68)}


# ---- which bindings: our own handle through nvmath-python, else CuPy's

class _FakeStream:
    def __init__(self, ptr, capturing=False):
        self.ptr, self.capturing = ptr, capturing

    def is_capturing(self):
        return self.capturing


class _FakeBindings:
    """nvmath.bindings.cublas as far as gemm_ex_into uses it: records the calls."""

    def __init__(self):
        self.calls = []

    def create(self):
        self.calls.append(("create",))
        return 1234

    def set_workspace(self, handle, ptr, nbytes):
        self.calls.append(("set_workspace", handle, nbytes))

    def set_pointer_mode(self, handle, mode):
        self.calls.append(("set_pointer_mode", handle, mode))

    def set_stream(self, handle, ptr):
        self.calls.append(("set_stream", handle, ptr))

    def gemm_ex(self, handle, *args):
        import ctypes
        # alpha and beta are host pointers, alive during the call only: read them now
        scalars = (ctypes.c_float.from_address(args[5]).value, ctypes.c_float.from_address(args[12]).value)
        self.calls.append(("gemm_ex", handle, args, scalars))


class _FakeArray:
    def __init__(self, shape, ptr=77, nbytes=0, dtype="float32"):
        self.shape, self.nbytes, self.dtype = shape, nbytes, dtype
        self.data = type("D", (), {"ptr": ptr})()


def _fake_xp(stream):
    cuda = type("C", (), {})()
    cuda.runtime = type("R", (), {"getDevice": staticmethod(lambda: 0)})()
    cuda.get_current_stream = lambda: stream
    xp = type("XP", (), {})()
    xp.cuda, xp.uint8, xp.float32 = cuda, "uint8", "float32"
    xp.empty = lambda n, dtype: _FakeArray((n,), ptr=99, nbytes=n)
    return xp


@pytest.fixture
def fake_nvmath(monkeypatch):
    import sys
    import types
    bindings = _FakeBindings()
    pkg, sub = types.ModuleType("nvmath"), types.ModuleType("nvmath.bindings")
    sub.cublas = bindings
    pkg.bindings = sub
    monkeypatch.setitem(sys.modules, "nvmath", pkg)
    monkeypatch.setitem(sys.modules, "nvmath.bindings", sub)
    monkeypatch.setitem(sys.modules, "nvmath.bindings.cublas", bindings)
    monkeypatch.setattr(cm, "_OWN_HANDLES", {})
    return bindings


def test_with_nvmath_the_product_runs_on_our_own_handle_on_the_current_stream(fake_nvmath):
    xp = _fake_xp(_FakeStream(ptr=4242))
    a, b, out = _FakeArray((3, 5), ptr=1), _FakeArray((5, 4), ptr=2), _FakeArray((3, 4), ptr=3)
    cm.gemm_ex_into(xp, a, b, out, "tf32")
    cm.gemm_ex_into(xp, a, b, out, "tf32")
    names = [c[0] for c in fake_nvmath.calls]
    # one handle, made once with its workspace and host pointer mode; the stream set before each call
    assert names == ["create", "set_workspace", "set_pointer_mode",
                     "set_stream", "gemm_ex", "set_stream", "gemm_ex"]
    assert fake_nvmath.calls[1] == ("set_workspace", 1234, cm.CUBLAS_WORKSPACE_BYTES)
    assert fake_nvmath.calls[2] == ("set_pointer_mode", 1234, cm.CUBLAS_POINTER_MODE_HOST)
    assert fake_nvmath.calls[3] == ("set_stream", 1234, 4242)
    args = fake_nvmath.calls[4][2]
    expect = cm.gemm_ex_args((3, 5), (5, 4), False, False)
    assert args[:5] == (expect["transa"], expect["transb"], expect["m"], expect["n"], expect["k"])
    # cuBLAS's first operand is b, its second a; C is out; the tf32 compute type
    assert (args[6], args[9], args[13]) == (2, 1, 3)
    assert (args[7], args[16]) == cm.GEMM_TYPES["tf32"]
    assert args[14] == cm.CUDA_R_32F and fake_nvmath.calls[4][3] == (1.0, 0.0)  # C = 1 * AB + 0 * C


def test_a_bf16_product_is_written_into_bf16_storage_and_may_accumulate(fake_nvmath):
    # bf16 operands with a bf16 (uint16 bits) output: C's type is bf16, and with
    # accumulate the bias already in C is added before the one rounding (beta = 1)
    xp = _fake_xp(_FakeStream(ptr=1))
    a, b = _FakeArray((3, 5), ptr=1, dtype="uint16"), _FakeArray((4, 5), ptr=2, dtype="uint16")
    out = _FakeArray((3, 4), ptr=3, dtype="uint16")
    cm.gemm_ex_into(xp, a, b, out, "bf16", transpose_b=True, accumulate=True)
    cm.gemm_ex_into(xp, a, b, out, "bf16", transpose_b=True)
    (_, _, args, scalars), (_, _, _, plain) = [c for c in fake_nvmath.calls if c[0] == "gemm_ex"]
    assert args[7] == args[10] == args[14] == cm.CUDA_R_16BF and args[16] == cm.CUBLAS_COMPUTE_32F
    assert scalars == (1.0, 1.0) and plain == (1.0, 0.0)


def test_our_handle_is_not_made_inside_a_capture(fake_nvmath):
    xp = _fake_xp(_FakeStream(ptr=1, capturing=True))
    with pytest.raises(RuntimeError, match="inside a CUDA-graph capture"):
        cm.own_handle(xp)
    assert fake_nvmath.calls == []


def test_without_nvmath_there_is_no_handle_of_our_own(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "nvmath", None)  # import raises ImportError
    assert cm.own_handle(_fake_xp(_FakeStream(ptr=1))) is None


def test_the_rules_take_bfloat16_storage():
    x, w = TensorType((4, 8), "bfloat16"), TensorType((3, 8), "bfloat16")
    assert cublas_rules.check(ops.Linear(), [x, w], "cuda") is None
    assert cublas_rules.check(ops.MatMul(transpose_a=False, transpose_b=True), [x, w], "cuda") is None


def test_an_output_neither_float32_nor_the_operands_storage_is_refused(fake_nvmath):
    xp = _fake_xp(_FakeStream(ptr=1))
    a, b = _FakeArray((3, 5), ptr=1), _FakeArray((5, 4), ptr=2)
    with pytest.raises(ShapeError, match="out is float16; it must be float32"):
        cm.gemm_ex_into(xp, a, b, _FakeArray((3, 4), ptr=3, dtype="float16"), "tf32")
    assert not [c for c in fake_nvmath.calls if c[0] == "gemm_ex"]
