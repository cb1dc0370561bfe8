"""The GPU rule of ``Constant`` uploads each array once and copies it on the device per call
(no host-to-device transfer inside a step, so the step can be captured in a CUDA graph)."""

from __future__ import annotations

import types

import numpy as np

from opgraph import ops
from opgraph.backends.cuda.codegen import movement
from opgraph.backends.registry import lookup


class UploadCounter:
    """A stand-in for ``cupy``: ``asarray`` counts host-to-device uploads."""

    def __init__(self):
        self.uploads = 0
        self.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDevice=lambda: 0))

    def asarray(self, value):
        self.uploads += 1
        return np.array(value, copy=True)


def test_a_constant_is_uploaded_once_and_each_call_returns_a_fresh_copy():
    xp = UploadCounter()
    value = np.arange(6, dtype=np.float32).reshape(2, 3)
    first, second = movement.constant(xp, value=value), movement.constant(xp, value=value)
    assert xp.uploads == 1
    np.testing.assert_array_equal(first, value)
    np.testing.assert_array_equal(second, value)
    assert not np.shares_memory(first, second)  # fresh outputs: a later in-place step may write one
    other = np.ones((2,), np.float32)
    np.testing.assert_array_equal(movement.constant(xp, value=other), other)
    assert xp.uploads == 2


def test_constant_has_a_cuda_rule():
    assert lookup(ops.Constant, "cuda").fresh_output
