"""Zero-copy concat and slice at run time: the steps whose output is a view.

The memory pass's zero-copy plan (``passes/zero_copy.py``) decides, for one
schedule, which values live inside another value's buffer
(``InplacePlan.homes``: a producer writing straight into its slice of a
concat's buffer, a concat that is a slice of a larger concat's buffer) and
which ``Slice`` steps return a view of their input (``InplacePlan.views``).
Building the executable turns each decision into a :class:`StepView` on its
step (``Step.view``), which ``opgraph.executable.run_step`` calls instead of
the plain kernel call:

* :class:`WriteInto`: the producer's kernel gets ``out=`` its region of the
  root buffer (``Rule.writes_strided_out``) and returns it; with ``copy``
  (``InplacePlan.copied_in``: a kernel that cannot) the step copies the
  kernel's result there instead;
* :class:`AssembleConcat`: a concat's step returns its region (or its whole
  buffer, when it is the root), copying into it only the inputs that did
  not write there themselves (the fallback, one input at a time); with
  every input in place it moves no byte;
* :class:`SliceView`: ``x[..., start:stop, ...]``, NumPy/CuPy basic slicing.

A root buffer is allocated, in the root value's run dtype and layout, by the
first step that writes into it, and kept in the root's slot (``slots[root]``,
which the root's own step then returns), so it lives until the last reader
of the root or of any view of it (the arrays keep their base alive; the
memory pass's replay counts the same).
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

#: ``(axis, start, stop)`` steps from a root buffer down to a region.
Chain = tuple


def sliced(a, axis: int, start: int, stop: int):
    """``a[..., start:stop, ...]`` on ``axis``: a view (basic slicing)."""
    return a[(slice(None),) * axis + (slice(start, stop),)]


@attrs.frozen
class Region:
    """Where a value lives inside a root buffer.

    Attributes:
        root: node id of the value owning the buffer (a concat's output).
        shape: the root's logical shape; dtype: its NumPy dtype (the run
            dtype, bfloat16 as ``ml_dtypes.bfloat16``); channels_last: stored
            NHWC (the NCHW-shaped view of an ``(N, H, W, C)`` buffer).
        chain: the ``(axis, start, stop)`` slices from the root to the region,
            outermost first (empty: the whole root).
    """

    root: int
    shape: tuple
    dtype: Any
    channels_last: bool = False
    chain: Chain = ()
    #: the chain composed once into one basic index of the root buffer (the hot path slices once)
    index: tuple = attrs.field(init=False, eq=False, repr=False)

    @index.default
    def _compose_chain(self) -> tuple:
        return tuple(slice(start, stop) for start, stop in self.bounds()[1])

    def bounds(self) -> tuple:
        """``(root, ((start, stop) per axis))``: where the region lies in the
        root buffer, however its chain reached it."""
        spans = [[0, n] for n in self.shape]
        for axis, start, stop in self.chain:
            spans[axis] = [spans[axis][0] + start, spans[axis][0] + stop]
        return self.root, tuple(map(tuple, spans))

    def sub(self, axis: int, start: int, stop: int) -> "Region":
        """The region's slice ``start:stop`` along ``axis``."""
        return attrs.evolve(self, chain=self.chain + ((axis, start, stop),))

    def array(self, slots: dict, xp):
        """The region's view of ``slots[root]``, allocating the root buffer
        (uninitialised) in that slot when it is absent."""
        buf = slots.get(self.root)
        if buf is None:
            if self.channels_last:
                n, c, h, w = self.shape
                buf = xp.empty((n, h, w, c), dtype=self.dtype).transpose(0, 3, 1, 2)
            else:
                buf = xp.empty(self.shape, dtype=self.dtype)
            slots[self.root] = buf
        return buf[self.index] if self.chain else buf


#: the shortest run :func:`pitched_rows` copies as a 2-D memcpy: the copy moves
#: run by run, and a run shorter than a 16-byte word (a strided gather of single
#: elements) is left to the element-wise copy (not measured below this)
MIN_ROW_BYTES = 16


#: the largest pitch ``cudaMemcpy2DAsync`` takes (``cudaDevAttrMaxPitch`` on the
#: H200: 2^31 - 1 bytes); a copy at a wider pitch is element-wise
MAX_PITCH = 2 ** 31 - 1


def pitched_rows(dst, src) -> tuple[int, int, int, int] | None:
    """``(row_bytes, rows, dst_pitch, src_pitch)`` (bytes) when ``dst`` and ``src``
    (one shape and itemsize) are both ``rows`` runs of ``row_bytes`` contiguous
    bytes, one run every ``dst_pitch`` / ``src_pitch`` bytes, in the same element
    order: e.g. a dense channels-last tensor and its channel slice of a wider
    concat buffer (runs of the slice's channels, one per pixel). None otherwise.
    Dims are ordered by ``dst``'s strides (extents of 1 left out); the run is the
    longest innermost block contiguous in both arrays, at least
    :data:`MIN_ROW_BYTES`, and the rest must step by whole runs of one pitch in
    each (dense in units of the pitch). ``rows == 1``: both arrays fill their
    bytes from their first element on (C order, channels-last, any permutation
    of a contiguous array), a plain memcpy. The limits are CUDA's
    ``cudaMemcpy2D`` (pitches >= the run; CUDA Runtime API, memory management).
    Raises nothing: a layout it cannot describe is None."""
    dims = sorted((d for d in range(dst.ndim) if dst.shape[d] != 1), key=lambda d: (dst.strides[d], d))
    if any(src.strides[d] <= 0 or dst.strides[d] <= 0 for d in dims):
        return None
    if sorted(dims, key=lambda d: (src.strides[d], d)) != dims:
        return None
    run, k = dst.itemsize, 0
    while k < len(dims) and dst.strides[dims[k]] == run and src.strides[dims[k]] == run:
        run *= dst.shape[dims[k]]
        k += 1
    if k == len(dims):
        return run, 1, run, run
    if run < MIN_ROW_BYTES:
        return None
    dst_pitch, src_pitch, rows = dst.strides[dims[k]], src.strides[dims[k]], 1
    for d in dims[k:]:
        if dst.strides[d] != dst_pitch * rows or src.strides[d] != src_pitch * rows:
            return None
        rows *= dst.shape[d]
    if dst_pitch < run or src_pitch < run:
        return None
    return run, rows, dst_pitch, src_pitch


def _memcpy_2d(dst, src, rows: tuple[int, int, int, int]) -> None:
    """One ``cudaMemcpy2DAsync`` on the current stream (a memcpy node when captured)."""
    import cupy

    row_bytes, count, dst_pitch, src_pitch = rows
    cupy.cuda.runtime.memcpy2DAsync(dst.data.ptr, dst_pitch, src.data.ptr, src_pitch, row_bytes, count,
                                    cupy.cuda.runtime.memcpyDeviceToDevice,
                                    cupy.cuda.get_current_stream().ptr)


def copy_into(dst, src) -> None:
    """``dst[...] = src`` for one dtype; bfloat16 moved as its 16-bit pattern
    (CuPy copies uint16 arrays; it may not compute on bfloat16 ones).

    Two CuPy arrays of one shape and dtype are copied by the copy engine's
    path where their bytes allow it (:func:`pitched_rows`): as one
    device-to-device memcpy when both are dense in one element order (e.g.
    both channels-last), as one 2-D memcpy when both are runs of bytes at a
    pitch of at most :data:`MAX_PITCH` (a channels-last tensor into its channel
    slice of a concat buffer). CuPy's
    element-wise copy indexes a non-C-order array element by element: 0.50 ms
    for a 103 MB channels-last fp32 tensor against 0.052 ms for the memcpy on
    the H200 (docs/results/h200-2026-12-04d/call3). Anything else, and NumPy
    arrays, take ``dst[...] = src``."""
    if dst.dtype.name == "bfloat16":
        dst, src = dst.view(np.uint16), src.view(np.uint16)
    memory = getattr(dst, "data", None)
    if hasattr(memory, "copy_from_device_async") and dst.shape == src.shape and dst.dtype == src.dtype:
        if dst.size == 0 or dst.data.ptr == src.data.ptr and dst.strides == src.strides:
            return
        rows = pitched_rows(dst, src)
        if rows is not None and rows[1] == 1:  # both dense, one element order
            memory.copy_from_device_async(src.data, dst.nbytes)
            return
        if rows is not None and max(rows[2], rows[3]) <= MAX_PITCH:
            _memcpy_2d(dst, src, rows)
            return
    dst[...] = src


class StepView:
    """How a step whose output is a view runs (subclasses); ``describe`` is
    the mark ``Executable.report`` prints beside the step."""

    def run(self, st, slots: dict, inputs: list):  # pragma: no cover - abstract
        raise NotImplementedError

    def describe(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError


@attrs.frozen
class WriteInto(StepView):
    """The step's kernel writes its output into ``region`` (``out=``)."""

    region: Region
    xp: Any = attrs.field(eq=False)
    into: str = ""  # the name of the concat it writes into, for the report
    copy: bool = False  # the kernel cannot write a strided view: copy its result

    def run(self, st, slots, inputs):
        out = self.region.array(slots, self.xp)
        if self.copy:
            copy_into(out, st.kernel(st.ctx, st.op.op, *inputs))
        else:
            st.kernel(st.ctx, st.op.op, *inputs, out=out)
        return out

    def describe(self) -> str:
        if self.copy:
            return f"copied into its slice of {self.into} (its kernel cannot write a view)"
        return f"zero-copy: writes into its slice of {self.into}"


@attrs.frozen
class AssembleConcat(StepView):
    """A concat's step: its output is ``region``; ``copies`` lists
    ``(input position, axis, start, stop)`` of the inputs copied into it (the
    others wrote there themselves)."""

    region: Region
    copies: tuple
    xp: Any = attrs.field(eq=False)
    inputs: int = 0

    def run(self, st, slots, inputs):
        out = self.region.array(slots, self.xp)
        for pos, axis, start, stop in self.copies:
            copy_into(sliced(out, axis, start, stop), inputs[pos])
        return out

    def describe(self) -> str:
        if not self.copies:
            return "zero-copy: every input written in place"
        return f"zero-copy: {self.inputs - len(self.copies)} of {self.inputs} inputs written in place, " \
               f"{len(self.copies)} copied"


@attrs.frozen
class SliceView(StepView):
    """A ``Slice`` step returning a view of its input."""

    axis: int
    start: int
    stop: int

    def run(self, st, slots, inputs):
        return sliced(inputs[0], self.axis, self.start, self.stop)

    def describe(self) -> str:
        return "zero-copy: a view of its input"


def step_views(graph, plan, xp, types: dict | None = None) -> dict:
    """Node id -> :class:`StepView` for every step the zero-copy plan touches.

    Args:
        graph: the lowered graph (types give shapes, layouts, concat axes).
        plan: the ``InplacePlan``: its ``homes`` (value node id -> ``(concat
            node id, axis, start)``: the value's buffer is that concat's
            buffer sliced ``start:start+extent`` on ``axis``; the concat may
            be homed itself), ``views`` (``Slice`` steps returning a view) and
            ``copied_in``.
        xp: the array module; types: node id -> the type its value runs in
            (``run_types.run_types``: under ``compile(dtype=...)`` batch
            statistics stay float32 while the tensors are bfloat16, so a root
            buffer takes its own value's run dtype, not the override), or
            None: the declared types.
    """
    homes, views = plan.homes, plan.views
    from .op import abstract_of
    from .ops.tensor import Concat
    from .types import numpy_dtype

    def region(n: int) -> Region:
        chain = []
        while n in homes:
            container, axis, start = homes[n]
            chain.append((axis, start, start + graph.node(n).type.shape[axis]))
            n = container
        t = graph.node(n).type
        return Region(n, tuple(t.shape), numpy_dtype((types or {}).get(n, t).dtype),
                      t.layout == "NHWC" and t.ndim == 4, tuple(reversed(chain)))

    out: dict = {}
    containers = {c for c, _, _ in homes.values()}
    for n in sorted(set(homes) | containers):
        view = graph.node(n)
        if not isinstance(abstract_of(view.op), Concat):
            out[n] = WriteInto(region(n), xp, graph.node(homes[n][0]).name, n in plan.copied_in)
            continue
        mine = region(n)
        axis = abstract_of(view.op).axis % view.type.ndim
        start, copies = 0, []
        inputs = graph.input_ids(n)
        for pos, u in enumerate(inputs):
            stop = start + graph.node(u).type.shape[axis]
            if region(u).bounds() != mine.sub(axis, start, stop).bounds():
                copies.append((pos, axis, start, stop))
            start = stop
        out[n] = AssembleConcat(mine, tuple(copies), xp, len(inputs))
    for n in views:
        op = abstract_of(graph.node(n).op)
        out[n] = SliceView(op.axis % graph.node(n).type.ndim, op.start, op.stop)
    return out


__all__ = ["Region", "StepView", "WriteInto", "AssembleConcat", "SliceView", "copy_into", "pitched_rows",
           "sliced", "step_views"]
