"""The benchmark models, written in the opgraph DSL.

``MODELS`` maps each registry name to a builder ``build(batch=None,
dtype='float32') -> Model`` (``batch=None``: the seed's batch). The names
follow the seed benchmark; ``ALIASES`` accepts the spec keys too.
"""

from __future__ import annotations

from . import alexnet, googlenet, layer_suite, overfeat, vgg
from .common import Model, ModelBuilder

#: The four ImageNet winners, in the seed README's order.
WINNERS = ("alexnet", "overfeat", "vgg_a", "googlenet")
#: The single-convolution layer suite.
LAYERS = tuple(layer_suite.LAYERS)

MODELS = {
    "alexnet": alexnet.build,
    "overfeat": overfeat.build,
    "vgg_a": vgg.build_vgg_a,
    "googlenet": googlenet.build,
    **layer_suite.BUILDERS,
}

#: The seed benchmark's mini-batch of each model.
SEED_BATCHES = {
    "alexnet": alexnet.SEED_BATCH,
    "overfeat": overfeat.SEED_BATCH,
    "vgg_a": vgg.SEED_BATCH,
    "googlenet": googlenet.SEED_BATCH,
    **{name: layer_suite.SEED_BATCH for name in layer_suite.LAYERS},
}

#: Other accepted names (the spec keys) -> registry name.
ALIASES = {"overfeat_fast": "overfeat", "googlenet_v1": "googlenet", "vgg": "vgg_a"}


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


__all__ = ["MODELS", "SEED_BATCHES", "ALIASES", "WINNERS", "LAYERS", "Model", "ModelBuilder",
           "resolve", "build"]
