"""Fixtures of the benchmark tests: the tiny models of ``tinymodels.py``, and
``--profile``'s limits stood in for."""

from __future__ import annotations

import pytest

from tinymodels import every_op_model, tiny_convnet


@pytest.fixture
def tiny():
    return tiny_convnet()


@pytest.fixture
def every_op():
    return every_op_model()


@pytest.fixture
def quick_limits(monkeypatch):
    """A stand-in for the limits ``--profile`` measures first (a large copy and a
    matmul peak: slow on the shared CPU) where the test is about something else."""
    from opgraph.benchmarks import profile as pf

    monkeypatch.setattr(pf, "measure_limits", lambda device, precisions: {
        "matmul": {p: {"tflops": None, "method": "not measured in this test"} for p in precisions},
        "copy": {"gbps": None, "method": "not measured in this test"}})
