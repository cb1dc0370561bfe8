"""Which node a ``policy.force`` key names.

A key is matched against a node's name (``PassContext.aliases`` may give a
node the name of the one it stands for: the legalize pass's ``/unpadded``
convolution is forced as the node it came from). For a node whose op has a
direction (the convolution ops: ``Op.direction`` ``fwd``, ``dgrad``,
``wgrad``; ``Linear``), a key also names the *layer* the node belongs to:
``grad`` names a backward node ``<forward node>.grad/<op>``
(``conv2.grad/conv2d_backward_data``), so its layer is the part before
``.grad/``. A key is

* ``NAME`` (or an ``fnmatch`` pattern): the node of that name, and every
  direction of the layer of that name: ``conv2`` forces ``conv2``'s forward,
  backward-data and backward-filter;
* ``NAME:forward``, ``NAME:backward_data``, ``NAME:backward_filter``: that
  layer in that direction only.

When several keys match a node, the most specific wins: a key naming it
exactly before any pattern, and among each kind (then in the order of the
``force`` table): the node's full name (``conv2.grad/conv2d_backward_data``,
``*backward_filter``), the layer narrowed to the node's direction
(``conv2:backward_filter``, ``conv*:backward_filter``), the layer for every
direction (``conv2``, ``conv*``). A pattern that matches the layer's name
too counts as a layer key for a node with a direction, so
``{"conv*": "gemm", "conv*:backward_filter": "fft"}`` gives every
backward-filter ``fft``, and ``{"*backward_filter": "gemm",
"conv1:backward_filter": "fft"}`` gives ``conv1``'s ``fft``: an exact key
names what its writer meant (review, twenty-fifth session: as a pattern of
the full names ``conv*`` and ``*backward_filter`` outranked it). A pattern passes over the nodes
whose op its algorithm has no rule for (``conv*`` = ``fft`` leaves the bias
gradients ``conv1.grad/bias_add_backward`` alone); an exact name does not.
"""

from __future__ import annotations

import fnmatch
from typing import Callable, Iterable, Mapping

from opgraph.errors import did_you_mean
from opgraph.op import DIRECTION_NAMES

#: ``Op.direction`` -> the word a force key narrows with (the benchmark's phase names).
DIRECTIONS = DIRECTION_NAMES  # one map, declared beside Op.direction
GRAD_SCOPE = ".grad/"


def split_key(key: str) -> tuple[str, str | None]:
    """``'conv2:backward_data'`` -> ``('conv2', 'backward_data')``; a key
    without a direction suffix -> ``(key, None)``."""
    layer, sep, word = key.rpartition(":")
    if sep and word in DIRECTIONS.values() and layer:
        return layer, word
    return key, None


def misspelt_direction(key: str) -> tuple[str, str] | None:
    """``(word, ' (did you mean ...?)')`` when force key ``key`` ends in
    ``:word`` close to a direction but none (``conv2:forwards``,
    ``conv2:Forward``, ``conv2:fwd``, ``Op.direction``'s own word), else None.
    Such a key used to name a node that does not exist, with a warning at
    compile time; a ``:`` is left to a node's name (ONNX's ``conv1:0``) when
    the word is close to no direction."""
    layer, sep, word = key.rpartition(":")
    if not sep or not layer or word in DIRECTIONS.values():
        return None
    if word.lower() in DIRECTIONS:  # fwd, dgrad, wgrad: the op's words for the directions
        return word, f" (did you mean {DIRECTIONS[word.lower()]!r}?)"
    close = did_you_mean(word, DIRECTIONS.values(), key=str.lower)
    return (word, close) if close else None


def layer_of(node_name: str) -> str:
    """The forward node a node belongs to: the part of its name before
    ``.grad/`` (itself for a forward node)."""
    return node_name.split(GRAD_SCOPE, 1)[0]


def _matches(pattern: str, name: str) -> bool:
    return pattern == name or fnmatch.fnmatchcase(name, pattern)


def forced_algorithm(force: Mapping[str, str], node_name: str, direction: str | None = None,
                     lowers: Callable[[str], bool] | None = None) -> str | None:
    """The algorithm ``force`` gives node ``node_name`` whose op has
    ``direction`` (``Op.direction``; None for an op without one), by the
    precedence of the module docstring; None if no key matches.

    ``lowers(algorithm)``: whether the algorithm has a rule for the node's op. A
    *pattern* (``conv*``) skips the nodes it matches whose op the algorithm cannot
    lower: ``conv*`` = ``fft`` means the convolutions, not also the bias gradient
    named ``conv1.grad/bias_add_backward``. A key naming the node or its layer
    exactly still forces it, and the survey reports the missing rule."""
    if node_name in force:
        return force[node_name]
    usable = (lambda algo: True) if lowers is None else lowers
    word = DIRECTIONS.get(direction)
    layer = layer_of(node_name)
    ranked = []  # ((is a pattern, level: 0 full name, 1 narrowed layer, 2 layer), table order, algorithm)
    for i, (key, algo) in enumerate(force.items()):
        name, narrow = split_key(key)
        names_layer = word is not None and narrow in (None, word)
        if names_layer and name == layer:
            rank = (False, 2 if narrow is None else 1)
        elif not usable(algo):
            continue  # a pattern passes over the nodes its algorithm cannot lower
        elif narrow is None and fnmatch.fnmatchcase(node_name, name) and not (names_layer and _matches(name, layer)):
            rank = (True, 0)
        elif names_layer and fnmatch.fnmatchcase(layer, name):
            rank = (True, 2 if narrow is None else 1)
        else:
            continue
        ranked.append((rank, i, algo))
    return min(ranked)[2] if ranked else None


def matches_a_node(key: str, nodes: Iterable[tuple[str, str | None]]) -> bool:
    """Whether force key ``key`` forces one of ``nodes`` (``(name, direction)``
    pairs, as :func:`forced_algorithm` takes them), for the warning about a key
    that forces nothing: a typo, or a direction on a node without one
    (``bn/stats:forward``: batch statistics have no direction)."""
    return any(forced_algorithm({key: key}, name, direction) is not None for name, direction in nodes)


__all__ = ["DIRECTIONS", "split_key", "misspelt_direction", "layer_of", "forced_algorithm", "matches_a_node"]
