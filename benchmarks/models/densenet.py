"""DenseNet-121 as torchvision 0.29 defines it (``torchvision.models.densenet121``), training form.

Source: Huang et al., "Densely Connected Convolutional Networks", CVPR 2017
(arXiv 1608.06993), the DenseNet-BC form: growth rate 32, bottleneck width
4 x 32, compression 0.5, no dropout. Spec: ``modern_convnets.json`` key
``densenet121``; node names are torchvision's module paths, parameters and
buffers its ``state_dict`` keys.

Layers, all under ``features.``: ``conv0`` 7x7/2 (64) -> ``norm0`` ->
``relu0`` -> ``pool0`` (max 3x3/2, padding 1); dense blocks
``denseblock1``..``4`` of 6, 12, 24, 16 layers, with ``transition1``..``3``
between them (``norm`` -> ``relu`` -> 1x1 ``conv`` halving the channels ->
``pool``, average 2x2/2); ``norm5``; then ``relu``, global average pooling
(``adaptive_avg_pool2d``), ``flatten`` and ``classifier`` (1024 -> 1000).
Every convolution is without bias; batch norms have eps 1e-5, momentum 0.1.

A dense layer ``denseblockB.denselayerL`` reads the block input and every
earlier layer's output, concatenated along channels (node ``.../cat``;
none for the first layer, which reads the block input alone), as
torchvision's ``bn_function`` concatenates its list again in every layer:
``norm1`` -> ``relu1`` -> 1x1 ``conv1`` (128) -> ``norm2`` -> ``relu2`` ->
3x3 ``conv2`` (32, padding 1). The block's output is the concatenation of
all of them (node ``denseblockB/cat``). Channels: 64 + 6 x 32 = 256 -> 128,
+ 12 x 32 = 512 -> 256, + 24 x 32 = 1024 -> 512, + 16 x 32 = 1024.

Batch norm is the training form; running statistics as in ``resnet.py``
(:attr:`Model.state_updates`). 7,978,856 parameters; 5.67 GFLOP of
convolutions per image at 224x224. ``--suite modern`` runs it at batch 64,
the others at 128: its concatenations copy every block's features again in
each layer, the most node outputs per image of the four (187 MiB in
float32, ResNet-50 144).
"""

from __future__ import annotations

import opgraph as og
from opgraph.graph import Value

from .common import Model, ModelBuilder

SEED_BATCH = 64
BLOCKS = (6, 12, 24, 16)
GROWTH, BOTTLENECK, INIT_FEATURES = 32, 4, 64


def dense_layer(m: ModelBuilder, features: list[Value], name: str) -> Value:
    """One dense layer ``name`` over the concatenation of ``features``; its
    ``GROWTH`` new channels."""
    x = features[0] if len(features) == 1 else og.concat(features, 1, name=f"{name}/cat")
    x = og.relu(m.batch_norm(x, f"{name}.norm1"), name=f"{name}.relu1")
    x = m.conv(x, f"{name}.conv1", BOTTLENECK * GROWTH, 1, bias=False)
    x = og.relu(m.batch_norm(x, f"{name}.norm2"), name=f"{name}.relu2")
    return m.conv(x, f"{name}.conv2", GROWTH, 3, pad=1, bias=False)


def dense_block(m: ModelBuilder, x: Value, name: str, layers: int) -> Value:
    """Dense block ``name``: ``layers`` dense layers, output their inputs and
    outputs concatenated (``C + layers * GROWTH`` channels)."""
    features = [x]
    for i in range(1, layers + 1):
        features.append(dense_layer(m, features, f"{name}.denselayer{i}"))
    return og.concat(features, 1, name=f"{name}/cat")


def transition(m: ModelBuilder, x: Value, name: str) -> Value:
    """Transition ``name``: batch norm, ReLU, 1x1 convolution to half the
    channels, 2x2 average pooling of stride 2."""
    x = og.relu(m.batch_norm(x, f"{name}.norm"), name=f"{name}.relu")
    x = m.conv(x, f"{name}.conv", x.shape[1] // 2, 1, bias=False)
    return m.avg_pool(x, f"{name}.pool", 2, 2)


def build(batch: int | None = None, dtype: str = "float32", *, image: int = 224) -> Model:
    """DenseNet-121 on a (batch, 3, image, image) input (``batch=None``: 64);
    ``image`` and errors: :meth:`ModelBuilder.torchvision`."""
    m = ModelBuilder.torchvision("densenet121", "DenseNet-121 (torchvision)",
                                 image=image, batch=batch, seed_batch=SEED_BATCH, dtype=dtype)
    x = m.conv(m.input, "features.conv0", INIT_FEATURES, 7, stride=2, pad=3, bias=False)
    x = og.relu(m.batch_norm(x, "features.norm0"), name="features.relu0")
    x = m.max_pool(x, "features.pool0", 3, 2, 1)
    for b, layers in enumerate(BLOCKS, start=1):
        x = dense_block(m, x, f"features.denseblock{b}", layers)
        if b < len(BLOCKS):
            x = transition(m, x, f"features.transition{b}")
    x = og.relu(m.batch_norm(x, "features.norm5"), name="relu")
    x = og.flatten(og.adaptive_avg_pool2d(x, 1, name="adaptive_avg_pool2d"), 1, name="flatten")
    return m.finish(m.linear(x, "classifier", 1000))


__all__ = ["build", "dense_layer", "dense_block", "transition", "BLOCKS", "GROWTH", "SEED_BATCH"]
