"""The benchmark models, written in the opgraph DSL.

``MODELS`` maps each registry name to a builder ``build(batch=None,
dtype='float32') -> Model`` (``batch=None``: the seed's batch, or for the
modern convnets the batch of ``--suite modern``). The winners' names follow
the seed benchmark, the modern convnets' torchvision's; ``ALIASES`` accepts
the spec keys and common spellings too. The modern convnets' builders also
take ``image=`` (the square input size, 224 by default).
"""

from __future__ import annotations

from . import alexnet, densenet, efficientnet, googlenet, layer_suite, mobilenet, overfeat, resnet, vgg
from .common import Model, ModelBuilder

#: The four ImageNet winners, in the seed README's order.
WINNERS = ("alexnet", "overfeat", "vgg_a", "googlenet")
#: The single-convolution layer suite.
LAYERS = tuple(layer_suite.LAYERS)
#: The modern convnets, torchvision's architectures with training-form batch norm.
MODERN = ("resnet50", "densenet121", "mobilenet_v2", "efficientnet_b0")

MODELS = {
    "alexnet": alexnet.build,
    "overfeat": overfeat.build,
    "vgg_a": vgg.build_vgg_a,
    "googlenet": googlenet.build,
    **layer_suite.BUILDERS,
    "resnet50": resnet.build,
    "densenet121": densenet.build,
    "mobilenet_v2": mobilenet.build,
    "efficientnet_b0": efficientnet.build,
}

#: The seed benchmark's mini-batch of each model; for the modern convnets the
#: batch of ``--suite modern`` (128; DenseNet-121 64).
SEED_BATCHES = {
    "alexnet": alexnet.SEED_BATCH,
    "overfeat": overfeat.SEED_BATCH,
    "vgg_a": vgg.SEED_BATCH,
    "googlenet": googlenet.SEED_BATCH,
    **{name: layer_suite.SEED_BATCH for name in layer_suite.LAYERS},
    "resnet50": resnet.SEED_BATCH,
    "densenet121": densenet.SEED_BATCH,
    "mobilenet_v2": mobilenet.SEED_BATCH,
    "efficientnet_b0": efficientnet.SEED_BATCH,
}

#: Other accepted names (the spec keys, common spellings) -> registry name.
ALIASES = {"overfeat_fast": "overfeat", "googlenet_v1": "googlenet", "vgg": "vgg_a",
           "resnet-50": "resnet50", "resnet_50": "resnet50", "densenet-121": "densenet121",
           "densenet_121": "densenet121", "mobilenetv2": "mobilenet_v2", "mobilenet-v2": "mobilenet_v2",
           "efficientnet-b0": "efficientnet_b0", "efficientnetb0": "efficientnet_b0"}


def resolve(name: str) -> str:
    """The registry name for ``name`` (a registry name, an alias or a spec key,
    case-insensitive).

    Raises:
        KeyError: unknown name; the message lists the known ones.
    """
    key = name.strip()
    lowered = {k.lower(): k for k in MODELS}
    if key.lower() in lowered:
        return lowered[key.lower()]
    if key.lower() in ALIASES:
        return ALIASES[key.lower()]
    raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)} "
                   f"(aliases: {', '.join(ALIASES)})")


def build(name: str, batch: int | None = None, dtype: str = "float32") -> Model:
    """Build the model called ``name`` (see :func:`resolve`)."""
    return MODELS[resolve(name)](batch=batch, dtype=dtype)


__all__ = ["MODELS", "SEED_BATCHES", "ALIASES", "WINNERS", "LAYERS", "MODERN", "Model", "ModelBuilder",
           "resolve", "build"]
