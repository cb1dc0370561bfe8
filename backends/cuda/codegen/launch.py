"""Running a generated program: the compile cache, the plan cache, the launch path.

Compilation: each kernel source is compiled once per process through CuPy
(``cupy.RawModule``: NVRTC), cached in :func:`compiled` by its source text.
CuPy also keeps every compiled module on disk, keyed by a hash of the source,
the options, the GPU architecture and the NVRTC version, in
``$CUPY_CACHE_DIR`` (default ``~/.cupy/kernel_cache``): a second process
loads the binary instead of compiling (``CUPY_CACHE_IN_MEMORY=1`` turns the
disk cache off).

Plans: :func:`run` keys a plan (``plan.lower``) by everything the source and
the launch geometry depend on: the op (a frozen, hashable program), each
input's shape, strides, dtype and 16-byte alignment (which give its layout
and whether it is a view), the output type, and whether the output is
written into a given buffer. A hit costs building that key and one
dictionary lookup; the launch then allocates the output and
its temporaries from CuPy's pool and launches each kernel with scalars
prepared when the plan was made. Nothing is copied from the host, so every
step can be captured into a CUDA graph.

Operands are passed as they are stored. A strided view (neither C-ordered
nor packed channels-last: DenseNet's channel slice of a wider concat buffer,
which the zero-copy plan hands its readers) is read in place through its own
strides (:func:`view_strides`; the plan is keyed by them), in the physical
order its channel stride says (a channel slice of an NHWC buffer iterates
channels-last); a view stored as rows at a constant pitch (that slice) is
read 16 bytes at a time where its start and pitch allow (``plan.lower``). Copying it to C order first cost a transposing copy per
operand and then uncoalesced reads in an NHWC sweep: DenseNet-121's gradient
sums ran at 59 GB/s on the H200 (docs/performance.md). A ``(K, C)`` row operand
that is a column slice of a wider one (batch statistics shared through a
zero-copy concat) is read at its row pitch. Any other view the generator
cannot read through strides (a strided per-channel or per-plane vector) is
copied to C order; such operands are small.

Ticket counters: a reduction whose tiles add their own partial sums
(``kernels`` module docstring; ``plan.FINISH_BYTES``, off by default) counts
finished blocks in zeroed ``unsigned int`` counters that each launch leaves
at zero. Every plan gets its own range
of counters (:func:`_ticket_offset`, by plan key), in one zeroed buffer per
device (:func:`_tickets`) allocated, and synchronised, outside any stream
capture; a plan first made during a capture takes no tickets (its tiles use a
``finalize`` launch). Two launches of one plan may therefore not run at the
same time on two streams (opgraph's executors use one stream).
"""

from __future__ import annotations

import functools

import numpy as np

from opgraph.types import HALF_DTYPES, TensorType, is_channels_last, numpy_dtype, storage_order

from .contexts import row_pitch_of
from .ir import PlanError, ViewError
from .plan import lower

_PLANS: dict = {}
#: plan key -> (offset, count) of its ticket counters (kept when _PLANS is emptied)
_TICKET_OFFSETS: dict = {}
#: device id -> the zeroed counters of every plan; ``_TICKET_VIEWS``: (device, offset, n) -> view
_TICKET_BUFFERS: dict = {}
_TICKET_VIEWS: dict = {}
#: buffers replaced by a larger one: captured graphs may still use them
_RETIRED: list = []


@functools.lru_cache(maxsize=None)
def compiled(source: str, name: str):
    """The kernel ``name`` of ``source``, compiled on first use (CuPy imported here)."""
    import cupy
    return cupy.RawModule(code=source).get_function(name)


#: the storage order a kernel keeps for an operand (``'NHWC'``, ``'NCHW'`` or None)
array_layout = storage_order


def view_strides(a) -> tuple | None:
    """Element strides of ``a`` when it is a strided view the kernels read in
    place (neither C-ordered nor packed channels-last; non-negative strides
    in whole elements), else None (a dense array, or one to copy)."""
    if a.flags.c_contiguous or is_channels_last(a):
        return None
    if any(s < 0 or s % a.itemsize for s in a.strides):
        return None
    return tuple(s // a.itemsize for s in a.strides)


def address(a) -> int:
    """The address of ``a``'s first element (a CuPy or, under the tests' emulator, a NumPy array)."""
    return a.__array_interface__["data"][0] if isinstance(a, np.ndarray) else a.data.ptr


def _dtype(a) -> str:
    return a.dtype.name


def _bits(xp, a):
    """``a`` as a kernel takes it: bfloat16 and float16 as their uint16 bits (a view)."""
    return a.view(xp.uint16) if a.dtype.name in HALF_DTYPES else a


def _dense(a) -> bool:
    return a.flags.c_contiguous or is_channels_last(a)


def aliased(out, arrays) -> bool:
    """Whether ``out`` is an input's own buffer (an in-place step, :func:`run`'s contract: the
    output given is an input of its type, or a buffer of its own, such as a slot or a concat's
    slice): a non-empty input starting at ``out``'s first byte. Outputs that overlap an input
    only partly are outside that contract for every generated kernel."""
    if out is None or not out.size:
        return False
    start = address(out)
    return any(a.size and address(a) == start for a in arrays)


def _key(op, arrays, out_type: TensorType, out) -> tuple:
    """Everything a plan depends on, from attributes alone (the hot path: no
    layout test): each array's shape, strides, dtype and 16-byte alignment,
    the output type and whether (and how aligned) an output buffer is given,
    and whether it overlaps an input (:func:`aliased`)."""
    return (op, tuple((a.shape, a.strides, a.dtype.name, address(a) % 16 == 0) for a in arrays), out_type,
            None if out is None else (out.strides, address(out) % 16 == 0, aliased(out, arrays)))


def _entry(op, arrays, out_type: TensorType, out, tickets: bool = True) -> tuple:
    """``(plan, copied)``: the launch plan of ``op`` on arrays like these and the
    inputs to copy to C order before each launch (module docstring): strided
    views are read in place unless the generator loads one as a packed row
    (``ir.ViewError``); an array neither dense nor a readable view is copied.
    A copy is a fresh allocation, so it counts as aligned. ``tickets``: the
    plan's reductions may add their partial sums in their last blocks.

    Raises:
        ir.PlanError: the generator does not cover this op on these inputs.
    """
    views = {k: v for k, v in enumerate(map(view_strides, arrays)) if v is not None}
    unreadable = {k for k, a in enumerate(arrays) if k not in views and not _dense(a)}
    out_view = None if out is None else view_strides(out)
    out_pitch = None
    if out_view is not None:  # a column slice of a zero-copy concat's rows
        out_pitch = row_pitch_of(tuple(out.shape), out_view)
        if out_pitch is None:
            raise PlanError(f"an output view of shape {tuple(out.shape)} and strides {out.strides} "
                            f"(only a column slice of (K, C) rows is written in place)")

    def planned(copied: set):
        read = {k: v for k, v in views.items() if k not in copied}
        types = [TensorType(a.shape, _dtype(a), "NCHW" if k in copied and a.ndim == 4 else array_layout(a))
                 for k, a in enumerate(arrays)]
        dense_out = [out] if out is not None and out_pitch is None else []
        aligned = all(address(a) % 16 == 0 for k, a in enumerate([*arrays, *dense_out])
                      if k not in read and k not in copied)
        aligned_views = {k for k in read if address(arrays[k]) % 16 == 0}
        return (lower(op, types, out_type, aligned=aligned, inplace=out is not None, aliased=aliased(out, arrays),
                      views=read, aligned_views=aligned_views, tickets=tickets, out_row_pitch=out_pitch),
                tuple(sorted(copied)))

    try:
        return planned(unreadable)
    except ViewError:  # a view loaded as a packed row: every view copied
        return planned(unreadable | set(views))


def _cached(op, arrays, out_type: TensorType, out, xp=None) -> tuple:
    """``(plan, copied, ticket offset)``: :func:`_entry`, made once per :func:`_key`."""
    key = _key(op, arrays, out_type, out)
    entry = _PLANS.get(key)
    if entry is None:
        plan, copied = _entry(op, arrays, out_type, out, tickets=not _capturing(xp))
        entry = _PLANS[key] = (plan, copied, _ticket_offset(key, plan.tickets))
    return entry


def _capturing(xp) -> bool:
    """Whether the current CuPy stream is capturing a CUDA graph (False on NumPy)."""
    cuda = getattr(xp, "cuda", None)
    return cuda is not None and cuda.get_current_stream().is_capturing()


def _ticket_offset(key, count: int) -> int:
    """The first of ``count`` ticket counters reserved for the plan ``key``
    (each plan key its own range, never reused)."""
    if not count:
        return 0
    have = _TICKET_OFFSETS.get(key)
    if have is None or have[1] < count:  # new, or rebuilt with more tiles (a knob changed): a new range
        have = _TICKET_OFFSETS[key] = (_RESERVED[0], count)
        _RESERVED[0] += count
    return have[0]


#: counters reserved so far, over all plans
_RESERVED = [0]


def _zeroed_counters(xp, n: int):
    """``n`` zeroed uint32 counters. On the GPU a plain allocation, not from a
    memory pool (a CUDA graph's private pool frees its blocks when it dies),
    zeroed and synchronised before any stream can launch a kernel on them."""
    cuda = getattr(xp, "cuda", None)
    if cuda is None:
        return xp.zeros(n, dtype=xp.uint32)
    memory = cuda.Memory(4 * n)
    buf = xp.ndarray((n,), dtype=xp.uint32, memptr=cuda.MemoryPointer(memory, 0))
    cuda.runtime.memset(buf.data.ptr, 0, 4 * n)
    cuda.runtime.deviceSynchronize()
    return buf


def _tickets(xp, offset: int, count: int):
    """The zeroed counters ``[offset, offset + count)`` on the current device."""
    cuda = getattr(xp, "cuda", None)
    device = cuda.runtime.getDevice() if cuda is not None else -1
    view = _TICKET_VIEWS.get((device, offset, count))
    if view is None:
        buf = _TICKET_BUFFERS.get(device)
        if buf is None or buf.size < offset + count:
            if buf is not None:
                _RETIRED.append(buf)  # earlier views and captured graphs still point into it
            buf = _TICKET_BUFFERS[device] = _zeroed_counters(xp, max(2 * _RESERVED[0], 4096))
        view = _TICKET_VIEWS[(device, offset, count)] = buf[offset:offset + count]
    return view


def plan_for(op, arrays, out_type: TensorType, out=None):
    """The cached launch plan of ``op`` on these arrays (module docstring for the key).

    Raises:
        ir.PlanError: the generator does not cover this op on these inputs.
    """
    return _cached(op, arrays, out_type, out)[0]


def empty(xp, shape, dtype, layout: str | None = None):
    """An uninitialised array of logical ``shape`` and ``dtype``, channels-last
    when ``layout`` is ``'NHWC'`` and the shape is 4-D, else C-ordered
    (bfloat16 and float16 allocated as uint16 and viewed: CuPy allocates those)."""
    dt = numpy_dtype(dtype.name if hasattr(dtype, "name") else dtype)
    store = xp.uint16 if dt.name in HALF_DTYPES else dt
    if layout == "NHWC" and len(shape) == 4:
        n, c, h, w = shape
        return xp.empty((n, h, w, c), dtype=store).view(dt).transpose(0, 3, 1, 2)
    return xp.empty(tuple(shape), dtype=store).view(dt)


def run(xp, op, arrays, out_type: TensorType, out=None):
    """``op`` (a single memory-bound op or a ``FusedElementwise``) on CuPy ``arrays``
    by generated kernels: its output, of ``out_type`` (written into ``out``
    when given: an input of the output's type, for an in-place step).

    Raises:
        ir.PlanError: the generator does not cover this op on these inputs.
    """
    plan, copied, tickets = _cached(op, arrays, out_type, out, xp)
    if copied:
        arrays = [xp.ascontiguousarray(a) if k in copied else a for k, a in enumerate(arrays)]
    buffers = {("in", k): _bits(xp, a) for k, a in enumerate(arrays)}
    target = out if out is not None else empty(xp, out_type.shape, out_type.dtype, plan.layout)
    buffers["out"] = _bits(xp, target)
    ct = np.float64 if plan.ct == "double" else np.float32
    for key, count in plan.temps.items():
        buffers[key] = xp.empty(max(count, 1), dtype=ct)
    if plan.tickets:
        buffers["tickets"] = _tickets(xp, tickets, plan.tickets)
    for launch in plan.launches:
        compiled(launch.source, launch.name)(launch.grid, launch.block, launch.params.arguments(buffers))
    return target


__all__ = ["compiled", "address", "aliased", "array_layout", "view_strides", "empty", "plan_for", "run"]
