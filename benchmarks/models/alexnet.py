"""AlexNet, single-column "One weird trick" variant, as the seed benchmarked it.

Source: soumith/convnet-benchmarks ``torch7/imagenet_winners/alexnet.lua``
(Krizhevsky, arXiv 1404.5997; cuda-convnet2 ``layers-imagenet-1gpu.cfg``):
64/192/384/256/256 feature maps, no LRN, no grouping, input 3x224x224,
seed batch 128. Spec: ``imagenet_winners.json`` key ``alexnet``.

Shapes per image: conv1 64x55x55 -> pool1 64x27x27 -> conv2 192x27x27 ->
pool2 192x13x13 -> conv3 384 -> conv4 256 -> conv5 256 (13x13) -> pool5
256x6x6 -> fc6 4096 -> fc7 4096 -> fc8 1000. 61.1 M parameters,
1.428 GFLOP forward per image.
"""

from __future__ import annotations

from .common import Model, ModelBuilder

SEED_BATCH = 128


def build(batch: int | None = None, dtype: str = "float32") -> Model:
    """AlexNet on a (batch, 3, 224, 224) input; ``batch=None`` is the seed's 128.

    Raises:
        ParameterError: ``batch`` is not an int >= 0.
    """
    m = ModelBuilder("alexnet", "alexnet", "AlexNet (One weird trick)",
                     input_chw=(3, 224, 224), batch=batch, seed_batch=SEED_BATCH, dtype=dtype)
    x = m.conv_relu(m.input, "conv1", "relu1", 64, 11, stride=4, pad=2)
    x = m.max_pool(x, "pool1", 3, 2)
    x = m.conv_relu(x, "conv2", "relu2", 192, 5, pad=2)
    x = m.max_pool(x, "pool2", 3, 2)
    x = m.conv_relu(x, "conv3", "relu3", 384, 3, pad=1)
    x = m.conv_relu(x, "conv4", "relu4", 256, 3, pad=1)
    x = m.conv_relu(x, "conv5", "relu5", 256, 3, pad=1)
    x = m.max_pool(x, "pool5", 3, 2)
    return m.finish(m.classifier(x, hidden=(4096, 4096)))


__all__ = ["build", "SEED_BATCH"]
