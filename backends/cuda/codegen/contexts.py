"""Index contexts: where each lane of a generated kernel is, and at what cost.

The iteration shape S (logical NCHW order) is stored in one of two physical
orders: C order (``NCHW``: ``c = (i / inner) % C`` with ``inner`` the product
of the axes after 1) or channels last (``NHWC`` 4-D tensors, and every 2-D
``(N, C)`` tensor, whose channel axis is the last: ``c = i % C``). Each kernel
kind walks memory its own way and so knows some indices for free:

* :class:`Sweep` (element-wise over S, a grid-stride loop over vectors of V
  lanes): mode ``hoist`` (channels last, ``C % V == 0`` and a stride that is a
  multiple of ``C / V`` vectors: each thread keeps its channels, computed once),
  ``uniform`` (C order, ``inner % V == 0``: a vector lies in one (n, c)
  plane, one division per vector) or ``lane`` (anything else: divisions per
  lane);
* :class:`SpaceSweep` (element-wise over the channels, the planes, or one value);
* :class:`Columns` (a reduction of channels-last data: each thread owns V
  adjacent channels and walks rows) and :class:`Rows` (a reduction of C-order
  data: each block owns one channel or one (n, c) plane and walks its
  contiguous runs);
* :class:`Finish` (after a reduction, per kept entry ``o``).

A program with a ``row`` / ``col`` split (``ir`` module docstring) runs over
S in C order: the lane's row is ``i / K`` and its column ``i % K``
(``K = Geometry.row_len``); a row reduction (:class:`Rows`, one block run per
row) and a column one (:class:`Columns`, rows of ``K`` adjacent columns) know
both without dividing.

Whatever a context does not know directly it derives from the lane's physical
index ``i`` by dividing through the physical extents (the logical index of
dropout, the coordinates of a strided operand). All divisions by run-time
extents go through ``Params.div`` (fast 32-bit or plain 64-bit).
"""

from __future__ import annotations

import math

import attrs


@attrs.frozen
class Geometry:
    """The iteration shape and how it is stored.

    ``full`` is S (None: a program over channels only), ``layout`` ``'NCHW'``
    (C order) or ``'NHWC'``, ``channels`` C, ``strides`` the logical element
    strides of each operand read through its strides (input number -> tuple),
    ``ct`` the compute type, ``pitched`` the operands among ``strides`` whose
    full-size loads take the row-pitch form (input number -> :class:`Pitch`),
    ``aligned`` whether every operand not read through strides starts on a
    16-byte boundary, ``row_pitch`` the ``(K, C)`` row operands that are
    column slices of wider ones (input number -> :class:`RowPitch`),
    ``out_row_pitch`` the row pitch of a ``(K, C)`` output written into such a
    slice (None: packed rows), ``trailing`` the k of a ``row`` / ``col`` split
    (0: none; the layout is then ``'NCHW'``).
    """

    full: tuple | None
    layout: str
    channels: int
    strides: dict = attrs.field(factory=dict, eq=False, hash=False)
    ct: str = "float"
    pitched: dict = attrs.field(factory=dict, eq=False, hash=False)
    aligned: bool = False
    row_pitch: dict = attrs.field(factory=dict, eq=False, hash=False)
    out_row_pitch: int | None = attrs.field(default=None, eq=False, hash=False)
    trailing: int = 0

    @property
    def row_len(self) -> int:
        """K: the elements of one row of the split (the product of the trailing axes)."""
        return math.prod(self.full[len(self.full) - self.trailing:]) if self.trailing else 1

    @property
    def n_rows(self) -> int:
        """R: the rows of the split (the product of the leading axes)."""
        return math.prod(self.full[:len(self.full) - self.trailing]) if self.trailing else self.total

    @property
    def total(self) -> int:
        return math.prod(self.full) if self.full is not None else self.channels

    @property
    def batch(self) -> int:
        return self.full[0] if self.full is not None and len(self.full) >= 2 else 1

    @property
    def inner(self) -> int:
        """Product of the axes after the channel axis (1 for 1-D and 2-D S)."""
        return math.prod(self.full[2:]) if self.full is not None and len(self.full) > 2 else 1

    @property
    def channels_last(self) -> bool:
        """Whether the channel index is the fastest-varying one in memory."""
        return self.layout == "NHWC" or self.inner == 1

    @property
    def channel_stride(self) -> int:
        return 1 if self.channels_last else self.inner

    @property
    def physical(self) -> tuple[tuple, tuple]:
        """``(extents, logical axis of each)`` of the buffer, outermost first."""
        if self.full is None:
            return (self.channels,), (1,)
        if self.layout == "NHWC" and len(self.full) == 4:
            n, c, h, w = self.full
            return (n, h, w, c), (0, 2, 3, 1)
        return tuple(self.full), tuple(range(len(self.full)))


@attrs.frozen
class Pitch:
    """A strided operand stored as rows of ``block`` contiguous elements, one
    row every ``pitch`` elements: physical index ``i`` of S is element
    ``(i / block) * pitch + i % block`` (a channel slice of a wider
    channels-last buffer: ``block`` = C, ``pitch`` = the buffer's channels).
    ``aligned``: its first element lies on a 16-byte boundary."""

    block: int
    pitch: int
    aligned: bool

    def vectorises(self, lanes: int) -> bool:
        """Whether ``lanes`` adjacent elements from a lane-0 index that is a
        multiple of ``lanes`` are one aligned run (16-byte loads)."""
        return self.aligned and self.block % lanes == 0 and self.pitch % lanes == 0


@attrs.frozen
class RowPitch:
    """A ``(K, C)`` row operand (batch statistics, sums) that is a column slice
    of a ``(K, pitch)`` buffer: row ``k`` starts ``k * pitch`` elements after
    the first (DenseNet's statistics, shared through the zero-copy concat of
    ``passes/share_bn_stats.py``). ``aligned``: its first element and every
    row start lie on 16-byte boundaries (whole-word row loads)."""

    pitch: int
    aligned: bool


def row_pitch_of(shape, strides) -> int | None:
    """The row pitch of a 2-D operand of ``shape`` with element ``strides``
    whose rows are contiguous and do not overlap, else None."""
    if len(shape) != 2 or (shape[1] > 1 and strides[1] != 1) or strides[0] < shape[1]:
        return None
    return strides[0]


def pitch_of(extents, strides) -> tuple[int, int] | None:
    """``(block, pitch)`` when an operand with element ``strides`` along the
    physical ``extents`` of S (outermost first) is rows of ``block``
    contiguous elements at a constant ``pitch``, else None. Axes of extent 1
    are ignored (any stride addresses their one element)."""
    dims = [(e, s) for e, s in zip(extents, strides) if e != 1]
    k, block = len(dims) - 1, 1
    while k >= 0 and dims[k][1] == block:
        block *= dims[k][0]
        k -= 1
    if k < 0 or block == 1 or dims[k][1] < block:
        return None  # dense, no contiguous run, or overlapping rows
    pitch, expected = dims[k][1], dims[k][1] * dims[k][0]
    for e, s in reversed(dims[:k]):
        if s != expected:
            return None
        expected *= e
    return block, pitch


class Context:
    """Base of the index contexts (module docstring)."""

    def __init__(self, geo: Geometry, params, lanes: int = 1):
        self.geo, self.params, self.lanes = geo, params, lanes

    # what every context answers the same way --------------------------------
    def space_size(self, target: str) -> str:
        """The parameter holding the number of entries of ``target``."""
        if target == "scalar":
            return "1"
        if target == "plane":
            return self.params.scalar("NC", self.geo.batch * self.geo.channels)
        if target == "row":
            return self.params.scalar("NROW", self.geo.n_rows)
        if target == "col":
            return self.params.scalar("KROW", self.geo.row_len)
        return self.params.scalar("C", self.geo.channels)

    def reduced_count(self, target: str) -> int:
        """``max(n, 1)``: elements of S summed into each entry of ``target``."""
        return max(self.geo.total // max(entries(self.geo, target), 1), 1)

    def stride(self, index: int, axis: int) -> int:
        return self.geo.strides[index][axis]

    def channel_run(self, em) -> str | None:
        """The channel of lane 0 when lane ``j`` is at channel ``c0 + j`` with
        ``c0`` a multiple of the lane count (a per-channel row is then read
        as whole vectors), else None."""
        return None

    def col_run(self, em) -> str | None:
        """The column of lane 0 of a C-order split (``row`` / ``col``) when lane
        ``j`` is at column ``k0 + j`` with ``k0`` a multiple of the lane count (a
        packed column operand is then read as whole vectors), else None."""
        return None

    def space_index(self, em, target: str, lane: int) -> str:
        """Index of the lane's entry in ``target`` (channel c, plane n*C + c, scalar 0)."""
        if target == "scalar":
            return "0"
        if target in ("row", "col"):
            return self.index(em, target, lane)
        c = self.index(em, "c", lane)
        if target == "channel":
            return c
        return f"({self.index(em, 'n', lane)} * {self.space_size('channel')} + {c})"

    def _image_and_channel(self, em, scope: str, plane: str, n: str, c: str) -> None:
        """Emit ``n = plane / C`` and ``c = plane % C`` (a plane index ``n*C + c``)."""
        em.add(scope, f"const IDX {n} = {self.params.div(plane, 'CDIV', self.geo.channels)};")
        em.add(scope, f"const IDX {c} = {plane} - {n} * {self.space_size('channel')};")

    def index(self, em, what, lane: int) -> str:
        """Code of index ``what`` (``'i0'``, ``'i'``, ``'c'``, ``'n'``, ``'L'``,
        ``'row'``, ``'col'`` or ``('coord', axis)``) at ``lane``, emitting what
        it needs into ``em``."""
        key = ("idx", what, lane)
        if key not in em.memo:
            em.memo[key] = self._index(em, what, lane)
        return em.memo[key]

    def _index(self, em, what, lane):
        if what == "i":
            return f"(i0 + {lane})" if self.lanes > 1 else "i0"
        if what == "L":
            return self._logical(em, lane)
        if what == "c":
            return self._coords(em, lane)[1] if len(self._coords(em, lane)) > 1 else self._coords(em, lane)[0]
        if what == "n":
            return self._coords(em, lane)[0] if len(self._coords(em, lane)) > 1 else "0"
        if what == "i0":
            return "i0"
        if what in ("row", "col"):
            return self._split(em, lane, self.index(em, "i", lane), "lane")[what]
        return self._coords(em, lane)[what[1]]

    def _split(self, em, lane, i: str, scope: str, name: str | None = None) -> dict:
        """``{'row': i / K, 'col': i % K}`` of the C-order index ``i`` (one division, in ``scope``)."""
        key = ("split", i)
        if key not in em.memo:
            name = name or f"rw{lane}"
            k = self.params.scalar("KROW", self.geo.row_len)
            em.add(scope, f"const IDX {name} = {self.params.div(i, 'KDIV', self.geo.row_len)};")
            em.memo[key] = {"row": name, "col": f"({i} - {name} * {k})"}
        return em.memo[key]

    def _coords(self, em, lane: int) -> list[str]:
        """Logical coordinates of the lane's element, by division of its physical index."""
        key = ("coords", lane)
        if key not in em.memo:
            extents, axes = self.geo.physical
            rest, coords = self.index(em, "i", lane), [None] * len(extents)
            for p in range(len(extents) - 1, 0, -1):
                q = f"q{p}_{lane}"
                em.add("lane", f"const IDX {q} = {self.params.div(rest, f'PD{p}', extents[p])};")
                em.add("lane", f"const IDX k{p}_{lane} = {rest} - {q} * {self.params.scalar(f'PV{p}', extents[p])};")
                coords[axes[p]] = f"k{p}_{lane}"
                rest = q
            coords[axes[0]] = rest
            em.memo[key] = coords
        return em.memo[key]

    def _logical(self, em, lane: int) -> str:
        """Row-major index of the lane's element in the logical shape."""
        if self.geo.layout != "NHWC" or self.geo.full is None or len(self.geo.full) != 4:
            return self.index(em, "i", lane)
        coords = self._coords(em, lane)
        text = coords[0]
        for a in range(1, 4):
            text = f"({text} * {self.params.scalar(f'SX{a}', self.geo.full[a])} + {coords[a]})"
        return text


class Sweep(Context):
    """The element-wise kernel over S (module docstring: modes ``hoist``,
    ``uniform``, ``lane``). The kernel defines ``gtid`` (the thread's global
    index) and, per iteration, ``i0`` (the element index of lane 0)."""

    def __init__(self, geo, params, lanes, mode):
        super().__init__(geo, params, lanes)
        self.mode = mode

    def scope(self, space):
        if space == "row" and self._row_per_vector():
            return ("vec", False)
        if space in ("row", "col"):
            return ("lane", True)
        if self.mode == "hoist":
            return ("pre", True) if space == "channel" else ("vec", True)
        if self.mode == "uniform":
            return ("vec", False)
        return ("lane", True)

    def _row_per_vector(self) -> bool:
        """Whether every vector lies in one row of the split (V divides K)."""
        return self.geo.trailing > 0 and self.geo.row_len % self.lanes == 0

    def _index(self, em, what, lane):
        geo, p = self.geo, self.params
        if what in ("row", "col") and self._row_per_vector():
            parts = self._split(em, 0, "i0", "vec", "rwv")
            return parts["row"] if what == "row" else f"({parts['col']} + {lane})"
        if what in ("c", "n") and self.mode == "hoist":
            if "cbase" not in em.memo:
                groups = p.scalar("G", geo.channels // self.lanes)
                em.add("pre", f"const IDX cbase = (gtid % {groups}) * {self.lanes};")
                em.memo["cbase"] = True
                em.add("vec", f"const IDX nv = {p.div('i0', 'NCHAN', geo.channels * geo.inner)};")
            return f"(cbase + {lane})" if what == "c" else "nv"
        if what in ("c", "n") and self.mode == "uniform":
            if "cq" not in em.memo:
                em.add("vec", f"const IDX qv = {p.div('i0', 'INNER', geo.inner)};")
                self._image_and_channel(em, "vec", "qv", "nv", "cv")
                em.memo["cq"] = True
            return "cv" if what == "c" else "nv"
        return super()._index(em, what, lane)


    def channel_run(self, em):
        if self.mode != "hoist" or self.lanes == 1:
            return None
        self.index(em, "c", 0)  # defines cbase
        return "cbase"

    def col_run(self, em):
        # i0 is a multiple of V and V divides K, so the vector's first column is too
        if self.lanes == 1 or not self._row_per_vector():
            return None
        return self._split(em, 0, "i0", "vec", "rwv")["col"]


class SpaceSweep(Context):
    """The element-wise kernel over the channels, the planes (``o = n*C + c``)
    or one value: ``i0`` is the entry index ``o``."""

    def __init__(self, geo, params, target):
        super().__init__(geo, params, 1)
        self.target = target

    def scope(self, space):
        return ("lane", True)

    def _index(self, em, what, lane):
        if what in ("row", "col") and what == self.target:
            return "i0"
        if what in ("c", "n"):
            if self.target == "channel":
                return "i0" if what == "c" else "0"
            if "oq" not in em.memo:
                self._image_and_channel(em, "lane", "i0", "on", "oc")
                em.memo["oq"] = True
            return "oc" if what == "c" else "on"
        return super()._index(em, what, lane)


class Finish(SpaceSweep):
    """Code after a reduction, for the kept entry ``i0`` of ``target``: one
    straight block (every value at one scope, emitted in dependency order)."""

    def scope(self, space):
        return ("lane", False)


class Columns(Context):
    """A channels-last reduction: the kernel defines ``g`` (this thread's group
    of V channels), ``k1`` (the batch index of a per-plane reduction, else 0),
    ``a`` (the row) and ``i0``; ``rows_per_n`` is the rows of one image (HW)
    for a per-channel reduction of a 4-D tensor, 1 for a 2-D one."""

    def __init__(self, geo, params, lanes, target):
        super().__init__(geo, params, lanes)
        self.target = target

    def scope(self, space):
        if self.target == "col":  # a thread keeps its columns and walks the rows
            return {"col": ("pre", True), "row": ("vec", False)}.get(space, ("lane", True))
        if space == "channel" or self.target == "plane":
            return ("pre", True)
        return ("vec", True)

    def channel_run(self, em):
        return f"(g * {self.lanes})" if self.lanes > 1 and self.target != "col" else None

    def col_run(self, em):
        return f"(g * {self.lanes})" if self.lanes > 1 and self.target == "col" else None

    def _index(self, em, what, lane):
        if self.target == "col":  # i0 = a * K + g * V: row a, column g * V + lane
            if what == "row":
                return "a"
            if what == "col":
                return f"(g * {self.lanes} + {lane})"
            return super()._index(em, what, lane)
        if what == "c":
            return f"(g * {self.lanes} + {lane})"
        if what == "n":
            if self.target == "plane":
                return "k1"
            if self.geo.inner == 1:
                return "a"
            if "na" not in em.memo:
                em.add("vec", f"const IDX na = {self.params.div('a', 'HW', self.geo.inner)};")
                em.memo["na"] = True
            return "na"
        return super()._index(em, what, lane)


class Rows(Context):
    """A C-order reduction: block ``k2`` owns channel ``k2`` (of image ``k1`` for a
    per-plane one); the kernel defines ``k1``, ``k2``, ``a`` (the image of a
    per-channel one) and ``i0``. A total reduction (``target == 'scalar'``)
    derives everything from ``i``."""

    def __init__(self, geo, params, lanes, target):
        super().__init__(geo, params, lanes)
        self.target = target

    def scope(self, space):
        if self.target == "row":  # a thread run keeps its row and walks its columns
            return {"row": ("pre", False)}.get(space, ("lane", True))
        if self.target == "scalar":
            return ("lane", True)
        if space == "channel" or self.target == "plane":
            return ("pre", False)
        return ("vec", False)

    def col_run(self, em):
        # i0 = k2 * K + j * V: the vector's first column j * V, a multiple of V (V divides K)
        if self.lanes == 1 or self.target != "row" or self.geo.row_len % self.lanes:
            return None
        return f"(i0 - k2 * {self.params.scalar('KROW', self.geo.row_len)})"

    def _index(self, em, what, lane):
        if self.target == "row":  # i0 = k2 * K + j * V: row k2, column j * V + lane
            if what == "row":
                return "k2"
            if what == "col":
                return f"(i0 + {lane} - k2 * {self.params.scalar('KROW', self.geo.row_len)})"
            return super()._index(em, what, lane)
        if self.target != "scalar" and what == "c":
            return "k2"
        if self.target != "scalar" and what == "n":
            return "k1" if self.target == "plane" else "a"
        return super()._index(em, what, lane)


def entries(geo: Geometry, target: str) -> int:
    """The kept entries of a reduction to ``target`` (its carried or output row length)."""
    return {"scalar": 1, "channel": geo.channels, "plane": geo.batch * geo.channels, "row": geo.n_rows,
            "col": geo.row_len}[target]


__all__ = ["entries", "Geometry", "Pitch", "pitch_of", "RowPitch", "row_pitch_of", "Context", "Sweep", "SpaceSweep",
           "Finish", "Columns", "Rows"]
