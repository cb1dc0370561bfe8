"""The kernel IR: a fused program as a DAG of loads, CUDA expressions and reductions.

A program (``opgraph/ops/fused.py``; a single op is a one-step program) is
built into this IR by the expression table (``expressions.py``): each member
op turns its operands into :class:`Node` values through a :class:`Builder`.
Every value lives in a *space* of the iteration shape ``S`` (the largest
full-size shape of the program):

* ``full``: one value per element of S (an operand of shape S, or anything
  computed from one);
* ``plane``: one per (n, c) (an ``(N, C, 1, 1)`` operand, a global-pool mean;
  not an ``(N, 1, 1, 1)`` one: that is ``strided``);
* ``channel``: one per channel c of axis 1 (a ``(C,)`` vector, a row of batch
  statistics, a per-channel sum);
* ``scalar``: one value (a constant, a size-1 operand, a global sum);
* ``row``: one per leading index of S when its trailing ``k`` axes are a
  row (layer norm's statistics: :meth:`Builder.reduce` to ``'row'``);
* ``col``: one per trailing index (a ``normalized_shape`` operand, a sum over
  the leading axes to the trailing shape: a Linear bias gradient).

``row`` and ``col`` split S at one axis, ``k`` axes from its end
(:attr:`Builder.trailing`, fixed by the first operand or reduction that
names it, the same for the whole program); a program using them iterates S
in C order (``plan._layout``), so a row is a contiguous run of
``K = prod(S[-k:])`` elements.

An operand that broadcasts to S along other axes is ``strided``: a full-space
load through its strides. Reductions sum a full value over every axis but 1
(to ``channel``), over the axes after 1 (to ``plane``), over all (to
``scalar``), over the trailing ``k`` axes (to ``row``) or over the others
(to ``col``), in CT (fp32, or fp64 for float64 storage), and are the phase
boundaries of ``plan.py``. Values are CT expressions; a node is emitted once
per lane as ``const CT v<id>_<lane> = ...`` (``emit.py``), so a template may
name an operand several times.

Raises :class:`PlanError` (a reason the ``codegen`` rule gives when it
declines) for what the generator does not cover.
"""

from __future__ import annotations

import math

import attrs

from opgraph.errors import OpgraphError

SPACES = ("scalar", "channel", "plane", "full")
RANK = {s: k for k, s in enumerate(SPACES)}
#: the spaces of a split of S into leading and trailing axes (module docstring)
SPLIT_SPACES = ("row", "col")
TARGETS = ("scalar", "channel", "plane", *SPLIT_SPACES)


def join(a: str, b: str) -> str:
    """The space of a value computed from values in spaces ``a`` and ``b``: the
    wider of two ranked spaces; a split space with itself or a scalar stays,
    with anything else it varies over all of S (``full``)."""
    if a == b or b == "scalar":
        return a
    if a == "scalar":
        return b
    if a in RANK and b in RANK:
        return max(a, b, key=RANK.__getitem__)
    return "full"


def within(space: str, target: str) -> bool:
    """Whether a value in ``space`` has one value per entry of ``target`` (an
    output row of that target may hold it)."""
    return join(space, target) == target


class PlanError(OpgraphError):
    """The generator does not cover this program or these shapes (the reason)."""


class PackingError(PlanError):
    """A packed column operand (``Builder._column_split``) that the rest of the
    program cannot keep (another split, a reduction to channels, planes or
    one value, whose kernels index no columns): the caller builds it again
    with that operand strided."""


class ViewError(PlanError):
    """A strided view among the operands is loaded as a packed row (a
    per-channel or per-plane operand, or a trailing-shape weight): the caller
    copies it and plans again. (A broadcast operand that is a view is never
    made a packed column: ``plan.build``'s ``views``.)"""


@attrs.frozen
class Load:
    """Where a load reads: ``input`` (the program input number) as ``kind``:
    ``full`` (flat physical index, the output's layout), ``channel`` (element
    ``row * C + c``), ``plane`` (``n * C + c``), ``scalar`` (element 0),
    ``strided`` (the logical coordinates times the array's strides),
    ``sample`` (the element ``(0, c, 0, ...)`` of a full operand), ``col``
    (element ``col`` of a packed trailing-shape operand) or ``rowsample``
    (the first element of the lane's row of a full operand)."""

    input: int
    kind: str
    row: int = 0


@attrs.frozen
class Node:
    """One IR value. ``kind``: ``load`` (``load``), ``expr`` (``template`` over
    ``args``), ``reduce`` (the sum of ``args[0]`` to ``target``), ``count``
    (the number of elements a reduction to ``target`` sums, at least 1) or
    ``keep`` (the dropout mask at the element's logical index: 1 or 0;
    ``template`` holds ``state,threshold``)."""

    kind: str
    space: str
    args: tuple = ()
    template: str = ""
    load: Load | None = None
    target: str = ""


@attrs.frozen
class Val:
    """A value of the program: IR node ``node`` in ``space``."""

    node: int
    space: str


@attrs.frozen
class Stacked:
    """Several channel- or plane-space values read as the rows of one ``(K, ...)``
    operand (``BatchNormStats``' mean and variance)."""

    rows: tuple


@attrs.frozen
class Ext:
    """Program input ``index`` of type ``type``, not yet loaded: the consuming
    op decides how (:meth:`Builder.value`, :meth:`Builder.channel`, :meth:`Builder.row`)."""

    index: int
    type: object


def classify(shape, full) -> str:
    """The space of an operand of ``shape`` broadcast against the iteration
    shape ``full`` (module docstring).

    Raises:
        PlanError: ``shape`` does not broadcast to ``full``.
    """
    shape, full = tuple(shape), tuple(full)
    if shape == full:
        return "full"
    if math.prod(shape) == 1:
        return "scalar"
    if len(shape) > len(full):
        raise PlanError(f"operand {shape} does not broadcast to {full}")
    padded = (1,) * (len(full) - len(shape)) + shape
    if any(s not in (1, f) for s, f in zip(padded, full)):
        raise PlanError(f"operand {shape} does not broadcast to {full}")
    axes = {a for a, s in enumerate(padded) if s != 1}
    if len(full) >= 2 and axes == {1}:
        return "channel"
    # a plane load reads element n * C + c: both axes must be there (a per-sample
    # (N, 1, 1, 1) operand, a stochastic-depth mask, goes through its strides)
    if len(full) >= 3 and axes == {0, 1}:
        return "plane"
    return "strided"


def trailing_axes(in_shape, out_shape) -> int | None:
    """k when summing ``in_shape`` to ``out_shape`` keeps exactly its trailing
    ``k`` axes (``out_shape`` right-aligned, NumPy's rule: ``(C,)``, ``(1, W, C)``
    of an ``(N, H, W, C)`` input) and sums over the others, else None (a
    shape that is not a trailing block of ``in_shape``, or all ones). The one
    place this split is read off shapes."""
    in_shape, out_shape = tuple(in_shape), tuple(out_shape)
    if len(out_shape) > len(in_shape):
        return None
    padded = (1,) * (len(in_shape) - len(out_shape)) + out_shape
    lead = next((a for a, s in enumerate(padded) if s != 1), len(padded))
    if lead == len(padded) or padded[lead:] != in_shape[lead:]:
        return None
    return len(in_shape) - lead


class Builder:
    """Collects the IR nodes of one program (the expression table calls it).

    Args:
        full: the iteration shape S, or None for a program with no full-size
            value (it then runs over its channels).
        channels: C, the extent of axis 1 of S (or of the channel vectors).
        packable: the inputs a broadcast operand may be read from as a packed
            column (:meth:`_column_split`): none unless S is stored in C order
            (no channels-last full-size operand or output, so that a split of it
            costs no strided reads of those), and no strided view.
    """

    def __init__(self, full: tuple | None, channels: int | None, packable: frozenset = frozenset()):
        self.full, self.channels, self.packable = full, channels, packable
        #: a packed column operand named the split (:meth:`_column_split`)
        self.packed = False
        #: k of the ``row`` / ``col`` split (module docstring), 0 until named
        self.trailing = 0
        self.nodes: list[Node] = []
        self._memo: dict[Node, Val] = {}
        #: ``(node, input)``: a full value also summed per column into program input ``input``
        #: (:meth:`fill_columns`), else None
        self.fill: tuple | None = None

    def _add(self, node: Node) -> Val:
        if node not in self._memo:  # equal nodes (the same load twice) are one value
            self.nodes.append(node)
            self._memo[node] = Val(len(self.nodes) - 1, node.space)
        return self._memo[node]

    def fill_columns(self, x: Val, slot: Ext) -> None:
        """Also sum the full value ``x`` over the rows (a ``col`` sum) into the buffer of input
        ``slot``, which the program writes instead of reading (``Op.fills``: a layer norm's weight
        gradient beside its data gradient). Only the one-kernel row sweep takes such a sum, while
        each row is on chip (``plan.lower`` raises where it cannot run)."""
        if x.space != "full" or not self.trailing or not isinstance(slot, Ext) or self.fill is not None:
            raise PlanError("a column sum filled into an input: one full value of a row-split program")
        self.fill = (x.node, slot.index)

    # ---- operands -------------------------------------------------------
    def value(self, x, as_shape=None) -> Val:
        """Operand ``x`` broadcast against S (``as_shape``: its shape read as
        another of the same size, e.g. a mean without keepdim)."""
        if not isinstance(x, Ext):
            if isinstance(x, Stacked):
                raise PlanError("stacked rows used as one value")
            return x
        shape = tuple(as_shape) if as_shape is not None else x.type.shape
        if self.full is None:
            if len(shape) == 1 and shape[0] == self.channels:
                return self._add(Node("load", "channel", load=Load(x.index, "channel")))
            if math.prod(shape) == 1:
                return self._add(Node("load", "scalar", load=Load(x.index, "scalar")))
            raise PlanError(f"operand {x.type.shape} in a program with no full-size value")
        kind = classify(shape, self.full)
        k = self._column_split(x, shape) if kind == "strided" else None
        if k is not None:
            self.split(k)
            self.packed = True
            return self._add(Node("load", "col", load=Load(x.index, "col")))
        space = "full" if kind == "strided" else kind
        return self._add(Node("load", space, load=Load(x.index, kind)))

    def _column_split(self, x, shape) -> int | None:
        """k when broadcast operand ``x`` (read as ``shape``) may be a packed
        ``col`` operand splitting S at its trailing k axes, else None: it
        varies along a trailing block of S only (a Linear's bias ``(C,)`` on
        ``(N, H, W, C)``), its input is :attr:`packable`, no other split is
        named, and its memory holds that block in C order (a 4-D
        channels-last operand does not when both its channel axis and a
        spatial axis are in the block). A strided load divides each lane's
        index into coordinates (ConvNeXt's bias add + GELU chain ran at 45 %
        of the copy bandwidth on an H100 that way, the GELU alone at 82 %); a
        column is one division per vector."""
        k = trailing_axes(self.full, shape)
        if x.index not in self.packable or k is None or self.trailing not in (0, k):
            return None
        if len(shape) == 4 and x.type.layout == "NHWC" and shape[1] > 1 and shape[2] * shape[3] > 1:
            return None
        return k

    def channel(self, x) -> Val:
        """Operand ``x`` as a ``(C,)`` channel vector."""
        if isinstance(x, Ext):
            extents = [s for s in x.type.shape if s != 1] or [1]
            if extents != [self.channels]:  # (C,), (1, C, 1, 1), (C, 1, 1) all are
                raise PlanError(f"channel operand {x.type.shape} is not ({self.channels},)")
            return self._add(Node("load", "channel", load=Load(x.index, "channel")))
        if isinstance(x, Stacked) or not within(x.space, "channel"):
            raise PlanError("a computed value used as a channel vector must be per channel")
        return x

    def row(self, x, k: int) -> Val:
        """Row ``k`` of a ``(K, C)`` operand (batch statistics) as a channel value."""
        if isinstance(x, Stacked):
            return x.rows[k]
        if isinstance(x, Ext):
            if len(x.type.shape) != 2 or x.type.shape[1] != self.channels:
                raise PlanError(f"rows operand {x.type.shape} is not (K, {self.channels})")
            return self._add(Node("load", "channel", load=Load(x.index, "channel", k)))
        raise PlanError("a computed full-size value read as rows")

    def sample(self, x) -> Val:
        """The first element of each channel of the full operand ``x`` (a shift
        that keeps one-pass variances accurate)."""
        if not isinstance(x, Ext) or self.full is None or tuple(x.type.shape) != self.full:
            raise PlanError("a channel sample needs a full-size program input")
        return self._add(Node("load", "channel", load=Load(x.index, "sample")))

    def split(self, k: int) -> None:
        """Fix the ``row`` / ``col`` split at the trailing ``k`` axes of S.

        Raises:
            PlanError: no full-size value, ``k`` outside ``1..rank``, or
                another ``k`` already named in this program.
        """
        if self.full is None or not 1 <= k <= len(self.full):
            raise PlanError(f"a split at the trailing {k} axes of {self.full}")
        if self.trailing not in (0, k):
            error = PackingError if self.packed else PlanError
            raise error(f"one program splits S={self.full} at its trailing {self.trailing} and {k} axes")
        self.trailing = k

    def trailing_operand(self, x, k: int) -> Val:
        """Operand ``x`` of S's trailing ``k``-axis shape (a ``normalized_shape``
        weight) as a ``col`` value, read packed (element ``col``)."""
        self.split(k)
        want = self.full[len(self.full) - k:]
        if not isinstance(x, Ext):
            if isinstance(x, Stacked) or not within(x.space, "col"):
                raise PlanError(f"a {getattr(x, 'space', 'stacked')} value used as a trailing-shape operand")
            return x
        if tuple(x.type.shape) != want:
            raise PlanError(f"trailing operand {x.type.shape} is not {want}")
        return self._add(Node("load", "col", load=Load(x.index, "col")))

    def row_sample(self, x, k: int) -> Val:
        """The first element of each row (trailing ``k`` axes) of the full
        operand ``x``: a shift that keeps one-pass row variances accurate."""
        self.split(k)
        if not isinstance(x, Ext) or tuple(x.type.shape) != self.full:
            raise PlanError("a row sample needs a full-size program input")
        return self._add(Node("load", "row", load=Load(x.index, "rowsample")))

    # ---- computation ----------------------------------------------------
    def expr(self, template: str, *args: Val) -> Val:
        """A CT expression over ``args`` (``{0}``, ``{1}``...); its space is their :func:`join`."""
        space = "scalar"
        for a in args:
            space = join(space, a.space)
        return self._add(Node("expr", space, tuple(a.node for a in args), template))

    def reduce(self, x: Val, target: str, trailing: int | None = None) -> Val:
        """The sum of the full value ``x`` over the axes ``target`` drops
        (``row``/``col``: the split at the trailing ``trailing`` axes)."""
        if self.full is None or x.space != "full":
            raise PlanError(f"a reduction to {target} of a {x.space} value (only full-size values are reduced)")
        if target == "plane" and len(self.full) < 3:
            raise PlanError(f"a per-plane reduction of a {len(self.full)}-D value")
        if target in SPLIT_SPACES:
            if trailing is None:
                raise PlanError(f"a reduction to {target} names no split")
            self.split(trailing)
        return self._add(Node("reduce", target, (x.node,), target=target))

    def count(self, target: str) -> Val:
        """``max(n, 1)``: the number of elements a reduction to ``target`` sums."""
        return self._add(Node("count", "scalar", target=target))

    def keep(self, state: int, threshold: int) -> Val:
        """The dropout keep mask (1 or 0) at each element's logical index."""
        if self.full is None:
            raise PlanError("dropout in a program with no full-size value")
        return self._add(Node("keep", "full", template=f"{state},{threshold}"))


def depths(nodes: list[Node]) -> list[int]:
    """Per node: how many reductions lie on its longest path from the loads
    (a reduction's result is available from phase ``depth`` on)."""
    out: list[int] = []
    for node in nodes:
        d = max((out[a] for a in node.args), default=0)
        out.append(d + 1 if node.kind == "reduce" else d)
    return out


def needed(nodes: list[Node], roots) -> set[int]:
    """The nodes ``roots`` depend on within one phase (themselves included): a
    reduction is a leaf there (its result comes from an earlier phase), so
    its argument is not followed."""
    seen, stack = set(), list(roots)
    while stack:
        k = stack.pop()
        if k in seen:
            continue
        seen.add(k)
        if nodes[k].kind != "reduce":
            stack.extend(nodes[k].args)
    return seen


__all__ = ["SPACES", "RANK", "SPLIT_SPACES", "TARGETS", "join", "within", "PlanError", "PackingError", "ViewError",
           "Load", "Node", "Val", "Stacked", "Ext", "classify", "trailing_axes", "Builder", "depths", "needed"]
