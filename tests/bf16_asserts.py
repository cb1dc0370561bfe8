"""bfloat16 test helpers (checks of results against a float64 reference, pooling
inputs), shared by the CPU
(``tests/backends/test_bf16_kernel_sources.py``) and GPU
(``tests/gpu/test_bf16_kernels.py``) tests of the bf16 kernels."""

from __future__ import annotations

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)


def bf16(a):
    """float values rounded to bfloat16 (nearest even), a plain host array."""
    return np.asarray(a, np.float32).astype(BF16)


def f64(a):
    """float64 values of an output (any float dtype; ndarray subclasses unwrapped)."""
    return np.asarray(a).view(np.ndarray).astype(np.float64)


def bf16_ulp(ref):
    """Spacing of bfloat16 numbers at |ref| (8 significant bits; subnormals below 2^-126)."""
    a = np.abs(np.asarray(ref, np.float64))
    e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    return 2.0 ** (np.maximum(e, -126) - 7)


def assert_within_ulp(got, ref, ulps=1.0):
    """``got`` (host bfloat16) is ``ref`` (float64) rounded, within ``ulps``;
    NaN and infinities exactly where ref has them."""
    assert got.dtype == BF16
    g, r = f64(got), np.asarray(ref, np.float64)
    assert g.shape == r.shape
    np.testing.assert_array_equal(np.isnan(g), np.isnan(r))
    inf = np.isinf(r)
    np.testing.assert_array_equal(g[inf], r[inf])
    ok = ~np.isnan(r) & ~inf
    bad = np.abs(g[ok] - r[ok]) > ulps * bf16_ulp(r[ok])
    assert not bad.any(), (f"{bad.sum()} of {bad.size} beyond {ulps} ulp: "
                           f"got {g[ok][bad][:5]}, want {r[ok][bad][:5]}")


def rel_err(got, ref):
    """``||got - ref|| / ||ref||`` in float64; inf when got has a NaN ref has not."""
    g, r = f64(got), np.asarray(ref, np.float64)
    if np.isnan(g).any() and not np.isnan(r).any():
        return float("inf")
    return float(np.linalg.norm(g - r) / (np.linalg.norm(r) or 1.0))


def assert_same_values(got, want):
    """Exactly equal values (bfloat16 outputs), NaN where want has NaN."""
    assert got.dtype == BF16
    np.testing.assert_array_equal(f64(got), f64(want))


def spy_casts(monkeypatch) -> list:
    """Record every whole-array bf16 <-> f32 conversion of our kernels as
    ``(function, size)`` in the returned list (the in-kernel paths must make none)."""
    from opgraph.backends.cuda import colsum as cuda_colsum, loss as cuda_loss, storage as cuda_storage

    calls = []

    def spy(fn):
        def wrapped(xp, a):
            calls.append((fn.__name__, a.size))
            return fn(xp, a)
        return wrapped
    for name in ("float_to_bf16_bits", "bf16_bits_to_float"):
        monkeypatch.setattr(cuda_storage, name, spy(getattr(cuda_storage, name)))
    # the kernel modules that bind the conversion by name
    for module in (cuda_loss, cuda_colsum):
        monkeypatch.setattr(module, "float_to_bf16_bits", cuda_storage.float_to_bf16_bits)
    return calls


# ------------------------------------------------------------------ pooling inputs

def pool_input(rng, shape, kind):
    """A bf16 pooling input of ``shape`` (NCHW) and ``kind``: ``normal``, ``ties``
    (equal maxima: the first in row-major order wins), ``nan``, ``neg_inf`` (all
    -inf windows next to padding) or ``signed_zero``."""
    x = rng.standard_normal(shape).astype(np.float32)
    if kind == "ties":
        x = rng.integers(-1, 2, shape).astype(np.float32)
    elif kind == "nan":
        x.flat[rng.choice(x.size, max(1, x.size // 15), replace=False)] = np.nan
    elif kind == "neg_inf":
        x[:, :, : shape[2] // 2] = -np.inf
    elif kind == "signed_zero":
        x = rng.choice(np.array([0.0, -0.0, -1.0], np.float32), shape)
    return bf16(x)


def pool_kwargs(case):
    """The pooling keywords of a ``(shape, kernel_size, stride, padding, ceil_mode)`` case."""
    return dict(kernel_size=case[1], stride=case[2], padding=case[3], ceil_mode=case[4])


def cell_codes(shape):
    """``v[n, c, h, w] = h*W + w``: which cell a select picked (exact in bf16 below 256)."""
    h, w = shape[2:]
    return bf16(np.broadcast_to(np.arange(h * w, dtype=np.float32).reshape(h, w), shape))
