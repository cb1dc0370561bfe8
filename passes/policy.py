"""``LoweringPolicy``: which implementation each node gets, as configuration.

The user swaps implementations here, never in the model. A policy holds

* ``prefer``: op-type key -> algorithms tried first, in order (then the
  device's default order, then any other registered rule);
* ``force``: node name (or ``fnmatch`` pattern) -> the one algorithm it must
  get; a convolution's name stands for its backward nodes too, and
  ``name:forward`` / ``name:backward_data`` / ``name:backward_filter``
  narrows it to one direction (``passes/force.py``); an algorithm that
  declines the node is a ``LoweringError``;
* ``include`` / ``exclude``: algorithm names or rule tags (Theano's
  ``optimizer_including`` / ``optimizer_excluding``): excluded rules are never
  candidates; rules tagged ``optional`` are candidates only when included;
* ``engine_limits``: ``force``-style keys -> an ``engine_limit`` for the
  nodes they name (every cuDNN engine on one layer while the rest keep the
  default: the key of those nodes' autotune decisions alone changes);
* ``autotune``, ``workspace_limit`` (bytes), ``workspace_tolerance`` (a
  fraction: autotune keeps the smallest-workspace candidate within it of the
  fastest), ``peak_tolerance`` (a fraction: autotune gives a node whose
  workspace raises the planned peak above the lowest reachable one a
  candidate within it of the fastest that keeps its step under that peak), ``engine_limit`` (how many cuDNN engines per node autotune times,
  in cuDNN's heuristic order), ``tune_clock`` (what autotune's clock measures), ``precision``, ``layout``, ``explicit_padding`` (algorithms the
  legalize pass pads for), ``cache``, ``cuda_graph`` (autotune prefers
  candidates a CUDA graph can capture).

Op-type keys are op class names (``Conv2d``, case-insensitive), family aliases
(:data:`ALIASES`, derived from each op's ``family`` and ``direction``
declaration: ``conv`` = the convolution ops, ``conv_fwd`` / ``conv_dgrad`` /
``conv_wgrad`` one direction each, ``pool``, ...) or ``*`` (every op). A
node's preference list concatenates every key covering its type, most
specific first (op name, then direction alias, then family, then ``*``).

TOML schema (``LoweringPolicy.from_toml``; every key optional)::

    autotune = false              # bool: time candidates (passes/autotune.py)
    workspace_limit = "512MiB"    # whole bytes, or a string with B/KB/MB/GB/KiB/MiB/GiB
    workspace_tolerance = 0.03    # 0..1 or "3%": autotune keeps the smallest workspace
                                  # among candidates within 3 % of the fastest; 0 = off
    peak_tolerance = 0.20         # 0..1 or "20%": a node whose workspace raises the planned
                                  # peak above the lowest reachable one gets the fastest candidate
                                  # within 20 % of its fastest that keeps it there; 0 = off
    engine_limit = 10             # int >= 1 or "all": cuDNN engines timed per node, in
                                  # heuristic order (PyTorch's cudnn.benchmark_limit, 10)
    tune_clock = "device"         # device | launch: autotune times each candidate's kernels
                                  # alone on the GPU (the stream held while they are queued),
                                  # or from its launch, host gaps included (CPU: wall time both)
    precision = "fp32"            # fp32 | tf32 | bf16 | fp16 (opgraph/precision.py); fp32 on
                                  # float16/bfloat16 storage means the storage's own (fp16/bf16)
    layout = "NCHW"               # NCHW | NHWC (NHWC only acted on for cuda)
    include = ["fused-reference"] # algorithm names, rule tags or fusion rules (passes/policy_names.py)
    exclude = ["winograd"]
    explicit_padding = ["fft"]    # registered algorithms given explicit Pad nodes ("*" = all)
    cache = "~/.cache/opgraph/autotune.json"
    cuda_graph = false            # bool: the step is replayed as CUDA graphs, so autotune
                                  # picks a capturable candidate unless an uncapturable one saves
                                  # more than a split of the replay costs (needs autotune)

    [prefer]                      # key -> algorithm or list of algorithms
    conv = ["fft", "gemm"]
    conv_wgrad = "gemm"

    [force]                       # node name or fnmatch pattern -> algorithm
    "conv2" = "fft"               # conv2 in all three directions
    "conv3:backward_filter" = "gemm"   # one direction

    [engine_limits]               # node name or pattern (force's keys) -> engine_limit there
    "conv1:backward_filter" = "all"    # every engine on one node, 10 elsewhere

``docs/policy.md`` has a commented example.
"""

from __future__ import annotations

import math
import numbers
import os
import re
import sys
from numbers import Real
from types import MappingProxyType
from typing import Any, Mapping

import attrs

from opgraph import ops
from opgraph import precision as precisions
from opgraph.errors import ParameterError, did_you_mean
from opgraph.precision import PRECISIONS  # re-exported: the CLI lists them
from opgraph.types import LAYOUTS  # the layout key's choices; kept in __all__ for callers of this module

from .force import DIRECTIONS, forced_algorithm, misspelt_direction

#: What autotune's clock measures (``LoweringPolicy.tune_clock``).
TUNE_CLOCKS = ("device", "launch")
OP_TYPES = tuple(sorted(ops.__all__))


def _family_aliases() -> dict[str, tuple[str, ...]]:
    """``family`` and ``family_direction`` -> the op names declaring them
    (``Op.family``, ``Op.direction``): an op added to ``opgraph.ops`` gets
    its aliases from its own declaration."""
    out: dict[str, list[str]] = {}
    for name in OP_TYPES:
        op = getattr(ops, name)
        if op.family is not None:
            out.setdefault(op.family, []).append(name)
            if op.direction is not None:
                out.setdefault(f"{op.family}_{op.direction}", []).append(name)
    return {k: tuple(v) for k, v in sorted(out.items())}


#: Family and direction aliases usable as ``prefer`` keys (``conv``,
#: ``conv_fwd``, ``conv_dgrad``, ``conv_wgrad``, ``pool``, ``relu``, ``lrn``,
#: ``linear``, ``softmax``, ``norm``, ...), and ``*`` for every op.
ALIASES: dict[str, tuple[str, ...]] = {**_family_aliases(), "*": OP_TYPES}
#: The convolution ops: their default order is the device's conv order.
CONV_OPS = ALIASES["conv"]

#: Default candidate order per device: convolutions, then every other op.
#: CPU convolutions: gemm first, then direct. Measured on the 2-core CI machine
#: (NumPy 2.4, batch 4, forward / backward-data / backward-filter, ms):
#: gemm was fastest or within 2x of the fastest on L1-L5, AlexNet and VGG layers;
#: direct (O(input + output) memory, never declines) beat it on some
#: backward-data layers and is the safe fallback when gemm declines a GEMM
#: dimension >= 2^31; winograd (3x3 only) ran 1.5-4x slower than gemm and fft
#: 2-30x slower (numpy's pocketfft, stride handled by subsampling). So both
#: are reached on the CPU only through ``prefer``, ``force`` or autotune.
#: CUDA: cuDNN first, then our depthwise kernels (``cuda``: the stride-1
#: forward, backward-data and backward-filter, which decline any other
#: convolution: autotune candidates), the unfolded
#: few-channel convolution on cuBLAS (``unfold``, an autotune candidate too),
#: then the xp kernels; non-conv ops: generated kernels
#: (``codegen``: memory-bound ops and fused chains, 16-byte accesses, capturable),
#: then our hand-written CuPy kernels (``cuda``: pooling, LRN, softmax, losses),
#: cuBLAS for the matrix products (capturable through nvmath-python), and the
#: xp reference last (no step of a benchmark model reaches it on a GPU).
DEFAULT_ORDER: dict[str, dict[str, tuple[str, ...]]] = {
    "cpu": {"conv": ("gemm", "direct", "winograd", "fft", "fft-chunked"), "*": ("reference",)},
    "cuda": {"conv": ("cudnn", "cuda", "unfold", "gemm", "fft", "fft-chunked", "winograd", "direct"),
             "*": ("codegen", "cuda", "cublas", "reference")},
}


class PolicyError(ParameterError):
    """A bad policy key or value (the message names the key, value and source)."""


def _err(key: str, value, why: str, source: str | None = None) -> PolicyError:
    return PolicyError(f"{source}: {key}" if source else key, value, why)


def _types_of(key: str) -> tuple[str, ...] | None:
    if key in ALIASES:
        return ALIASES[key]
    for name in OP_TYPES:
        if name.lower() == key.lower():
            return (name,)
    return None


def _algo_list(key: str, value, registered_only: bool = True, shown=None) -> tuple[str, ...]:
    """Algorithm names of ``value`` (a name or a list); with ``registered_only``
    each must be a registered algorithm (include/exclude also take tags).
    ``shown``: the value as the user wrote it, for the error (a flag's
    ``fft+gemm`` rather than the list it was split into).

    Raises:
        PolicyError: a malformed or (``registered_only``) unknown name.
    """
    items = [value] if isinstance(value, str) else value
    shown = value if shown is None else shown
    if not isinstance(items, (list, tuple)) or not items or not all(
            isinstance(a, str) and re.fullmatch(r"[A-Za-z0-9_.\-]+", a) for a in items):
        raise _err(key, shown, "must be an algorithm name or a non-empty list of algorithm names")
    if not registered_only:
        return tuple(items)
    from opgraph.backends.registry import algorithms  # a typo must not fall back silently

    known = algorithms()
    unknown = [a for a in items if a not in known]
    if unknown:
        raise _err(key, shown, f"unknown algorithm {unknown[0]!r}{did_you_mean(unknown[0], known)}; "
                   f"registered: {', '.join(sorted(known))}")
    return tuple(items)


def _prefer(value) -> Mapping[str, tuple[str, ...]]:
    if not isinstance(value, Mapping):
        raise _err("prefer", value, "must be a mapping of op type / alias -> algorithms")
    out = {}
    for key, algos in value.items():
        if not isinstance(key, str) or _types_of(key) is None:
            hint = did_you_mean(key, [*ALIASES, *OP_TYPES]) if isinstance(key, str) else ""
            raise _err(f"prefer.{key}", algos, f"unknown op type or alias {key!r}{hint}; use an op name "
                       f"({', '.join(OP_TYPES[:4])}, ...) or one of {', '.join(sorted(ALIASES))}")
        out[key] = _algo_list(f"prefer.{key}", algos)
    return MappingProxyType(out)


def _force(value) -> Mapping[str, str]:
    if not isinstance(value, Mapping):
        raise _err("force", value, "must be a mapping of node name -> algorithm")
    for key, algo in value.items():
        if not isinstance(key, str) or not key or not isinstance(algo, str) or not algo:
            raise _err(f"force.{key}", algo, "node name and algorithm must be non-empty strings")
        _algo_list(f"force.{key}", algo)  # a typo is a policy error, not a column's failure later
        typo = misspelt_direction(key)
        if typo:  # else the key named a node 'conv2:forwards', which forces nothing
            word, close = typo
            forward, *rest = (f":{d}" for d in DIRECTIONS.values())
            raise _err(f"force.{key}", algo, f"unknown direction {word!r}{close}; a key narrows a layer to one "
                                             f"direction with {', '.join([forward, *rest[:-1]])} or {rest[-1]}")
    return MappingProxyType(dict(value))


def _engine_limits(value) -> Mapping[str, int | None]:
    """``engine_limits``: node keys as ``force``'s (a direction suffix checked the same
    way) -> :func:`parse_engine_limit` values."""
    if not isinstance(value, Mapping):
        raise _err("engine_limits", value, 'must be a mapping of node name -> engine limit (e.g. '
                   '{"conv1:backward_filter": "all"})')
    out = {}
    for key, limit in value.items():
        if not isinstance(key, str) or not key:
            raise _err(f"engine_limits.{key}", limit, "node names must be non-empty strings")
        typo = misspelt_direction(key)
        if typo:
            word, close = typo
            raise _err(f"engine_limits.{key}", limit, f"unknown direction {word!r}{close}")
        out[key] = parse_engine_limit(limit, f"engine_limits.{key}")
    return MappingProxyType(out)


def _names(param: str):
    def convert(value) -> frozenset:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple, set, frozenset)) or not all(
                isinstance(a, str) and a for a in items):
            raise _err(param, value, "must be a list of algorithm names or tags")
        return frozenset(items)
    return convert


def _padding_algorithms(value) -> frozenset:
    """``explicit_padding``: registered algorithm names, or ``"*"`` for all of them.

    Raises:
        PolicyError: not a list of names, or an unknown algorithm (with the close ones),
            as ``prefer`` and ``force`` refuse one: a typo would pad nothing, silently.
    """
    names = _names("explicit_padding")(value)
    named = sorted(names - {"*"})
    if named:
        _algo_list("explicit_padding", named, shown=value)
    return names


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
#: The units as an error lists them: spelt as people write them (any case is read).
_UNIT_NAMES = "B, kB, MB, GB, TB, KiB, MiB, GiB, TiB"


def parse_bytes(value, key: str = "workspace_limit") -> int | None:
    """Bytes from an int, ``None`` (no limit) or a string like ``'512MiB'``, ``'2GB'``,
    ``'1.5e9'``. A count in bytes must be whole (``1.5`` or ``'1.5'`` is refused:
    ``1.5`` meant as gigabytes would otherwise be a limit of 1 byte); one with a
    larger unit is rounded down to whole bytes (``'1.1KiB'`` = 1126).

    Raises:
        PolicyError: naming ``key``: a negative, NaN or infinite number (1e400
            is infinite), a fraction of a byte, a malformed number
            (``'1.2.3MiB'``), an unknown unit or another type.
    """
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "")):
        return None
    if isinstance(value, bool):
        raise _err(key, value, "must be a byte count")
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]*)\s*", value)
        if not m or m.group(2).lower() not in _UNITS:
            unit = m.group(2) if m else ""
            # any case is read, so compared in any case; the bare B is never offered: difflib
            # found it close to any two-letter unit ('12XB': did you mean 'B'?), never what was meant
            close = did_you_mean(unit, [u for u in _UNIT_NAMES.split(", ") if u != "B"], str.lower)
            hint = f"; unknown unit {unit!r}{close}" if unit else ""
            raise _err(key, value, f"must be bytes, e.g. 1073741824, '512MiB' or '2GB'{hint} "
                                   f"(units {_UNIT_NAMES})")
        unit = _UNITS[m.group(2).lower()]
        number = float(m.group(1)) * unit
    elif isinstance(value, Real):  # NumPy numbers too
        number, unit = value, 1
    else:
        raise _err(key, value, "must be a byte count or a string such as '512MiB'")
    if number != number or number in (math.inf, -math.inf):  # NaN, or 1e400 read as a float
        raise _err(key, value, "must be a finite number of bytes (leave it unset for no limit)")
    if number < 0:
        raise _err(key, value, "must be >= 0")
    if unit == 1 and number != math.floor(number):  # 1.5 meant as 1.5 GiB would be a limit of 1 byte
        count = m.group(1) if isinstance(value, str) else value
        raise _err(key, value, f"must be a whole number of bytes; a size in a larger unit takes it, "
                               f"e.g. '{count}GiB' (units {_UNIT_NAMES})")
    return int(number)


def parse_fraction(value, key: str = "workspace_tolerance") -> float:
    """A fraction in [0, 1] from a number or a string (``0.03``, ``'0.03'``, ``'3%'``).

    Raises:
        PolicyError: another type, NaN, or a value outside [0, 1] (``3`` meant
            as 3 % is an error: write ``0.03`` or ``'3%'``).
    """
    number = value
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(%?)\s*", value)
        number = float(m.group(1)) / (100 if m.group(2) else 1) if m else None
    # numbers.Real: a NumPy float is a number too; a bool is not
    if isinstance(number, bool) or not isinstance(number, numbers.Real) or not 0 <= number <= 1:
        raise _err(key, value, "must be a fraction from 0 to 1, e.g. 0.05 or '5%' (0 turns it off)")
    return float(number)


#: cuDNN engines autotune times per node unless the policy says otherwise (PyTorch's
#: ``torch.backends.cudnn.benchmark_limit``: :func:`parse_engine_limit`).
DEFAULT_ENGINE_LIMIT = 10


def parse_engine_limit(value, key: str = "engine_limit") -> int | None:
    """How many cuDNN engines autotune times per node: an int >= 1, or
    ``"all"`` / ``None`` for every engine that builds.

    The first engines in cuDNN's heuristic order are the likely fastest, and
    building a plan costs host time (tens of ms each, about 48 plans per
    convolution on the H200): timing them all made autotuning ResNet-50 take
    five minutes. PyTorch caps ``cudnn.benchmark`` the same way
    (``torch.backends.cudnn.benchmark_limit``, default 10).

    Raises:
        PolicyError: another type, or a number below 1.
    """
    if value is None or (isinstance(value, str) and value.strip().lower() == "all"):
        return None
    number = value
    if isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        hint = did_you_mean(value.strip().lower(), ["all"]) if isinstance(value, str) else ""
        raise _err(key, value, f'must be a whole number >= 1, or "all" for every engine that builds{hint}')
    return number


def _precision(inst, attribute, value):
    try:
        precisions.check(value)
    except ParameterError as e:
        raise _err(e.param, e.value, e.why) from None


def _choice(key: str, allowed):
    def check(inst, attribute, value):
        if value not in allowed:
            raise _err(key, value, f"must be one of {', '.join(allowed)}"
                                   f"{did_you_mean(value, allowed)}")
    return check


def _path(value) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise _err("cache", value, "must be a file path")
    text = str(value)
    # "of" or "of f" meant "off": as a path it would quietly start a cache file in the working folder
    hint = did_you_mean(text.strip().lower(), ["off"])
    named_file = text.lower().endswith((".json", ".json.gz"))  # autotune_cache.locate's file suffixes
    if hint and text.strip().lower() != "off" and not named_file and not os.path.exists(text):
        raise _err("cache", value, f"not 'off' and no existing file or *.json / *.json.gz path{hint}")
    return text


def _flag(name: str):
    def convert(value) -> bool:
        if not isinstance(value, bool):
            raise _err(name, value, "must be true or false")
        return value
    return convert


def _cuda_graph_needs_autotune(policy, attribute, value) -> None:
    if value and not policy.autotune:
        raise _err("cuda_graph", value, "acts on autotune's choice among timed candidates; "
                   "turn autotune on (the lowering 'auto')")


@attrs.frozen
class LoweringPolicy:
    """How the passes choose implementations (see the module docstring).

    Raises:
        PolicyError: a bad key or value, naming it.
    """

    prefer: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict, converter=_prefer)
    force: Mapping[str, str] = attrs.field(factory=dict, converter=_force)
    include: frozenset = attrs.field(default=frozenset(), converter=_names("include"))
    exclude: frozenset = attrs.field(default=frozenset(), converter=_names("exclude"))

    autotune: bool = attrs.field(default=False, converter=_flag("autotune"))
    workspace_limit: int | None = attrs.field(default=None, converter=parse_bytes)
    #: Autotune: among the correct, fully timed candidates whose median is within
    #: ``(1 + workspace_tolerance) x`` the fastest, the smallest workspace wins.
    workspace_tolerance: float = attrs.field(default=0.03, converter=parse_fraction)
    #: Autotune, once every node is chosen: a node whose workspace raises the
    #: planned peak above the lowest reachable one gets the fastest correct,
    #: fully timed candidate whose median is within ``(1 + peak_tolerance) x``
    #: the fastest's and that keeps its step under that peak
    #: (``passes/autotune_memory.py``); 0 keeps the time-based choice.
    peak_tolerance: float = attrs.field(default=0.20, converter=lambda v: parse_fraction(v, "peak_tolerance"))
    #: Autotune times at most this many cuDNN engines per node, the first in
    #: cuDNN's heuristic order that build (None: all of them).
    engine_limit: int | None = attrs.field(default=DEFAULT_ENGINE_LIMIT, converter=parse_engine_limit)
    #: Per-node ``engine_limit`` (``force``'s keys and precedence: :meth:`engine_limit_for`).
    engine_limits: Mapping[str, int | None] = attrs.field(factory=dict, converter=_engine_limits)
    #: What autotune's clock measures on the GPU: ``'device'``, each candidate's
    #: kernels alone (``backends/cuda/held_stream.py``: the step is replayed as
    #: CUDA graphs, with no host time between kernels), or ``'launch'``, two
    #: events around each call, the host's launch time included when the
    #: kernels are shorter than it. On the CPU both are the wall clock.
    tune_clock: str = attrs.field(default="device", validator=_choice("tune_clock", TUNE_CLOCKS))
    #: The precision asked of compute-bound kernels (``opgraph/precision.py``);
    #: each node gets ``precision.resolve(precision, its storage)``: this,
    #: except that ``fp32`` on half storage is the storage's own.
    precision: str = attrs.field(default="fp32", validator=_precision)
    layout: str = attrs.field(default="NCHW", validator=_choice("layout", LAYOUTS),
                              converter=lambda v: v.upper() if isinstance(v, str) else v)  # nhwc = NHWC
    explicit_padding: frozenset = attrs.field(default=frozenset(), converter=_padding_algorithms)
    cache: str | None = attrs.field(default=None, converter=_path)
    #: The step will be replayed as CUDA graphs: autotune chooses among the
    #: correct candidates whose rule and variant do not declare themselves
    #: uncapturable (``Rule.declared_capture_blocker``) whenever there is one, since such a
    #: step runs eagerly between the graphs of the replay (``opgraph/graph_replay.py``).
    #: Needs ``autotune``.
    cuda_graph: bool = attrs.field(default=False, converter=_flag("cuda_graph"),
                                   validator=_cuda_graph_needs_autotune)

    @exclude.validator
    def _not_both(self, attribute, value):
        both = sorted(set(value) & set(self.include))
        if both:  # exclude would win without a word: a contradiction the user should resolve
            raise PolicyError("exclude", both, f"also in include={both}: a name may be in one of them")

    # ---- queries used by the passes --------------------------------------
    def preferred(self, op_type: str) -> tuple[str, ...]:
        """Algorithms ``prefer`` lists for ``op_type``, most specific key first."""
        keys = [k for k in self.prefer if k == "*" or op_type in _types_of(k)]  # '*': any op, ours or not
        keys.sort(key=lambda k: (k == "*", len(_types_of(k)), k in ALIASES))  # op names beat aliases
        return _dedupe(a for k in keys for a in self.prefer[k])

    def order(self, op_type: str, device: str) -> tuple[str, ...]:
        """Candidate order for ``op_type`` on ``device``: preferred, then default."""
        table = DEFAULT_ORDER.get(device, DEFAULT_ORDER["cpu"])
        default = table["conv"] if op_type in CONV_OPS else table["*"]
        return _dedupe((*self.preferred(op_type), *default))

    def forced(self, node_name: str, direction: str | None = None, lowers=None) -> str | None:
        """The algorithm forced for ``node_name``, whose op has ``direction``
        (``Op.direction``): a key names a node, or a layer in all its
        directions or one (``conv2``, ``conv2:backward_data``); an exact key
        wins over patterns, and a pattern skips the nodes whose op the
        algorithm has no rule for (``lowers(algorithm)``; ``passes/force.py``)."""
        return forced_algorithm(self.force, node_name, direction, lowers)

    def engine_limit_for(self, node_name: str, direction: str | None = None) -> int | None:
        """The ``engine_limit`` of node ``node_name`` (whose op has ``direction``): the value
        of the ``engine_limits`` key that names it, by ``force``'s precedence
        (``passes/force.py``: an exact name, a pattern, the layer in its direction, the
        layer), else the policy's ``engine_limit``. None: every engine that builds."""
        key = forced_algorithm({k: k for k in self.engine_limits}, node_name, direction)
        return self.engine_limit if key is None else self.engine_limits[key]

    def exclusion(self, algorithm: str, tags) -> str | None:
        """Why the policy keeps rule (``algorithm``, ``tags``) out, or None."""
        names = {algorithm, *tags}
        hit = sorted(names & self.exclude)
        if hit:
            return f"excluded by policy (exclude={hit})"
        if "optional" in tags and not names & self.include:
            return f"opt-in rule (tag 'optional'): add {algorithm!r} to include"
        return None

    def needs_explicit_padding(self, algorithm: str) -> bool:
        return algorithm in self.explicit_padding or "*" in self.explicit_padding

    def to_dict(self) -> dict:
        """JSON/TOML-ready form (what ``from_mapping`` reads back)."""
        d = {"prefer": {k: list(v) for k, v in self.prefer.items()}, "force": dict(self.force),
             "include": sorted(self.include), "exclude": sorted(self.exclude),
             "autotune": self.autotune, "workspace_limit": self.workspace_limit,
             "workspace_tolerance": self.workspace_tolerance, "peak_tolerance": self.peak_tolerance,
             "engine_limit": "all" if self.engine_limit is None else self.engine_limit,
             "engine_limits": {k: "all" if v is None else v for k, v in self.engine_limits.items()},
             "tune_clock": self.tune_clock,
             "precision": self.precision, "layout": self.layout,
             "explicit_padding": sorted(self.explicit_padding), "cache": self.cache,
             "cuda_graph": self.cuda_graph or None}
        return {k: v for k, v in d.items() if v not in (None, [], {})}

    def idle_autotune_keys(self) -> list[str]:
        """The keys only autotune reads (``engine_limit``, ``engine_limits``, ``tune_clock``,
        ``workspace_tolerance``, ``peak_tolerance``) that this policy sets away
        from their defaults while ``autotune`` is off, as ``'key=value'``: they
        have no effect, which the compile notes rather than ignoring them silently."""
        if self.autotune:
            return []
        defaults = {f.name: f.default for f in attrs.fields(type(self))}
        shown = self.to_dict()  # engine_limit None reads "all"
        keys = ("engine_limit", "tune_clock", "workspace_tolerance", "peak_tolerance")
        idle = [f"{k}={shown[k]!r}" for k in keys if getattr(self, k) != defaults[k]]
        return idle + ([f"engine_limits={shown['engine_limits']!r}"] if self.engine_limits else [])

    # ---- construction from files and flags -------------------------------
    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str = "policy") -> "LoweringPolicy":
        """A policy from a dict with the TOML schema's keys.

        Raises:
            PolicyError: an unknown key or a bad value, prefixed by ``source``.
        """
        fields = {f.name for f in attrs.fields(cls)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise _err(unknown[0], data[unknown[0]], f"unknown policy key{did_you_mean(unknown[0], fields)}; "
                       f"known keys: {', '.join(sorted(fields))}", source)
        try:
            return cls(**dict(data))
        except PolicyError as e:
            raise _err(e.param, e.value, e.why, source) from None

    @classmethod
    def from_toml(cls, path, flag: str | None = None) -> "LoweringPolicy":
        """Read a policy file (schema in the module docstring); ``flag`` is the
        command-line flag that named it (``--policy``), named in its errors as
        every other flag's bad value is.

        Raises:
            PolicyError: unreadable or invalid TOML, unknown key, bad value
                (the message names the flag, the file, the key and the value).
        """
        what = flag or "policy file"
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover
            import tomli as tomllib
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except OSError as e:
            raise _err(what, str(path), f"cannot be read ({e.strerror})") from None
        except tomllib.TOMLDecodeError as e:
            raise _err(what, str(path), f"is not valid TOML ({e})") from None
        except UnicodeDecodeError as e:
            raise _err(what, str(path), f"is not UTF-8 text, as TOML must be ({e.reason} "
                       f"at byte {e.start})") from None
        return cls.from_mapping(data, source=f"{flag} {path}" if flag else str(path))

    @classmethod
    def from_cli(cls, lowering: str | None = None, policy_file=None, autotune: bool = False,
                 precision: str | None = None, workspace_limit=None,
                 workspace_tolerance=None, engine_limit=None, peak_tolerance=None) -> "LoweringPolicy":
        """A policy from command-line strings; flags override the file.

        ``lowering`` is a comma-separated list of items:

        * ``KEY=ALGO`` or ``KEY=ALGO+ALGO``: prefer (``conv=fft+gemm``; a key
          given twice appends);
        * a bare ``ALGO``: preferred for every op (``gemm``, ``fft``);
        * ``auto``: turn autotune on;
        * ``@NODE=ALGO``: force (``@conv2=fft``);
        * ``exclude=ALGO+ALGO`` / ``include=...``.

        Raises:
            PolicyError: a malformed item (named), an unknown key (``includ=``)
                or a bad value.
        """
        base = cls.from_toml(policy_file, flag="--policy") if policy_file else cls()
        prefer = {k: list(v) for k, v in base.prefer.items()}
        force, include, exclude = dict(base.force), set(base.include), set(base.exclude)
        tune = base.autotune or bool(autotune)
        cli_prefer: dict[str, list[str]] = {}
        for item in (s.strip() for s in (lowering or "").split(",")):
            if not item:
                continue
            key, sep, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if not sep:
                if key == "auto":
                    tune = True
                else:
                    cli_prefer.setdefault("*", []).extend(_algo_list("--lowering", key))
                continue
            _cli_key(key, value)  # the key before its value: 'includ=fused-reference' is a misspelt key
            algos = list(_algo_list(f"--lowering {key}", [a.strip() for a in value.split("+")],
                                    registered_only=key not in ("include", "exclude"), shown=value))
            if key.startswith("@"):
                force[key[1:]] = algos[0]
            elif key in ("include", "exclude"):
                (include if key == "include" else exclude).update(algos)
            else:
                cli_prefer.setdefault(key, []).extend(algos)
        for key, algos in cli_prefer.items():  # flags go before the file's preferences
            prefer[key] = algos + [a for a in prefer.get(key, []) if a not in algos]
        changes = dict(prefer=prefer, force=force, include=include, exclude=exclude, autotune=tune)
        if precision is not None:
            changes["precision"] = precision
        if workspace_limit is not None:
            changes["workspace_limit"] = workspace_limit
        if workspace_tolerance is not None:
            changes["workspace_tolerance"] = workspace_tolerance
        if engine_limit is not None:
            changes["engine_limit"] = engine_limit
        if peak_tolerance is not None:
            changes["peak_tolerance"] = peak_tolerance
        try:
            return attrs.evolve(base, **changes)
        except PolicyError as e:
            flag = {"workspace_limit": "--workspace-limit", "workspace_tolerance": "--workspace-tolerance",
                    "peak_tolerance": "--peak-tolerance", "engine_limit": "--engine-limit",
                    "precision": "--precision"}.get(e.param, "--lowering")
            raise _err(e.param, e.value, e.why, flag) from None


#: The keys of a ``KEY=VALUE`` item of ``--lowering`` besides the op keys of prefer and ``@NODE``.
CLI_KEYS = ("include", "exclude")


def _cli_key(key: str, value: str) -> None:
    """Refuse the key of a ``--lowering`` item ``KEY=VALUE`` that is none of
    ``@NODE`` (force), ``include``, ``exclude`` or an op key of prefer (an op
    name or alias): checked before the value, which would otherwise be read
    as prefer's algorithms and refused as an unknown algorithm.

    Raises:
        PolicyError: names the item, the key, the close keys and the known ones.
    """
    if key.startswith("@") or key in CLI_KEYS or _types_of(key) is not None:
        return
    # 'includ' is close to exclude too: the closest of the two keys alone, else the close op keys
    hint = did_you_mean(key, CLI_KEYS, n=1) or did_you_mean(key, [*ALIASES, *OP_TYPES], key=str.lower)
    raise _err(f"--lowering {key}", value, f"unknown key {key!r}{hint}; known keys: {', '.join(CLI_KEYS)}, "
               f"@NODE (force), or for prefer an op name ({', '.join(OP_TYPES[:4])}, ...) or one of "
               f"{', '.join(sorted(ALIASES))}")


def _dedupe(items) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


__all__ = ["LoweringPolicy", "PolicyError", "ALIASES", "DEFAULT_ORDER", "PRECISIONS", "LAYOUTS", "TUNE_CLOCKS",
           "CONV_OPS", "DEFAULT_ENGINE_LIMIT", "parse_bytes", "parse_fraction", "parse_engine_limit"]
