"""The op contract.

An op is a frozen ``attrs`` class that holds only static parameters; equal
parameters compare and hash equal. Each op knows

* ``infer(*input_types) -> TensorType``: the shape/dtype rule, run when the
  node is added so bad shapes fail at model-building time;
* ``vjp(node, gy, wanted) -> tuple``: its gradient rule in terms of abstract
  ops (one cotangent value or ``None`` per input);
* ``flops(input_types, output_type) -> int``: forward FLOPs, a multiply-add
  counted as 2 (the convnet-benchmarks convention).

Abstract ops are not executable. ``Lowered`` wraps an abstract op with the
algorithm and device chosen by the lowering pass; only lowered nodes run.

Every node has one output. A kernel that gives a second result (a max-pool
scan's winners beside the pooled value, a ReLU gradient's per-channel sums)
writes it into a *slot*: an input whose op is ``filled_by_reader`` (its step
only allocates) and whose position the filler lists in ``fills``. So the memory
plan, the CUDA-graph replay and autodiff, which all assume one array per node,
need nothing new; the slot's one invariant (one filler, the expected slot op on
the filler's own inputs, every other reader after the filler) is checked in one
place, ``passes/verify.py``'s ``slot_problems``, and autotune and the benchmark
check a slot's value like a second output. We chose this over multi-output
nodes, which would have touched every pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from .errors import NotDifferentiableError, ShapeError
from .params import describe
from .types import TensorType

if TYPE_CHECKING:  # pragma: no cover
    from .graph import NodeView, Value


#: ``Op.direction`` -> the phase name the benchmark protocol, the conv algorithm
#: functions and the policy's ``NAME:forward`` keys use for it.
DIRECTION_NAMES = {"fwd": "forward", "dgrad": "backward_data", "wgrad": "backward_filter"}


class Op:
    """Base class of all ops. Subclasses are ``@attrs.frozen`` classes."""

    abstract: ClassVar[bool] = True
    #: (minimum, maximum) number of inputs; maximum None means unbounded.
    arity: ClassVar[tuple[int, int | None]] = (1, 1)
    #: Short builder-style name used for automatic node names.
    kind: ClassVar[str] = "op"
    #: Made only by the fuse pass from several ops; every rule of it carries the
    #: tag ``fused`` (``backends.registry.Rule``), so excluding ``fused`` turns fusion off.
    fused: ClassVar[bool] = False
    #: The family the op belongs to (``'conv'``, ``'pool'``, ``'relu'``, ...),
    #: declared here once: the policy alias of that name covers the op
    #: (``prefer={'pool': [...]}``), and the passes and the benchmark find the
    #: convolutions by it. None: no family (the ``*`` alias still covers it).
    family: ClassVar[str | None] = None
    #: Its direction within the family, where the policy tells them apart
    #: (``'fwd'``, ``'dgrad'``, ``'wgrad'``): the alias ``<family>_<direction>``
    #: covers it (``conv_wgrad``), and the legalize pass pads by it.
    direction: ClassVar[str | None] = None
    #: Input positions the op takes for their type only (shape, dtype), never
    #: reading their values: a profile counts no traffic for them.
    unread_inputs: ClassVar[tuple[int, ...]] = ()
    #: Input positions whose buffers the op's kernels *write*: each such input is
    #: a node of a ``filled_by_reader`` op (a slot), whose step only allocates,
    #: and this node is the one that fills it, with the slot's own value (the
    #: slot op's reference kernel). It is how one kernel gives two results while
    #: every node keeps one output (``passes/fuse_pool_scan.py``; the graph
    #: invariants: ``passes/verify.py``'s ``slot_problems``).
    fills: ClassVar[tuple[int, ...]] = ()
    #: The op's step allocates its output and writes nothing: the one reader
    #: that lists it in ``fills`` writes its value, and every other reader
    #: runs after that one (a descendant of it).
    filled_by_reader: ClassVar[bool] = False

    def filled_slot(self, position: int) -> tuple["Op", tuple[int, ...]]:
        """For an input position in ``fills``: the slot op that input must be, and the
        positions of this op's inputs that the slot reads, in order (its value is computed
        from them; ``passes/verify.py`` checks both).

        Raises:
            NotImplementedError: an op with no ``fills``."""
        raise NotImplementedError(f"{self.name} fills no input")

    def infer(self, *types: TensorType) -> TensorType:  # pragma: no cover - abstract
        raise NotImplementedError

    def vjp(self, node: "NodeView", gy: "Value", wanted: tuple[bool, ...]) -> tuple:
        """Cotangents of the inputs, given the output cotangent ``gy``.

        ``wanted[i]`` is False where input ``i`` needs no gradient; the rule
        then returns ``None`` there and adds no node for it.
        """
        raise NotDifferentiableError(f"{type(self).__name__} has no gradient rule")

    def flops(self, types: tuple[TensorType, ...], out: TensorType) -> int:
        """Forward FLOPs (multiply-add = 2); 0 for data-movement ops."""
        return 0

    def bytes_moved(self, types: tuple[TensorType, ...], out: TensorType) -> int | None:
        """Bytes one run reads and writes, where that is not every read input once
        plus the output (a profile's count; ``MaxPool2dTake`` reads one element
        of x per output element), else None."""
        return None

    @property
    def name(self) -> str:
        return type(self).__name__

    def params(self) -> dict[str, Any]:
        """The static parameters, by attrs field name."""
        return attrs.asdict(self, recurse=False)

    def describe(self) -> str:
        """``Conv2d(stride=2, padding=1)``: parameters in canonical short form."""
        inner = ", ".join(f"{k}={describe(v)}" for k, v in self.params().items())
        return f"{self.name}({inner})"

    def __str__(self) -> str:
        return self.describe()


def check_arity(op: Op, types: tuple[TensorType, ...]) -> None:
    """Raise ShapeError unless ``len(types)`` is within ``op.arity``."""
    lo, hi = op.arity
    if len(types) < lo or (hi is not None and len(types) > hi):
        want = f"{lo}" if lo == hi else f"{lo}..{hi if hi is not None else 'n'}"
        raise ShapeError(f"{op.name} takes {want} inputs, got {len(types)}")


def require_ndim(op: Op, what: str, t: TensorType, ndim: int) -> None:
    """Raise ShapeError naming ``what`` unless ``t`` has ``ndim`` axes."""
    if t.ndim != ndim:
        raise ShapeError(f"{op.name}: {what} must be {ndim}-D, got shape {t.shape}")


def require_same_dtype(op: Op, types) -> str:
    """The common dtype of ``types``; ShapeError when they are mixed."""
    dtypes = {t.dtype for t in types}
    if len(dtypes) > 1:
        raise ShapeError(f"{op.name}: inputs have mixed dtypes {sorted(dtypes)}")
    return types[0].dtype


@attrs.frozen
class Source(Op):
    """A graph input, a trainable parameter or an output-gradient placeholder.

    ``role`` is ``'input'``, ``'param'`` or ``'grad'``; sources have no inputs.
    ``'buffer'``: state fed like a parameter but never trained or differentiated
    (BatchNorm running statistics, ``Graph.buffer``).
    """

    type: TensorType
    role: str = "input"
    arity: ClassVar = (0, 0)
    abstract: ClassVar[bool] = False
    kind: ClassVar[str] = "input"

    def infer(self) -> TensorType:
        return self.type

    def vjp(self, node, gy, wanted):
        return ()

    @property
    def name(self) -> str:
        return self.role.capitalize()

    def describe(self) -> str:
        return f"{self.name}({self.type})"


def _freeze_options(options) -> tuple:
    if isinstance(options, dict):
        options = options.items()
    return tuple(sorted((str(k), v) for k, v in options))


@attrs.frozen
class Lowered(Op):
    """A concrete node: abstract ``op`` run by ``algorithm`` on ``device``.

    ``options`` holds the implementation's own choices (a cuDNN engine index,
    a precision, a Winograd tile) as sorted ``(key, value)`` pairs.
    """

    op: Op
    algorithm: str
    device: str = "cpu"
    options: tuple = attrs.field(default=(), converter=_freeze_options)
    abstract: ClassVar[bool] = False
    arity: ClassVar = (0, None)

    def infer(self, *types: TensorType) -> TensorType:
        return self.op.infer(*types)

    def flops(self, types, out) -> int:
        return self.op.flops(types, out)

    def vjp(self, node, gy, wanted):
        return self.op.vjp(node, gy, wanted)

    @property
    def kind(self) -> str:  # type: ignore[override]
        return self.op.kind

    @property
    def family(self) -> str | None:  # type: ignore[override]
        return self.op.family

    @property
    def direction(self) -> str | None:  # type: ignore[override]
        return self.op.direction

    @property
    def name(self) -> str:
        return f"{self.algorithm}:{self.op.name}"

    @property
    def option_dict(self) -> dict:
        return dict(self.options)

    def describe(self) -> str:
        extra = "".join(f", {k}={v}" for k, v in self.options)
        return f"{self.algorithm}[{self.device}{extra}]:{self.op.describe()}"


def abstract_of(op: Op) -> Op:
    """The abstract op behind ``op`` (itself unless it is ``Lowered``)."""
    return op.op if isinstance(op, Lowered) else op
