"""Host <-> device helpers of the channels-last kernels' GPU tests (depthwise,
unfold): float64 NCHW arrays to channels-last device arrays in bfloat16 or
float32, and back; and the check they share: a result against the float64
reference and cuDNN's, then replayed from a CUDA graph on new input."""

from __future__ import annotations

import numpy as np


def to_device(cp, a, dtype):
    """``a`` (NCHW, float64 on the host) stored channels-last on the device in
    ``dtype`` (``'bfloat16'`` through ml_dtypes' bits, else float32), viewed NCHW
    (``backends/cuda/storage.host_to_device``)."""
    from opgraph.backends.cuda.storage import host_to_device
    return host_to_device(cp, a, dtype)


def to_host(cp, a):
    """A channels-last device array (2-byte storage read as bfloat16 bits) as float64 NCHW on the host."""
    raw = a.view(cp.uint16) if a.dtype.itemsize == 2 else a
    out = cp.asnumpy(cp.ascontiguousarray(raw.transpose(0, 2, 3, 1)))
    if a.dtype.itemsize == 2:
        out = (out.astype(np.uint32) << 16).view(np.float32)
    return out.transpose(0, 3, 1, 2).astype(np.float64)


def overwrite(cp, dst, src) -> None:
    """``dst``'s elements replaced in place by ``src``'s (2-byte storage copied as
    its uint16 bits: CuPy does not copy bfloat16), e.g. new input before a replay."""
    raw = (lambda a: a.view(cp.uint16)) if dst.dtype.itemsize == 2 else (lambda a: a)
    raw(dst)[...] = raw(src)


def forward_hw(shape, k, s, p):
    """The forward output's (Ho, Wo) of ``shape`` (N, C, H, W), kernel ``k``, stride ``s`` and
    padding ``p`` ((top, bottom), (left, right)), without dilation."""
    return tuple((n + p0 + p1 - kk) // ss + 1 for n, kk, ss, (p0, p1) in zip(shape[2:], k, s, p))


def relative_error(got, ref) -> float:
    """``|got - ref| / |ref|`` (Frobenius norms)."""
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def check_and_replay(cp, rng, run, ref, theirs, tol, changed, dtype, captured_replay):
    """``run()``'s result within ``tol`` of the float64 ``ref`` and of cuDNN's
    ``theirs`` (relative to ``ref``), then replayed from a CUDA graph after
    ``changed`` (an operand) is overwritten with new values: the same bits as
    an eager call on them. Returns the first result (callers check its layout)."""
    out = run()
    got = to_host(cp, out)
    assert relative_error(got, ref) < tol
    assert np.linalg.norm(got - to_host(cp, theirs)) / np.linalg.norm(ref) < tol
    fresh = to_device(cp, rng.standard_normal(changed.shape), dtype)
    replayed, keep = captured_replay(run, lambda: overwrite(cp, changed, fresh))
    assert np.array_equal(to_host(cp, replayed), to_host(cp, run()))
    del keep
    return out

