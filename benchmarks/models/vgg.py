"""VGG configuration A ("OxfordNet model A", 11 weight layers), as the seed
benchmarked it.

Source: soumith/convnet-benchmarks ``torch7/imagenet_winners/vgg_a.lua``
(Simonyan & Zisserman, arXiv 1409.1556): 3x3 convolutions with padding 1,
2x2 max pools, input 3x224x224, seed batch 64. The seed file also holds the
B/D/E tables but only builds A. Spec: ``imagenet_winners.json`` key ``vgg_a``.

Shapes per image: 64x224 -> pool1 112 -> 128 -> pool2 56 -> 256, 256 ->
pool3 28 -> 512, 512 -> pool4 14 -> 512, 512 -> pool5 512x7x7 -> fc6 4096 ->
fc7 4096 -> fc8 1000. 132.9 M parameters, 15.22 GFLOP forward per image.
"""

from __future__ import annotations

from .common import Model, ModelBuilder

SEED_BATCH = 64

#: Configuration A: output channels of each 3x3 convolution, "M" a 2x2 max pool.
CFG_A = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


def build_vgg_a(batch: int | None = None, dtype: str = "float32") -> Model:
    """VGG-A on a (batch, 3, 224, 224) input; ``batch=None`` is the seed's 64.

    Layers are named as in the spec: conv1..conv8 each followed by
    relu1..relu8, pools pool1..pool5, then the classifier fc6..fc8.

    Raises:
        ParameterError: ``batch`` is not an int >= 0.
    """
    m = ModelBuilder("vgg_a", "vgg_a", "VGG model A (OxfordNet)",
                     input_chw=(3, 224, 224), batch=batch, seed_batch=SEED_BATCH, dtype=dtype)
    x, conv, pool = m.input, 0, 0
    for item in CFG_A:
        if item == "M":
            pool += 1
            x = m.max_pool(x, f"pool{pool}", 2, 2)
        else:
            conv += 1
            x = m.conv_relu(x, f"conv{conv}", f"relu{conv}", item, 3, pad=1)
    return m.finish(m.classifier(x, hidden=(4096, 4096)))


build = build_vgg_a

__all__ = ["build", "build_vgg_a", "CFG_A", "SEED_BATCH"]
