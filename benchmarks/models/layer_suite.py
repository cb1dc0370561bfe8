"""The layer-wise benchmark L1-L5 of convnet-benchmarks: single convolutions.

Source: the soumith/convnet-benchmarks README (2014-2015), spec
``shared/specs/layer_suite.json``: batch 128, stride 1, no padding, square
kernels, float32, NCHW, with bias. The historical finding: FFT convolution
won by 5-13x on the 9x9 layers L2/L3 and lost or tied on L1 (3 input
channels) and L5 (3x3).

Each entry is a model whose only layer is the convolution named ``L1`` ..
``L5``; its output is the convolution output.
"""

from __future__ import annotations

import functools

from .common import Model, ModelBuilder

SEED_BATCH = 128

#: name -> (in_channels, height = width, out_channels, kernel)
LAYERS = {
    "L1": (3, 128, 96, 11),
    "L2": (64, 64, 128, 9),
    "L3": (128, 32, 128, 9),
    "L4": (128, 16, 128, 7),
    "L5": (384, 13, 384, 3),
}


def build(name: str, batch: int | None = None, dtype: str = "float32") -> Model:
    """Layer ``name`` (``'L1'``..``'L5'``) on a (batch, C, H, H) input.

    Raises:
        KeyError: unknown layer name.
        ParameterError: ``batch`` is not an int >= 0.
    """
    if name not in LAYERS:
        raise KeyError(f"unknown layer {name!r}; the suite has {sorted(LAYERS)}")
    c, hw, o, k = LAYERS[name]
    m = ModelBuilder(name, name, f"layer {name}: {c}->{o}, {k}x{k} on {hw}x{hw}",
                     input_chw=(c, hw, hw), batch=batch, seed_batch=SEED_BATCH, dtype=dtype)
    return m.finish(m.conv(m.input, name, o, k))


#: One builder per layer with the common signature ``build(batch, dtype)``.
BUILDERS = {name: functools.partial(build, name) for name in LAYERS}

__all__ = ["build", "BUILDERS", "LAYERS", "SEED_BATCH"]
