"""OverFeat "fast", as the seed benchmarked it.

Source: soumith/convnet-benchmarks ``torch7/imagenet_winners/overfeat.lua``
(Sermanet et al., arXiv 1312.6229): input 3x231x231, seed batch 128, no
padding in conv1/conv2, 2x2 max pools. Spec: ``imagenet_winners.json`` key
``overfeat_fast``.

Shapes per image: conv1 96x56x56 -> pool1 96x28x28 -> conv2 256x24x24 ->
pool2 256x12x12 -> conv3 512 -> conv4 1024 -> conv5 1024 (12x12) -> pool5
1024x6x6 -> fc6 3072 -> fc7 4096 -> fc8 1000. 145.9 M parameters,
5.603 GFLOP forward per image.
"""

from __future__ import annotations

from .common import Model, ModelBuilder

SEED_BATCH = 128


def build(batch: int | None = None, dtype: str = "float32") -> Model:
    """OverFeat-fast on a (batch, 3, 231, 231) input; ``batch=None`` is 128.

    Raises:
        ParameterError: ``batch`` is not an int >= 0.
    """
    m = ModelBuilder("overfeat", "overfeat_fast", "OverFeat [fast]",
                     input_chw=(3, 231, 231), batch=batch, seed_batch=SEED_BATCH, dtype=dtype)
    x = m.conv_relu(m.input, "conv1", "relu1", 96, 11, stride=4)
    x = m.max_pool(x, "pool1", 2, 2)
    x = m.conv_relu(x, "conv2", "relu2", 256, 5)
    x = m.max_pool(x, "pool2", 2, 2)
    x = m.conv_relu(x, "conv3", "relu3", 512, 3, pad=1)
    x = m.conv_relu(x, "conv4", "relu4", 1024, 3, pad=1)
    x = m.conv_relu(x, "conv5", "relu5", 1024, 3, pad=1)
    x = m.max_pool(x, "pool5", 2, 2)
    return m.finish(m.classifier(x, hidden=(3072, 4096)))


__all__ = ["build", "SEED_BATCH"]
