"""GoogLeNet (Inception v1) main tower, as the seed benchmarked it.

Source: soumith/convnet-benchmarks ``torch7/imagenet_winners/googlenet.lua``
(Szegedy et al., arXiv 1409.4842) at its final revision: conv1 padded by 3,
3x3 pools with padding 1, final 7x7 average pool; no LRN (commented out in
the source), no auxiliary classifiers, no dropout; a ReLU follows the final
classifier (a quirk of the source, also in the Caffe prototxt). Input
3x224x224, seed batch 128. Spec: ``imagenet_winners.json`` key
``googlenet_v1``; layer names are the Caffe ones the spec uses.

An inception module concatenates four branches along channels, in this
order (the spec's ``concat_order``):

1. ``1x1``: 1x1 convolution;
2. ``3x3_reduce`` (1x1) then ``3x3`` (padding 1);
3. ``5x5_reduce`` (1x1) then ``5x5`` (padding 2);
4. ``pool`` (3x3 max pool, stride 1, padding 1) then ``pool_proj`` (1x1);

each convolution followed by its ``relu_*``. 7.0 M parameters, 3.165 GFLOP
forward per image.
"""

from __future__ import annotations

import opgraph as og
from opgraph.graph import Value

from .common import Model, ModelBuilder

SEED_BATCH = 128

#: (name, 1x1, (3x3 reduce, 3x3), (5x5 reduce, 5x5), pool projection): the
#: seed's ``inception(input, {{1x1}, {reduce, 3x3}, {reduce, 5x5}, {3, proj}})``.
INCEPTIONS = {
    "inception_3a": (64, (96, 128), (16, 32), 32),
    "inception_3b": (128, (128, 192), (32, 96), 64),
    "inception_4a": (192, (96, 208), (16, 48), 64),
    "inception_4b": (160, (112, 224), (24, 64), 64),
    "inception_4c": (128, (128, 256), (24, 64), 64),
    "inception_4d": (112, (144, 288), (32, 64), 64),
    "inception_4e": (256, (160, 320), (32, 128), 128),
    "inception_5a": (256, (160, 320), (32, 128), 128),
    "inception_5b": (384, (192, 384), (48, 128), 128),
}


def inception(m: ModelBuilder, x: Value, name: str, b1: int, b2: tuple[int, int],
              b3: tuple[int, int], b4: int) -> Value:
    """One inception module named ``name``: four branches concatenated along
    channels in the order 1x1, 3x3, 5x5, pool (output channels
    ``b1 + b2[1] + b3[1] + b4``)."""
    p = f"{name}/"
    y1 = m.conv_relu(x, p + "1x1", p + "relu_1x1", b1, 1)
    y2 = m.conv_relu(x, p + "3x3_reduce", p + "relu_3x3_reduce", b2[0], 1)
    y2 = m.conv_relu(y2, p + "3x3", p + "relu_3x3", b2[1], 3, pad=1)
    y3 = m.conv_relu(x, p + "5x5_reduce", p + "relu_5x5_reduce", b3[0], 1)
    y3 = m.conv_relu(y3, p + "5x5", p + "relu_5x5", b3[1], 5, pad=2)
    y4 = m.max_pool(x, p + "pool", 3, 1, 1)
    y4 = m.conv_relu(y4, p + "pool_proj", p + "relu_pool_proj", b4, 1)
    return og.concat([y1, y2, y3, y4], dim=1, name=name)


def build(batch: int | None = None, dtype: str = "float32") -> Model:
    """GoogLeNet v1 on a (batch, 3, 224, 224) input; ``batch=None`` is 128.

    Raises:
        ParameterError: ``batch`` is not an int >= 0.
    """
    m = ModelBuilder("googlenet", "googlenet_v1", "GoogLeNet v1",
                     input_chw=(3, 224, 224), batch=batch, seed_batch=SEED_BATCH, dtype=dtype)
    x = m.conv_relu(m.input, "conv1/7x7_s2", "conv1/relu_7x7", 64, 7, stride=2, pad=3)
    x = m.max_pool(x, "pool1/3x3_s2", 3, 2, 1)
    x = m.conv_relu(x, "conv2/3x3_reduce", "conv2/relu_3x3_reduce", 64, 1)
    x = m.conv_relu(x, "conv2/3x3", "conv2/relu_3x3", 192, 3, pad=1)
    x = m.max_pool(x, "pool2/3x3_s2", 3, 2, 1)
    for name in ("inception_3a", "inception_3b"):
        x = inception(m, x, name, *INCEPTIONS[name])
    x = m.max_pool(x, "pool3/3x3_s2", 3, 2, 1)
    for name in ("inception_4a", "inception_4b", "inception_4c", "inception_4d", "inception_4e"):
        x = inception(m, x, name, *INCEPTIONS[name])
    x = m.max_pool(x, "pool4/3x3_s2", 3, 2, 1)
    for name in ("inception_5a", "inception_5b"):
        x = inception(m, x, name, *INCEPTIONS[name])
    x = m.avg_pool(x, "pool5/7x7_s1", 7, 1)
    x = og.flatten(x, 1, name="flatten")
    x = m.linear(x, "loss3/classifier", 1000)
    return m.finish(og.relu(x, name="loss3/relu"))


__all__ = ["build", "inception", "INCEPTIONS", "SEED_BATCH"]
