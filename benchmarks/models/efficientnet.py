"""EfficientNet-B0 as torchvision 0.29 defines it (``torchvision.models.efficientnet_b0``),
training form.

Source: Tan & Le, "EfficientNet: Rethinking Model Scaling for Convolutional
Neural Networks", ICML 2019 (arXiv 1905.11946), table 1 (B0: width and
depth multipliers 1). Spec: ``modern_convnets.json`` key
``efficientnet_b0``; node names are torchvision's module paths, parameters
and buffers its ``state_dict`` keys.

Layers: ``features.0`` (3x3/2 convolution to 32, batch norm, SiLU; a
``Conv2dNormActivation``: nodes ``.0``, ``.1``, ``.2``); stages
``features.1`` to ``features.7`` of MBConv blocks (:data:`STAGES`);
``features.8`` (1x1 to 1280, batch norm, SiLU); ``avgpool`` (global),
``flatten``, ``classifier.0`` (dropout 0.2) and ``classifier.1`` (1280 ->
1000). An MBConv block ``features.s.b`` (Sandler et al. 2018's inverted
residual with squeeze-and-excitation), its ``block.`` parts in order:

* a 1x1 expansion to ``t`` times the channels with batch norm and SiLU
  (absent when ``t == 1``, so the indices below shift down by one);
* a depthwise ``k`` x ``k`` convolution (``groups`` = channels, the stage's
  stride in its first block, padding ``(k - 1) // 2``), batch norm, SiLU;
* squeeze-and-excitation (Hu et al., "Squeeze-and-Excitation Networks",
  CVPR 2018): ``avgpool`` (global), 1x1 ``fc1`` with bias to
  ``max(1, C_in / 4)`` channels (of the *block input* C_in), SiLU
  ``activation``, 1x1 ``fc2`` with bias back, ``scale_activation``
  (sigmoid); the features times that per-channel gate (node ``.../mul``);
* a 1x1 projection with batch norm, no activation;
* when the stride is 1 and the channels do not change: stochastic depth
  then the block input added (node ``features.s.b/add``).

Stochastic depth (Huang et al. 2016) drops a block's residual branch per
sample with probability ``0.2 * j / 16`` for the j-th of the 16 blocks
(counted from 0). A benchmark step must be reproducible and checkable, so
each block draws its per-sample mask once, seeded by j, and applies it with
a multiply every run (``ModelBuilder.stochastic_depth``): the work of
torchvision's training step, with a fixed mask rather than a fresh one.
The classifier's dropout is the ``Dropout`` op in training mode, seeded
(seed 0). Batch norms: training form, as in ``resnet.py``
(:attr:`Model.state_updates`). 5,288,548 parameters; 0.77 GFLOP of
convolutions per image at 224x224.
"""

from __future__ import annotations

import opgraph as og
from opgraph.graph import Value

from .common import Model, ModelBuilder

SEED_BATCH = 128
#: (expansion t, kernel k, stride of the first block, output channels, blocks): table 1 of the paper.
STAGES = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3),
          (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))
FIRST_CHANNELS, LAST_CHANNELS, DROPOUT, STOCHASTIC_DEPTH = 32, 1280, 0.2, 0.2


def squeeze_excitation(m: ModelBuilder, x: Value, name: str, squeeze: int) -> Value:
    """``torchvision.ops.SqueezeExcitation(C, squeeze, SiLU)`` named ``name``:
    x (N, C, H, W) times a sigmoid gate (N, C, 1, 1) computed from x's channel means."""
    c = x.shape[1]
    s = og.adaptive_avg_pool2d(x, 1, name=f"{name}.avgpool")
    s = og.silu(m.conv(s, f"{name}.fc1", squeeze, 1), name=f"{name}.activation")
    s = og.sigmoid(m.conv(s, f"{name}.fc2", c, 1), name=f"{name}.scale_activation")
    return og.mul(s, x, name=f"{name}/mul")


def mbconv(m: ModelBuilder, x: Value, name: str, expansion: int, kernel: int, stride: int,
           out_channels: int, drop: float, seed: int) -> Value:
    """One MBConv block ``name`` (see the module docstring); ``drop`` is its
    stochastic-depth probability, ``seed`` the seed of its mask."""
    c_in = x.shape[1]
    hidden = c_in * expansion
    y, k = x, 0
    if expansion != 1:
        y = m.conv_norm_activation(y, f"{name}.block.0", hidden, 1, activation=og.silu)
        k = 1
    y = m.conv_norm_activation(y, f"{name}.block.{k}", hidden, kernel, stride=stride, groups=hidden,
                               activation=og.silu)
    y = squeeze_excitation(m, y, f"{name}.block.{k + 1}", max(1, c_in // 4))
    y = m.conv_norm_activation(y, f"{name}.block.{k + 2}", out_channels, 1)
    if stride == 1 and c_in == out_channels:
        y = m.stochastic_depth(y, f"{name}.stochastic_depth", drop, seed)
        y = og.add(y, x, name=f"{name}/add")
    return y


def build(batch: int | None = None, dtype: str = "float32", *, image: int = 224) -> Model:
    """EfficientNet-B0 on a (batch, 3, image, image) input (``batch=None``: 128);
    ``image`` and errors: :meth:`ModelBuilder.torchvision`."""
    m = ModelBuilder.torchvision("efficientnet_b0", "EfficientNet-B0 (torchvision)",
                                 image=image, batch=batch, seed_batch=SEED_BATCH, dtype=dtype)
    x = m.conv_norm_activation(m.input, "features.0", FIRST_CHANNELS, 3, stride=2, activation=og.silu)
    total = sum(stage[-1] for stage in STAGES)
    j = 0
    for s, (t, k, stride, c, blocks) in enumerate(STAGES, start=1):
        for b in range(blocks):
            x = mbconv(m, x, f"features.{s}.{b}", t, k, stride if b == 0 else 1, c,
                       STOCHASTIC_DEPTH * j / total, seed=j)
            j += 1
    x = m.conv_norm_activation(x, f"features.{len(STAGES) + 1}", LAST_CHANNELS, 1, activation=og.silu)
    x = og.flatten(og.adaptive_avg_pool2d(x, 1, name="avgpool"), 1, name="flatten")
    x = m.dropout(x, "classifier.0", DROPOUT, seed=0)
    return m.finish(m.linear(x, "classifier.1", 1000))


__all__ = ["build", "mbconv", "squeeze_excitation", "STAGES", "SEED_BATCH"]
