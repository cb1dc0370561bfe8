"""The modern-convnet activations against PyTorch (CPU, float64): forward, gradient
and double backward, through ``og.compile``'s default CPU pipeline."""

import numpy as np
import pytest

import opgraph as og

from .torch_compare import compare

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _x(shape=(2, 3, 4, 5), scale=4.0, seed=0):
    """Normal values spread over the kinks at 0, +-3 and 6, none within 1e-3 of one."""
    x = scale * np.random.default_rng(seed).standard_normal(shape)
    for kink in (-3.0, -1.0, 0.0, 1.0, 3.0, 6.0):
        x = np.where(np.abs(x - kink) < 1e-3, kink + 0.25, x)
    return x


#: Activations PyTorch has no double backward for (ours is checked by finite differences).
NO_TORCH_DOUBLE = {"hardsigmoid"}

#: PyTorch's CPU hardsigmoid_backward scales by the float32 literal 1.0f / 6.0f even
#: in float64 (relative error 3e-8); every other comparison holds to 1e-10.
RTOL = {"hardsigmoid": 1e-7}

CASES = {
    "relu6": (og.relu6, F.relu6),
    "hardtanh": (lambda x: og.hardtanh(x, -2.0, 1.5), lambda x: F.hardtanh(x, -2.0, 1.5)),
    "sigmoid": (og.sigmoid, torch.sigmoid),
    "silu": (og.silu, F.silu),
    "hardsigmoid": (og.hardsigmoid, F.hardsigmoid),
    "hardswish": (og.hardswish, F.hardswish),
    "gelu": (og.gelu, F.gelu),
    "gelu_tanh": (lambda x: og.gelu(x, "tanh"), lambda x: F.gelu(x, approximate="tanh")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_activation_matches_torch(case):
    ours, theirs = CASES[case]
    compare(ours, theirs, {"x": _x()}, ["x"], double=case not in NO_TORCH_DOUBLE,
            rtol=RTOL.get(case, 1e-10))


@pytest.mark.parametrize("case", sorted(CASES))
def test_activation_at_its_kinks_matches_torch(case):
    """At exactly 0, +-3, 6 and the hardtanh bounds: PyTorch's one-sided choices
    (hardtanh 0 at the bounds, hardswish 0 at -3 and 1 at 3); first derivatives only."""
    ours, theirs = CASES[case]
    x = np.array([-3.0, -2.0, -1.0, 0.0, 1.0, 1.5, 3.0, 6.0, -1e4, 1e4])
    compare(ours, theirs, {"x": x}, ["x"], double=False, rtol=RTOL.get(case, 1e-10))


def test_hardsigmoid_with_onnx_default_attributes_matches_its_formula():
    """ONNX HardSigmoid's default alpha 0.2, beta 0.5 (not PyTorch's 1/6): the op reads them."""
    compare(lambda x: og.hardsigmoid(x, alpha=0.2, beta=0.5),
            lambda x: torch.clamp(0.2 * x + 0.5, 0.0, 1.0), {"x": _x()}, ["x"])
