"""Test helper: central-difference gradients for the reference-kernel tests."""

import numpy as np


def numgrad(f, x, gy, h=1e-6):
    """Central-difference gradient of ``sum(gy * f(x))`` with respect to x
    (float64 x; one pair of evaluations per element)."""
    g = np.zeros_like(x)
    x = x.copy()
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + h
        up = np.sum(gy * f(x))
        x[i] = old - h
        down = np.sum(gy * f(x))
        x[i] = old
        g[i] = (up - down) / (2 * h)
    return g
