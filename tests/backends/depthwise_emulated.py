"""What the depthwise kernels' emulator tests share (``test_depthwise_dgrad.py``,
``test_depthwise_wgrad.py``): the CUDA text run on the CPU through g++, the
dtypes and tolerances against float64, the forward output's extent, case ids,
and which vector width the launched kernels used."""

from __future__ import annotations

import numpy as np
import pytest

from cuda_cpu_emulator import EmulatedCupy
from cupy_standin import cupy_replaced
from opgraph.backends.cuda.codegen import launch

DTYPES = ["float32", "bfloat16", "float16", "float64"]
#: largest relative error (Frobenius) against float64, per storage dtype
TOLERANCE = {"float32": 1e-6, "float64": 1e-12, "bfloat16": 1e-2, "float16": 2e-3}


@pytest.fixture
def emu(monkeypatch):
    """CuPy replaced by the g++ emulator for the test (``launch.compiled`` included)."""
    with cupy_replaced(monkeypatch, EmulatedCupy(), launch.compiled) as e:
        yield e


def forward_hw(shape, k, s, p, d):
    """The forward output's (Ho, Wo) of input ``shape`` (N, C, H, W), kernel ``k``,
    stride ``s``, padding ``p`` ((top, bottom), (left, right)) and dilation ``d``."""
    return tuple((n + p0 + p1 - dd * (kk - 1) - 1) // ss + 1 for n, kk, ss, (p0, p1), dd in zip(shape[2:], k, s, p, d))


def case_id(c) -> str:
    """A case ``(shape, kernel, stride, padding, dilation)`` as a test id."""
    return f"{c[0]}-k{c[1][0]}x{c[1][1]}-s{c[2]}-p{c[3]}-d{c[4]}"


def lanes_run(emu, prefix: str) -> set:
    """The V (``_v<V>_`` in the name) of every kernel launched whose name starts with ``prefix``."""
    return {int(run["name"].split("_v")[1].split("_")[0]) for run in emu.raw_launches
            if run["name"].startswith(prefix)}


def assert_close(out, ref, dtype: str) -> None:
    """``out`` within :data:`TOLERANCE` of the float64 ``ref`` (relative, Frobenius)."""
    err = np.linalg.norm(out.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-300)
    assert err < TOLERANCE[dtype], err
