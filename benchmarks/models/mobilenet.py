"""MobileNet-v2 as torchvision 0.29 defines it (``torchvision.models.mobilenet_v2``), training form.

Source: Sandler et al., "MobileNetV2: Inverted Residuals and Linear
Bottlenecks", CVPR 2018 (arXiv 1801.04381), width multiplier 1. Spec:
``modern_convnets.json`` key ``mobilenet_v2``; node names are torchvision's
module paths, parameters and buffers its ``state_dict`` keys.

Layers: ``features.0`` (3x3/2 convolution to 32, batch norm, ReLU6; a
``Conv2dNormActivation``: nodes ``.0``, ``.1``, ``.2``); ``features.1`` to
``features.17``, the inverted residual blocks of :data:`SETTING`;
``features.18`` (1x1 to 1280, batch norm, ReLU6); global average pooling
(``adaptive_avg_pool2d``), ``flatten``, ``classifier.0`` (dropout 0.2) and
``classifier.1`` (1280 -> 1000). An inverted residual ``features.i``:
``conv.0`` a 1x1 expansion to ``t`` times the channels (with batch norm and
ReLU6; absent when ``t == 1``), then a depthwise 3x3 (``groups`` = channels,
the block's stride; batch norm, ReLU6), then a linear 1x1 projection
``conv.k`` and its batch norm ``conv.k+1`` (no activation); the block input
is added (node ``features.i/add``) when the stride is 1 and the channels
do not change.

Training form: batch norms as in ``resnet.py`` (:attr:`Model.state_updates`);
the classifier's dropout is the ``Dropout`` op in training mode, seeded
(seed 0): a fixed mask every run, where PyTorch draws a new one. 3,504,872
parameters; 0.60 GFLOP of convolutions per image at 224x224.
"""

from __future__ import annotations

import opgraph as og
from opgraph.graph import Value

from .common import Model, ModelBuilder

SEED_BATCH = 128
#: (expansion t, output channels c, repeats n, stride s of the first), the paper's table 2.
SETTING = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
           (6, 160, 3, 2), (6, 320, 1, 1))
FIRST_CHANNELS, LAST_CHANNELS, DROPOUT = 32, 1280, 0.2


def inverted_residual(m: ModelBuilder, x: Value, name: str, out_channels: int, stride: int,
                      expansion: int) -> Value:
    """One inverted residual block ``name`` (see the module docstring)."""
    hidden = x.shape[1] * expansion
    y, k = x, 0
    if expansion != 1:
        y = m.conv_norm_activation(y, f"{name}.conv.0", hidden, 1, activation=og.relu6)
        k = 1
    y = m.conv_norm_activation(y, f"{name}.conv.{k}", hidden, 3, stride=stride, groups=hidden,
                               activation=og.relu6)
    y = m.conv(y, f"{name}.conv.{k + 1}", out_channels, 1, bias=False)
    y = m.batch_norm(y, f"{name}.conv.{k + 2}")
    if stride == 1 and x.shape[1] == out_channels:
        y = og.add(x, y, name=f"{name}/add")
    return y


def build(batch: int | None = None, dtype: str = "float32", *, image: int = 224) -> Model:
    """MobileNet-v2 on a (batch, 3, image, image) input (``batch=None``: 128);
    ``image`` and errors: :meth:`ModelBuilder.torchvision`."""
    m = ModelBuilder.torchvision("mobilenet_v2", "MobileNet-v2 (torchvision)",
                                 image=image, batch=batch, seed_batch=SEED_BATCH, dtype=dtype)
    x = m.conv_norm_activation(m.input, "features.0", FIRST_CHANNELS, 3, stride=2, activation=og.relu6)
    i = 1
    for t, c, n, s in SETTING:
        for r in range(n):
            x = inverted_residual(m, x, f"features.{i}", c, s if r == 0 else 1, t)
            i += 1
    x = m.conv_norm_activation(x, f"features.{i}", LAST_CHANNELS, 1, activation=og.relu6)
    x = og.flatten(og.adaptive_avg_pool2d(x, 1, name="adaptive_avg_pool2d"), 1, name="flatten")
    x = m.dropout(x, "classifier.0", DROPOUT, seed=0)
    return m.finish(m.linear(x, "classifier.1", 1000))


__all__ = ["build", "inverted_residual", "SETTING", "SEED_BATCH"]
