"""The lowering-rule registry: the only backend interface the passes know.

A backend module registers one :class:`Rule` per ``(abstract op type,
algorithm)``. A rule holds

* ``kernel(ctx, op, *arrays) -> array``: runs the abstract ``op`` (its
  parameters) on arrays of ``ctx.xp`` (NumPy or CuPy);
* ``check(op, in_types, device) -> str | None``: ``None`` if the rule applies
  to this node, otherwise the reason it declines (kept for reports);
* ``variants(op, in_types, device) -> list[dict]``: option sets the
  autotuner may time separately (e.g. one per cuDNN engine); default one;
* ``workspace(op, in_types, options) -> int``: scratch bytes of one call;
* ``inplace``: positions of the inputs whose buffer the kernel may write its
  output into (it then takes that array as ``out=``), for the memory pass's
  in-place plan;
* ``fresh_output``: whether the kernel's output is always a new buffer,
  never a view of (or the same array as) an input;
* ``output_view(op, in_types, out_type)``: the input whose buffer the
  output is a view of for these types, or None: the memory pass counts no
  buffer for such an output;
* ``capturable``, ``capture_requires`` and ``variant_capture_blocker``:
  whether the kernel on ``cuda`` (with a variant's options) can be captured
  into a CUDA graph (:meth:`Rule.capture_blocker`), which
  ``opgraph/graph_replay.py`` reads from the step's context and autotune
  weighs per candidate under ``cuda_graph``.
* ``writes_strided_out`` / ``contiguous_inputs``: for the zero-copy plan
  (``passes/zero_copy.py``): the kernel can write its output into a strided
  view (a channel slice of a concat's buffer), or needs dense inputs.

The device backend registers a :class:`DeviceSupport` (:func:`register_devices`):
what ``compile`` needs to know of the devices (resolving ``'auto'``, the
array module, library versions and the device's name for autotune keys).

Backends import this module and nothing else from the passes; passes import
this module and never a backend module.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, Mapping

import attrs

from opgraph.types import LAYOUTS, TensorType

Kernel = Callable[..., Any]


@attrs.frozen
class KernelContext:
    """What a kernel gets beside its op and arrays.

    Attributes:
        xp: the array module (``numpy`` or ``cupy``).
        device: ``'cpu'`` or ``'cuda'``.
        options: the node's implementation options (``Lowered.options``).
        out_type: the node's inferred output type (shape, the dtype it runs
            in, layout), filled by whoever runs a graph node (the executor,
            autotune, the benchmark's check), so that a kernel reads its
            output size instead of computing it again. ``None`` for a kernel
            called by hand: :meth:`out_shape` then asks the op.
        capture_blocker: why this step's kernel cannot be captured into a
            CUDA graph (:meth:`Rule.capture_blocker`, filled by the compiler on
            cuda), or None: ``opgraph.graph_replay`` runs a step with a reason
            eagerly without trying, and tries the others.
    """

    xp: ModuleType
    device: str = "cpu"
    options: Mapping[str, Any] = attrs.field(factory=dict)
    out_type: TensorType | None = None
    capture_blocker: str | None = None

    def out_shape(self, op, *arrays) -> tuple[int, ...]:
        """The node's output shape: ``out_type``'s, or without one the op's own
        shape rule (``op.infer``) on the arrays' shapes and dtypes: the one
        place the size is computed either way."""
        if self.out_type is not None:
            return self.out_type.shape
        return op.infer(*(TensorType(a.shape, a.dtype) for a in arrays)).shape


def _always(op, in_types, device):
    return None


def _one_variant(op, in_types, device, **listing):
    """The default: one option set, whatever ``listing`` keywords
    (``precision``, ``limit``) the rule's tags ask for."""
    return [{}]


def _no_workspace(op, in_types, options):
    return 0


def _no_view(op, in_types, out_type):
    return None


def _nothing_required() -> str | None:
    return None


def _every_variant_captures(options: Mapping[str, Any]) -> str | None:
    return None


def _positions(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return (int(value),) if isinstance(value, int) else tuple(int(v) for v in value)


def _strided_layouts(value) -> bool | frozenset:
    """``Rule.writes_strided_out`` canonicalised: a bool, or a non-empty set of
    :data:`LAYOUTS`; anything else is a ValueError naming the value."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ValueError(f"writes_strided_out={value!r}: must be a bool or a set of layouts of {sorted(LAYOUTS)}")
    layouts = frozenset(value)
    if not layouts or not layouts <= set(LAYOUTS):
        raise ValueError(f"writes_strided_out={value!r}: must be a bool or a non-empty set of layouts of "
                         f"{sorted(LAYOUTS)}")
    return layouts


@attrs.frozen
class Rule:
    """How ``algorithm`` implements ``op_type`` on ``devices``.

    Two declarations serve the memory pass's in-place plan (``passes/memory.py``):

    * ``inplace``: input positions, in order of preference, whose array the
      kernel may overwrite with its output when called as ``kernel(ctx, op,
      *arrays, out=arrays[i])`` (an int, a tuple or None). The kernel must
      then write every element of ``out`` through ``out``'s own strides and
      return ``out``; it is declared only where that input has the output's
      shape, dtype and layout whenever the op is well typed (an element-wise
      op, e.g. ReLU into its input, ReLU-backward into the output gradient,
      ``Add`` into either addend).
    * ``fresh_output``: the kernel's output never shares memory with an input
      (a new array on every call, possibly a view of a temporary of its own).
      Only a value whose producer declares it (or which was itself written
      in place) may be overwritten: a kernel returning a reshape, slice or
      transposed view of an input would leave two live values on one buffer.
      False unless declared (the safe default).
    * ``output_view(op, in_types, out_type)``: for a kernel that returns a
      view of an input when it can (a reshape of a C-ordered array, a
      transpose already stored as its output is to be), the position of that
      input when it does for these types (their shapes and layouts), else
      None. The memory pass then counts the output in its input's buffer
      (live until the last reader of either) instead of a buffer of its own.
      It must decide from the types exactly as the kernel decides from the
      arrays (None where the kernel returns a view overcounts the planned
      peak; a position where it copies undercounts it). None unless declared.

    Three declarations serve CUDA-graph capture (``opgraph/graph_replay.py``),
    where a kernel may not synchronise with the host, copy from host memory,
    allocate outside CuPy's current allocator or call a library that refuses
    stream capture (CuPy's own cuBLAS handle):

    * ``capturable``: True, the kernel captures (given ``capture_requires``);
      a string, why it never does; None, not declared (a replay then tries a
      throw-away capture of the step, as for any step). Only the ``cuda``
      device has graphs.
    * ``capture_requires()``: why the libraries that make a ``capturable``
      kernel capture-safe are missing on this machine (e.g. nvmath-python for
      our own cuBLAS handle), or None. Called when a graph is compiled, never
      at registration, so that a CPU machine imports nothing.
    * ``variant_capture_blocker(options)``: why the kernel called with these
      options (a variant's, ``Lowered.options``) never captures, or None:
      one variant of an otherwise capturable rule may call a library that
      refuses capture (the bias gradient's ``method='gemv'``, a product on
      CuPy's cuBLAS handle), and autotune must see it per candidate, not per
      rule. None for every variant unless declared.

    Two more serve the zero-copy plan (``passes/zero_copy.py``), which lets a
    concat's producers write into their slice of its buffer and runs slices
    as views:

    * ``writes_strided_out``: called as ``kernel(ctx, op, *arrays, out=v)``
      with ``v`` any view of the output's logical shape and dtype (strided,
      e.g. a channel slice of an NHWC concat buffer, whose ``is_channels_last``
      is False), the kernel writes every element of its output into ``v``
      through ``v``'s strides and returns ``v``. False unless declared; a set
      of layouts (``frozenset({'NHWC'})``) limits it to outputs of those
      layouts (:meth:`writes_strided`), the others being copied into their
      slice: cuDNN writes an NHWC channel slice at the dense graph's speed, but
      its fp32 NCHW slices ran GoogLeNet's forward convolutions 2.6x slower on
      the H200 (docs/performance.md, fifteenth session).
    * ``contiguous_inputs``: the kernel misreads an input that is a strided
      view, so no view (a zero-copy slice, a producer's region of a concat
      buffer) is ever passed to it: the plan keeps the copy instead. False by
      default because every kernel of this project reads views correctly:
      NumPy code reads through strides, and our CuPy kernels take their
      operands through ``cuda.storage.physical`` / ``in_layout``,
      ``codegen.launch`` or ``ascontiguousarray``, which copy a view that is
      neither NCHW- nor NHWC-dense (correct, at the cost of that copy).
    """

    op_type: type
    algorithm: str
    kernel: Kernel
    devices: frozenset = attrs.field(default=frozenset({"cpu", "cuda"}), converter=frozenset)
    check: Callable[..., str | None] = _always
    variants: Callable[..., list] = _one_variant
    workspace: Callable[..., int] = _no_workspace
    tags: frozenset = attrs.field(default=frozenset(), converter=frozenset)
    inplace: tuple = attrs.field(default=(), converter=_positions)
    fresh_output: bool = False
    output_view: Callable[..., int | None] = _no_view
    capturable: bool | str | None = None
    capture_requires: Callable[[], str | None] = _nothing_required
    variant_capture_blocker: Callable[[Mapping[str, Any]], str | None] = _every_variant_captures
    writes_strided_out: bool | frozenset = attrs.field(default=False, converter=_strided_layouts)
    contiguous_inputs: bool = False

    def __attrs_post_init__(self):
        if getattr(self.op_type, "fused", False):  # the fuse pass's ops (Op.fused)
            object.__setattr__(self, "tags", self.tags | {"fused"})

    def writes_strided(self, layout: str | None) -> bool:
        """Whether the kernel writes an output stored in ``layout`` (None: not
        yet decided, taken as NCHW) into a strided ``out=`` view
        (``writes_strided_out``)."""
        if isinstance(self.writes_strided_out, bool):
            return self.writes_strided_out
        return (layout or "NCHW") in self.writes_strided_out

    def decline_reason(self, op, in_types, device: str) -> str | None:
        """Why this rule cannot run ``op`` on these inputs, or None if it can."""
        if device not in self.devices:
            return f"{self.algorithm} has no {device} implementation"
        return self.check(op, in_types, device)

    def capture_blocker(self, options: Mapping[str, Any] | None = None, *,
                        installed: bool = True) -> str | None:
        """Why a step of this rule, called with ``options``, cannot be captured
        into a CUDA graph, or None.

        Args:
            options: the step's options (``Lowered.options``); None or {} for
                the rule's default variant.
            installed: also ask ``capture_requires`` (the libraries on this
                machine); False reads the declarations alone (a CPU machine
                checking what a GPU machine with the cuda extra will do).

        Returns:
            The declared reason of a ``capturable=<str>`` rule; else the
            variant's (``variant_capture_blocker``); else, for a
            ``capturable=True`` rule, the missing requirements (None when met)
            and for a ``capturable=None`` one a sentence saying the rule
            declares nothing (the caller may still try a capture).
        """
        if self.capturable is not None and self.capturable is not True:
            return str(self.capturable) if self.capturable else f"the {self.algorithm} rule does not capture"
        variant = self.variant_capture_blocker(options or {})
        if variant is not None:
            return variant
        if self.capturable is None:
            return f"the {self.algorithm} rule of {self.op_type.__name__} does not declare whether it captures"
        return self.capture_requires() if installed else None

    def declared_capture_blocker(self, options: Mapping[str, Any] | None = None) -> str | None:
        """:meth:`capture_blocker` of a step whose rule or variant declares
        itself (on this machine's libraries); None for one that declares
        nothing, which a replay's trial capture decides step by step."""
        if self.capturable is None:
            return self.variant_capture_blocker(options or {})
        return self.capture_blocker(options)


_RULES: dict[type, dict[str, Rule]] = {}


def register(rule: Rule) -> Rule:
    """Add ``rule``; registering the same (op type, algorithm) twice replaces it."""
    _RULES.setdefault(rule.op_type, {})[rule.algorithm] = rule
    return rule


def rule(op_type: type, algorithm: str, **fields) -> Callable[[Kernel], Kernel]:
    """Decorator form: ``@rule(Conv2d, 'gemm', check=...)`` above a kernel."""

    def deco(kernel: Kernel) -> Kernel:
        register(Rule(op_type, algorithm, kernel, **fields))
        return kernel

    return deco


def rules_for(op_type: type) -> dict[str, Rule]:
    """All rules registered for ``op_type``, by algorithm name."""
    _load_backends()
    return dict(_RULES.get(op_type, {}))


def lookup(op_type: type, algorithm: str) -> Rule:
    """The rule for ``(op_type, algorithm)``.

    Raises:
        KeyError: no such rule is registered.
    """
    rules = rules_for(op_type)
    if algorithm not in rules:
        raise KeyError(f"no {algorithm!r} lowering is registered for {op_type.__name__}"
                       f" (registered: {sorted(rules) or 'none'})")
    return rules[algorithm]


def algorithms() -> set[str]:
    """Every algorithm name some rule uses."""
    _load_backends()
    return {a for rules in _RULES.values() for a in rules}


def algorithm_devices(algorithm: str) -> set[str]:
    """The devices some rule named ``algorithm`` runs on (empty for a name no rule uses)."""
    _load_backends()
    return {d for rules in _RULES.values() if algorithm in rules for d in rules[algorithm].devices}


def opt_in_names() -> set[str]:
    """The algorithm names and tags of the rules tagged ``optional`` (what a
    policy's ``include`` can turn on)."""
    _load_backends()
    return {n for rules in _RULES.values() for rule in rules.values() if "optional" in rule.tags
            for n in (rule.algorithm, *rule.tags)}


def registered_rules() -> list[Rule]:
    """Every registered rule, of every op type."""
    _load_backends()
    return [rule for rules in _RULES.values() for rule in rules.values()]


def registered_tags() -> set[str]:
    """Every tag some rule carries (what a policy's include / exclude may name)."""
    _load_backends()
    return {t for rules in _RULES.values() for rule in rules.values() for t in rule.tags}


@attrs.frozen
class DeviceSupport:
    """What the passes need of the device backend (``backends/device.py``).

    * ``resolve(device) -> str``: ``'auto'``, ``'cpu'`` or ``'cuda'`` to the
      device to run on, a ``str`` that may carry ``.reason`` (why it was
      chosen); raises the backend's error for a device that is unavailable;
    * ``array_module(device) -> module``: NumPy or CuPy;
    * ``versions() -> dict``: library versions (autotune-cache keys); never raises;
    * ``device_name(device) -> str``: the GPU's or the CPU's name;
    * ``tune_timer(device, clock) -> timer or None``: autotune's timer for the
      policy's ``tune_clock`` on ``device`` (``passes/autotune.py``'s ``Timer``
      protocol), None where the passes' own default serves.
    """

    resolve: Callable[[str], str]
    array_module: Callable[[str], ModuleType]
    versions: Callable[[], Mapping[str, Any]]
    device_name: Callable[[str], str]
    tune_timer: Callable[[str, str], Any] | None = None


_DEVICE_SUPPORT: list[DeviceSupport] = []


def register_devices(support: DeviceSupport) -> DeviceSupport:
    """Install ``support`` as the device interface (a second call replaces it)."""
    _DEVICE_SUPPORT[:] = [support]
    return support


def device_support() -> DeviceSupport:
    """The registered :class:`DeviceSupport`.

    Raises:
        LookupError: no backend registered one.
    """
    _load_backends()
    if not _DEVICE_SUPPORT:
        raise LookupError("no device backend is registered (opgraph.backends.device registers one)")
    return _DEVICE_SUPPORT[0]


_loaded = False


def _load_backends() -> None:
    """Import the backend modules once so that they register their rules."""
    global _loaded
    if not _loaded:
        _loaded = True
        import importlib

        importlib.import_module("opgraph.backends")
