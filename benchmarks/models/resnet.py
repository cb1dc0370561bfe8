"""ResNet-50 as torchvision 0.29 defines it (``torchvision.models.resnet50``), training form.

Source: He et al., "Deep Residual Learning for Image Recognition", CVPR 2016
(arXiv 1512.03385), in torchvision's "v1.5" form: the bottleneck's stride
sits on its 3x3 convolution (``conv2``), not on the first 1x1 as in the
paper. Spec: ``modern_convnets.json`` key ``resnet50``; node names are
torchvision's module paths, parameters and buffers its ``state_dict`` keys.

Layers: ``conv1`` 7x7/2 (64) -> ``bn1`` -> ``relu`` -> ``maxpool`` 3x3/2 ->
``layer1``..``layer4`` of 3, 4, 6, 3 bottlenecks (widths 64, 128, 256, 512,
output 4x the width; stride 2 in the first block of layers 2-4) ->
``avgpool`` (global) -> ``flatten`` -> ``fc`` (2048 -> 1000). A bottleneck
``layerL.B``: 1x1 ``conv1`` -> ``bn1`` -> ``relu``, 3x3 ``conv2`` (the
stride) -> ``bn2`` -> ``relu_2``, 1x1 ``conv3`` -> ``bn3``; the identity, or
in the first block of a layer ``downsample.0`` (1x1, the stride) ->
``downsample.1``; their sum (node ``layerL.B/add``) -> ``relu_3``
(torchvision calls one ReLU module three times; a repeated node gets the
graph's ``_2``, ``_3`` suffix). Convolutions have no bias; every one is
followed by a batch norm (eps 1e-5, momentum 0.1).

Batch norm is the training form (batch statistics, gradients through them);
the running statistics are updated as a training step of PyTorch updates
them and are :attr:`Model.state_updates`, which the benchmark computes in
its forward phase. The seed's ``zero_init_residual`` is off (torchvision's
default), which only changes the initial weights. 25,557,032 parameters;
8.17 GFLOP of convolutions per image at 224x224 (a multiply-add = 2).
"""

from __future__ import annotations

import opgraph as og
from opgraph.graph import Value

from .common import Model, ModelBuilder

SEED_BATCH = 128
#: (name, bottlenecks, width, stride of the first block).
STAGES = (("layer1", 3, 64, 1), ("layer2", 4, 128, 2), ("layer3", 6, 256, 2), ("layer4", 3, 512, 2))
EXPANSION = 4


def bottleneck(m: ModelBuilder, x: Value, name: str, width: int, stride: int) -> Value:
    """One v1.5 bottleneck block ``name`` (see the module docstring); output
    ``EXPANSION * width`` channels, spatial size divided by ``stride``."""
    out = og.relu(m.batch_norm(m.conv(x, f"{name}.conv1", width, 1, bias=False), f"{name}.bn1"),
                  name=f"{name}.relu")
    out = m.conv(out, f"{name}.conv2", width, 3, stride=stride, pad=1, bias=False)
    out = og.relu(m.batch_norm(out, f"{name}.bn2"), name=f"{name}.relu_2")
    out = m.batch_norm(m.conv(out, f"{name}.conv3", EXPANSION * width, 1, bias=False), f"{name}.bn3")
    identity = x
    if stride != 1 or x.shape[1] != EXPANSION * width:
        identity = m.conv(x, f"{name}.downsample.0", EXPANSION * width, 1, stride=stride, bias=False)
        identity = m.batch_norm(identity, f"{name}.downsample.1")
    return og.relu(og.add(out, identity, name=f"{name}/add"), name=f"{name}.relu_3")


def build(batch: int | None = None, dtype: str = "float32", *, image: int = 224) -> Model:
    """ResNet-50 on a (batch, 3, image, image) input (``batch=None``: 128);
    ``image`` and errors: :meth:`ModelBuilder.torchvision`."""
    m = ModelBuilder.torchvision("resnet50", "ResNet-50 (torchvision, v1.5)",
                                 image=image, batch=batch, seed_batch=SEED_BATCH, dtype=dtype)
    x = m.conv(m.input, "conv1", 64, 7, stride=2, pad=3, bias=False)
    x = og.relu(m.batch_norm(x, "bn1"), name="relu")
    x = m.max_pool(x, "maxpool", 3, 2, 1)
    for stage, blocks, width, stride in STAGES:
        for b in range(blocks):
            x = bottleneck(m, x, f"{stage}.{b}", width, stride if b == 0 else 1)
    x = og.flatten(og.adaptive_avg_pool2d(x, 1, name="avgpool"), 1, name="flatten")
    return m.finish(m.linear(x, "fc", 1000))


__all__ = ["build", "bottleneck", "STAGES", "SEED_BATCH"]
