"""Fixtures of the benchmark tests: the tiny models of ``tinymodels.py``."""

from __future__ import annotations

import pytest

from tinymodels import every_op_model, tiny_convnet


@pytest.fixture
def tiny():
    return tiny_convnet()


@pytest.fixture
def every_op():
    return every_op_model()
