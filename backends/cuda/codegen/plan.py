"""Launch plans: a program on concrete shapes, dtypes and layouts as a list of kernels.

:func:`lower` builds the program's IR (``expressions.py``) and cuts it into
phases at its reductions: every reduction of one depth and target is one
kernel (``kernels.columns`` for channels-last data, ``kernels.rows`` for
C-order data, split over blocks to fill the GPU, then ``kernels.finalize``
when split), and the output is written by a last element-wise kernel
(``kernels.sweep`` over S, or ``kernels.space_sweep`` over channels or
planes) or, for a reduction's output, by the finishing code of the last
reduction. A later phase reads the sums of earlier ones (``carry`` buffers,
in CT) as per-channel or per-plane values and recomputes the element-wise
values it needs from the inputs, so no full-size intermediate is written.
A program of one phase of short ``row`` sums and a full-size output (a layer
norm) runs as one kernel instead (``kernels.row_sweep``, :data:`ROW_SWEEP`):
its rows' sums never leave the chip, and each row is read from DRAM once.

Choices made here, per signature (``ProgramPlan`` is cached by the caller):

* vector width ``V = 16 / (smallest itemsize of the full-size operands)``
  where every such buffer is 16-byte aligned (and, for a reduction, its kept
  channel run divides by V), else 1;
* sweep mode (``contexts.Sweep``): ``hoist``, ``uniform`` or ``lane``;
* 32-bit index arithmetic below 2^31 elements, 64-bit above;
* splits: about :data:`TARGET_BLOCKS` blocks per reduction, each thread
  summing at least :data:`MIN_PER_THREAD` vectors; a channels-last
  reduction's blocks own narrow tiles of channels (:data:`TILE_BYTES` of a
  row), so short tensors are split into few parts;
* who adds a split reduction's partial sums: its tiles' last blocks when
  they are at most :data:`FINISH_BYTES` per tile, else a ``finalize`` launch.
"""

from __future__ import annotations

import hashlib
import math

import attrs

from opgraph.ops.fused import FusedElementwise, FusedStep, Program

from . import kernels
from .contexts import Geometry, Pitch, RowPitch, entries, pitch_of, row_pitch_of
from .emit import Params
from .expressions import EXPRESSIONS, reduction_target
from .ir import (SPLIT_SPACES, TARGETS, Builder, Ext, PackingError, PlanError, Stacked, Val, ViewError, classify,
                 depths, needed, trailing_axes, within)
from .storage import compute_type, storage_of

#: Blocks a split reduction aims at: 4 per SM of an H200 (132 SMs). Half of
#: 1056 (8 per SM, one full wave) halves the partial sums each block writes
#: and the finishing kernel reads; on the H200 it took the batch-norm
#: reductions of ResNet-50 from 1.20 to 0.98 ms and DenseNet-121's sample from
#: 1.14 to 0.93 ms (``scripts/gpu_codegen_bench.py``, docs/performance.md).
TARGET_BLOCKS = 528
#: Blocks an element-wise sweep launches at most (each thread then loops):
#: one full wave of 8 blocks per SM. More blocks leave a thread one vector,
#: so its per-channel values (loaded and computed once per thread) cost as
#: much as its data: 4224 was 7-11 % slower on the same samples.
MAX_SWEEP_BLOCKS = 1056
#: Bytes of one row a channels-last reduction block reads at a time, at least
#: (``_tile_groups``): one 128-byte line. Narrow tiles (64 bf16 channels) make
#: many blocks without splitting the rows finely, so a short tensor's partial
#: sums stay a small fraction of its bytes: DenseNet-121's 64 x 1024 x 7 x 7
#: batch norm had one tile of 1024 channels, 392 splits of 8 rows each, and
#: wrote half as many bytes of partial sums as it read. 4096 gives the widest
#: tiles (up to 256 groups). Measured on the H200 (``gpu_codegen_bench.py``,
#: docs/performance.md, eighth session): 128 against 4096, DenseNet-121's 40
#: sampled reductions 781 → 733 µs, ResNet-50's 24 1665 → 1559 µs (the 7 x 7
#: and 14 x 14 ones up to 2.7x faster).
TILE_BYTES = 128
#: A split reduction's tile adds its own partial sums in its last block (no
#: ``finalize`` launch) when they take at most this many bytes; 0: always a
#: separate launch. Measured on the H200 (same bench): 32 KiB was slower than
#: the separate launch on every shape it changed (DenseNet-121's sample 733 →
#: 768 µs; 64 x 992 x 14 x 14 statistics 10.9 → 15.4 µs): the last block adds
#: the partial sums after every other block has finished, a tail longer than
#: the launch it saves inside a CUDA graph. Kept as a knob, off.
FINISH_BYTES = 0
#: Bytes of full-size loads a thread of a reduction issues per iteration of its
#: main loop, at least: it loads ``ceil(ROW_LOAD_BYTES / its bytes per step)``
#: steps of its run at a time (``kernels._strided_loop``: rows of channels-last
#: data, vectors of a C-order run), at most :data:`MAX_ROWS_PER_ITERATION`.
#: Why: at 4 blocks of 256 threads per SM, one 16-byte load in flight per
#: thread is ~16 KiB per SM, under what the H200's copy bandwidth times its
#: memory latency asks (~20-25 KiB: Little's law). The batch-norm statistics
#: (x alone, one 16-byte word a row) ran at ~72 % of the copy bandwidth on
#: ResNet-50's large shapes where the backward sums (x and dy: two words a
#: row) ran at ~93 % (``gpu_codegen_bench.py``, eighth session). 0: one step
#: per iteration, as before (the bench's ``--row-bytes``).
ROW_LOAD_BYTES = 32
MAX_ROWS_PER_ITERATION = 4
#: Blocks of 256 threads per SM a kernel taking several steps an iteration
#: declares it runs at (``__launch_bounds__``; :data:`TARGET_BLOCKS` aims at 4
#: per SM of an H200), so ptxas may give it up to 64 registers a thread. Without
#: it ptxas kept 32 (enough for 8 blocks an SM) by issuing the second step's
#: load only after the first step's arithmetic, which waits for the first
#: load: one load in flight again (seen in the SASS, ``scripts/kernel_sass.py``).
#: Kernels taking one step keep their text, undeclared.
STEP_BLOCKS = 4
#: Vectors each thread of a split reduction sums at least.
MIN_PER_THREAD = 4
#: A program whose reductions are unsplit ``row`` sums of one depth and whose
#: output is full-size (a layer norm and its data gradient) runs as one kernel,
#: ``kernels.row_sweep``: each block reduces its rows, then its threads write
#: their rows' outputs from the sums kept on chip, re-reading the vectors they
#: just summed (from L1, or L2) instead of reading them from DRAM in a second
#: kernel. False: the reduction and the sweep as two launches (the bench's
#: ``--row-sweep``). ConvNeXt-tiny's layer norms moved x three times (forward)
#: and gy, x twice each (data gradient) at 75 and 86 % of the copy bandwidth
#: (H100, docs/performance.md, thirtieth session).
ROW_SWEEP = True
#: The most vectors of its row a thread of ``kernels.row_sweep`` takes (longer
#: rows, or rows split over blocks, keep the two-kernel plan). Why 4, as
#: :data:`MIN_PER_THREAD`: TE is chosen so that a row of up to 1024 vectors
#: (8192 bf16 elements) gives each thread at most 4, and then a block re-reads
#: at most 256 x 4 x 16 B = 16 KiB per full-size operand, right after its tree:
#: a wave of 4-8 blocks a SM on 132 SMs holds 8-17 MiB per operand, inside the
#: H100's and H200's 50 MB of L2 even where L1 has let it go. Longer rows give
#: each of the 256 threads more vectors, a wave more bytes to keep until the
#: re-read (not measured: ConvNeXt's rows are 12-96 vectors, 3 a thread).
ROW_SWEEP_VECTORS = 4
#: Shared memory a reduction block may use for its partial sums (bytes).
SHARED_BYTES = 48 * 1024
#: Elements from which index arithmetic is 64-bit (the fast 32-bit division
#: needs every dividend below 2^31).
INT32_LIMIT = 2 ** 31


def as_program(op, n_inputs: int) -> Program:
    """``op``'s program: its own, or a one-step program of a single op."""
    if isinstance(op, FusedElementwise):
        return op.program
    return Program(n_inputs, (FusedStep(op, tuple(range(n_inputs))),), (n_inputs,))


@attrs.frozen
class Group:
    """The reductions one kernel computes: reduce node ids of one depth and target."""

    target: str
    nodes: tuple
    depth: int
    carry: str


@attrs.frozen
class Launch:
    """One kernel launch of a plan."""

    name: str
    source: str
    params: Params = attrs.field(eq=False)
    grid: tuple
    block: tuple = (kernels.THREADS, 1, 1)


@attrs.frozen
class Built:
    """A program's IR on its shapes: nodes, output, iteration geometry."""

    nodes: list
    dtypes: tuple
    full: tuple | None
    channels: int
    out_node: int | None     # the full-size output node, or None
    rows: tuple              # else the output rows (node ids) of ``target``
    target: str | None
    trailing: int = 0        # k of the program's ``row`` / ``col`` split (``ir``), 0 if none
    fill: tuple | None = None  # (node, input): column sums filled into an input (``Builder.fill_columns``)


def _iteration_shape(program: Program, types) -> tuple | None:
    values = program.value_types(types)
    shapes = []
    for k, step in enumerate(program.steps):
        spec = EXPRESSIONS.get(type(step.op))
        if spec is None:
            raise PlanError(f"{step.op.name} has no generated kernel")
        if spec.iterates == "out":
            shapes.append(values[program.n_inputs + k].shape)
        elif spec.iterates == "in":
            shapes.append(values[step.args[0]].shape)
    if not shapes:
        return None
    full = max(shapes, key=lambda s: (math.prod(s), len(s)))
    for s in shapes:
        classify(s, full)  # raises when an op runs over a shape that is not S or a broadcast of it
    return tuple(full)


def build(op, types, out_type, views=frozenset()) -> Built:
    """The IR of ``op`` (a single op or a ``FusedElementwise``) on input ``types``.

    A broadcast operand varying along a trailing block of a C-order S is read
    as a packed column (``ir.Builder``), unless its input is one of ``views``
    (strided views: a packed load would copy them) or the program cannot keep
    it (``PackingError``): then it is built again with that operand strided.

    Raises:
        PlanError: an op without an expression, operands the generator cannot
            place, or an output it cannot write.
    """
    program = as_program(op, len(types))
    full = _iteration_shape(program, types)
    full_size = [t for t in (*types, out_type) if full is not None and tuple(t.shape) == full]
    c_order = full is not None and (len(full) != 4 or all(t.layout != "NHWC" for t in full_size))
    packable = frozenset(range(len(types))) - frozenset(views) if c_order else frozenset()
    try:
        return _build(program, types, out_type, full, packable)
    except PackingError:
        return _build(program, types, out_type, full, frozenset())


def _build(program, types, out_type, full, packable: frozenset) -> Built:
    channels = (full[1] if len(full) >= 2 else full[0]) if full else out_type.shape[-1]
    b = Builder(full, channels, packable)
    values: list = [Ext(k, t) for k, t in enumerate(types)]
    member_types = program.value_types(types)
    for step in program.steps:
        spec = EXPRESSIONS[type(step.op)]
        values.append(spec.build(b, step.op, tuple(member_types[a] for a in step.args),
                                 *(values[a] for a in step.args)))
    outs = [values[o] for o in program.outputs]
    if len(outs) == 1 and isinstance(outs[0], Stacked):
        outs = list(outs[0].rows)
    if any(not isinstance(v, Val) for v in outs):
        raise PlanError("an output that is a program input or stacked rows inside several outputs")
    dtypes = tuple(t.dtype for t in types)
    if b.packed and any(n.kind == "reduce" and n.target not in SPLIT_SPACES for n in b.nodes):
        raise PackingError("a reduction to channels, planes or one value beside a packed column operand")
    if len(outs) == 1 and full is not None and tuple(out_type.shape) == full:
        return Built(b.nodes, dtypes, full, channels, outs[0].node, (), None, b.trailing, b.fill)
    if b.fill is not None:
        raise PlanError("column sums filled into an input beside an output that is not full-size")
    stacked = len(program.outputs) > 1 or isinstance(values[program.outputs[0]], Stacked)
    row_shape = tuple(out_type.shape[1:] if stacked else out_type.shape)
    if full is None:
        target = "channel" if row_shape == (channels,) else "scalar"
    elif b.trailing and row_shape == full[len(full) - b.trailing:]:
        # a split program's output of the trailing shape: per column (with K = 1, or
        # an (R, K) S, the entries a total or per-channel sum would name)
        target = "col"
    else:
        target = reduction_target(full, row_shape)
        if target == "col":
            b.split(trailing_axes(full, row_shape))
    if b.packed and target not in SPLIT_SPACES:
        raise PackingError(f"a {target} reduction beside a packed column operand")
    if target not in TARGETS or any(not within(v.space, target) for v in outs):
        raise PlanError(f"an output of shape {tuple(out_type.shape)} for values over {full}")
    return Built(b.nodes, dtypes, full, channels, None, tuple(v.node for v in outs), target, b.trailing)


def _groups(built: Built) -> list[Group]:
    """The reduction kernels, in phase order (the writer of the output rows last)."""
    roots = [built.out_node] if built.out_node is not None else list(built.rows)
    seen, stack = set(), list(roots)
    while stack:  # every node the output needs, through reductions
        k = stack.pop()
        if k not in seen:
            seen.add(k)
            stack.extend(built.nodes[k].args)
    depth = depths(built.nodes)
    keys = sorted({(depth[k], built.nodes[k].target) for k in seen if built.nodes[k].kind == "reduce"},
                  key=lambda dk: (dk[0], dk[1] == built.target))
    return [Group(t, tuple(sorted(k for k in seen if built.nodes[k].kind == "reduce" and depth[k] == d
                                  and built.nodes[k].target == t)), d, f"carry{g}")
            for g, (d, t) in enumerate(keys)]


def _full_loads(built: Built, roots, geo: Geometry) -> list[str]:
    """Storage dtypes of the full-size loads (read as vectors) of the nodes
    ``roots`` need: dense operands and pitched views (those read through
    coordinates take one element per lane whatever V is)."""
    return [built.dtypes[built.nodes[k].load.input] for k in needed(built.nodes, roots)
            if built.nodes[k].kind == "load" and built.nodes[k].load.kind == "full"
            and (built.nodes[k].load.input not in geo.strides or built.nodes[k].load.input in geo.pitched)]


def _lanes(dtypes, aligned: bool, divides: int | None = None) -> int:
    """V: one 16-byte word of the narrowest full-size operand per lane group
    (wider operands take several words), or 1 where the buffers are not all
    aligned or ``divides`` (the contiguous run a reduction vectorises) is not
    a multiple of it."""
    if not dtypes or not aligned:
        return 1
    v = 16 // min(storage_of(d).itemsize for d in dtypes)
    return 1 if divides is not None and divides % v else v


def _rows_per_iteration(loads, lanes: int) -> int:
    """Steps (rows, or vectors of a C-order run) a reduction's thread loads per
    iteration (:data:`ROW_LOAD_BYTES`): its full-size loads of one step are
    ``lanes`` elements of each operand in ``loads``."""
    row_bytes = lanes * sum(storage_of(d).itemsize for d in loads)
    if ROW_LOAD_BYTES <= 0 or row_bytes <= 0:
        return 1
    return min(MAX_ROWS_PER_ITERATION, -(-ROW_LOAD_BYTES // row_bytes))


def _pow2(n: int) -> int:
    """The power of two at or above ``n`` (1 for n <= 1)."""
    return 1 << max(int(n) - 1, 0).bit_length()


def _split(blocks_per_split: int, work: int, per_thread: int) -> tuple[int, int]:
    """``(S, PER)``: splits of ``work`` items (each block's threads take
    ``per_thread`` at a time) so that about TARGET_BLOCKS blocks run."""
    if work <= 0:
        return 1, max(work, 1)
    s = max(1, min(-(-TARGET_BLOCKS // max(blocks_per_split, 1)), -(-work // (per_thread * MIN_PER_THREAD))))
    per = -(-work // s)
    return -(-work // per), per


def _name(source: str, kind: str) -> str:
    return f"opgraph_gen_{kind}_{hashlib.sha1(source.encode()).hexdigest()[:12]}"


def _named(make, kind: str):
    """``make(name)`` with the name derived from the source itself (so equal
    kernels share a name and a cache entry)."""
    draft = make("KERNEL")
    name = _name(draft, kind)
    return name, draft.replace(" KERNEL(", f" {name}(")  # after "void" or its __launch_bounds__


def _layout(built: Built, types, out_type) -> str:
    """The physical order of S: the output's (a full-size output), else the
    first full-size input's; only 4-D values are ever channels-last. A program
    with a ``row`` / ``col`` split runs in C order (its rows contiguous: ``ir``);
    operands stored otherwise are read through their strides."""
    if built.full is None or len(built.full) != 4 or built.trailing:
        return "NCHW"
    if built.out_node is not None and out_type.layout in ("NCHW", "NHWC"):
        return out_type.layout
    return next((t.layout or "NCHW" for t in types if tuple(t.shape) == built.full), "NCHW")


def logical_strides(t, full, own: tuple | None = None) -> tuple:
    """Element strides of operand type ``t`` along each axis of ``full``
    (0 on broadcast axes): ``own`` (a strided view's, per axis of ``t``), else
    those of its layout (channels-last or C order)."""
    shape = tuple(t.shape)
    if own is not None:
        own = tuple(own)
    elif t.layout == "NHWC" and len(shape) == 4:
        n, c, h, w = shape
        own = (h * w * c, 1, w * c, c)
    else:
        own = tuple(math.prod(shape[a + 1:]) for a in range(len(shape)))
    pad = len(full) - len(shape)
    return (0,) * pad + tuple(0 if s == 1 else st for s, st in zip(shape, own))


@attrs.frozen
class Lowered:
    """A program's launches on one signature and the buffers they use.

    ``temps``: buffer key -> element count (in the compute type ``ct``);
    ``layout``: the order of a full-size output (None: rows, C order);
    ``tickets``: the zeroed counters its last-block reductions take tickets
    from (``kernels`` module docstring; ``launch.py`` keeps them), 0 if none.
    """

    launches: tuple
    temps: dict = attrs.field(eq=False)
    ct: str
    layout: str | None
    tickets: int = 0


def lower(op, types, out_type, *, aligned: bool = True, inplace: bool = False, aliased: bool = False,
          views: dict | None = None, aligned_views=frozenset(), tickets: bool = True,
          out_row_pitch: int | None = None) -> Lowered:
    """The launches running ``op`` on inputs of ``types`` (TensorTypes whose
    ``layout`` says how each array is stored) into ``out_type``.

    ``aligned``: every full-size buffer starts on a 16-byte boundary (vector
    access allowed); ``inplace``: an output buffer is given (no
    ``__restrict__``); ``aliased``: it is an input's own buffer (``launch.aliased``:
    a program sampling a row's first element then takes one kernel or none);
    ``views``: input number -> element strides of the
    inputs that are strided views (``launch.view_strides``), read through
    those strides wherever they are loaded as full-size or strided operands
    (or sampled at ``(0, c, 0, 0)``); ``aligned_views``: the inputs of
    ``views`` whose first element lies on a 16-byte boundary; ``tickets``:
    a split reduction may add its partial sums in its tiles' last blocks
    (else always a ``finalize`` launch); ``out_row_pitch``: the output is
    a column slice of a wider ``(K, C')`` buffer, its rows that many elements
    apart (a zero-copy concat of batch statistics). A full-size
    operand stored as rows at a constant pitch (a channel slice of a wider
    buffer, ``contexts.pitch_of``) is read with one division per vector, 16
    bytes at a time where its rows and start allow, instead of dividing each
    lane's index into coordinates.

    Raises:
        PlanError: what the generator does not cover (``build``).
        ViewError: a view of ``views`` is loaded as a packed per-channel or
            per-plane row (a column slice of a ``(K, C)`` row operand is read
            at its row pitch instead: ``contexts.RowPitch``).
    """
    views = views or {}
    built = build(op, types, out_type, views=frozenset(views))
    layout = _layout(built, types, out_type)
    strided, row_views = {}, {}
    for node in built.nodes:
        load = node.load
        if load is None:
            continue
        row_view = (_row_pitch(types[load.input], views[load.input], load.input in aligned_views)
                    if load.input in views and load.kind == "channel" else None)
        if row_view is not None:
            row_views[load.input] = row_view
        elif load.input in views:
            if load.kind not in ("full", "strided", "sample"):
                raise ViewError(f"input {load.input}: a strided view loaded as a {load.kind} row")
            strided[load.input] = logical_strides(types[load.input], built.full, views[load.input])
        elif load.kind == "strided" or (load.kind == "full" and len(built.full) == 4 and
                                        (types[load.input].layout or "NCHW") != layout):
            strided[load.input] = logical_strides(types[load.input], built.full)
    ct = compute_type([*built.dtypes, out_type.dtype])
    geo = Geometry(built.full, layout, built.channels, strided, ct, trailing=built.trailing)
    if out_row_pitch is not None and (built.out_node is not None or len(out_type.shape) != 2):
        raise PlanError(f"an output {out_type} written through a row pitch: only (K, C) rows can be")
    geo = attrs.evolve(geo, pitched=_pitched(built, geo, aligned_views), aligned=aligned, row_pitch=row_views,
                       out_row_pitch=out_row_pitch)
    spans = [geo.total // p.block * p.pitch for p in geo.pitched.values()]  # a pitched view's last row's start
    wide = max([geo.total, out_type.size, *(t.size for t in types), *spans]) >= INT32_LIMIT
    groups = _groups(built)
    one = _row_sweep(built, geo, wide, groups, out_type.dtype, aligned, inplace)
    if one is not None and built.fill is not None:
        return _filled(built, geo, wide, one, types[built.fill[1]].dtype, layout)
    if one is not None:
        return Lowered((one,), {}, ct, layout)
    if built.fill is not None:
        raise PlanError("column sums filled into an input need the one-kernel row sweep (ROW_SWEEP: an "
                        f"unsplit row of at most {ROW_SWEEP_VECTORS} vectors a thread); not these rows")
    if aliased and any(node.load is not None and node.load.kind == "rowsample" for node in built.nodes):
        # the output is an input's buffer: the separate sweep samples each row's first element again,
        # which the thread writing that element may already have overwritten (row_sweep reads it
        # before any store); an output of its own (a slot, a concat's slice) is no such case
        raise PlanError("an output in place of its input, whose row's first element (the statistics' "
                        "shift) a separate sweep would read after another thread overwrote it: only the "
                        "one-kernel row sweep writes in place")
    launches, temps, reduced = [], {}, {}
    writer = bool(groups) and built.out_node is None and groups[-1].target == built.target
    for g, group in enumerate(groups):
        rows = built.rows if writer and g == len(groups) - 1 else ()
        temps[group.carry] = len(group.nodes) * entries(geo, group.target)
        launches += _reduction(built, geo, wide, group, dict(reduced), rows, out_type.dtype, aligned, temps,
                               tickets)
        reduced.update({k: ("carry", group.carry, r, group.target) for r, k in enumerate(group.nodes)})
    program = (built.nodes, built.dtypes)
    if built.out_node is not None:
        if geo.total:  # an empty output needs no sweep
            launches.append(_sweep(built, geo, wide, reduced, out_type.dtype, aligned, inplace))
    elif not writer:
        params = Params(wide)
        name, text = _named(lambda n: kernels.space_sweep(n, program, geo, params, built.target, reduced,
                                                           built.rows, out_type.dtype), "space")
        blocks = -(-entries(geo, built.target) // kernels.THREADS)
        launches.append(Launch(name, text, params, (min(blocks, MAX_SWEEP_BLOCKS), 1, 1)))
    live = tuple(x for x in launches if all(d > 0 for d in x.grid))
    tickets = temps.pop("tickets", 0)  # counters, not a scratch buffer: launch.py keeps them zeroed
    return Lowered(live, temps, ct, layout if built.out_node is not None else None, tickets)


def _row_pitch(t, strides, aligned: bool = False) -> RowPitch | None:
    """A ``(K, C)`` row operand read in place at its row pitch, or None."""
    pitch = row_pitch_of(tuple(t.shape), tuple(strides))
    if pitch is None:
        return None
    return RowPitch(pitch, aligned and pitch * storage_of(t.dtype).itemsize % 16 == 0)


def _pitched(built: Built, geo: Geometry, aligned_views) -> dict:
    """The strided operands whose full-size loads take the row-pitch form (``Pitch``)."""
    full_loads = {node.load.input for node in built.nodes
                  if node.load is not None and node.load.kind == "full"}
    extents, axes = geo.physical
    out = {}
    for k in full_loads & set(geo.strides):
        form = pitch_of(extents, [geo.strides[k][a] for a in axes])
        if form is not None:
            out[k] = Pitch(*form, aligned=k in aligned_views)
    return out


def _sweep(built, geo, wide, reduced, out_dtype, aligned, inplace) -> Launch:
    program = (built.nodes, built.dtypes)
    lanes = _lanes(_full_loads(built, [built.out_node], geo) + [out_dtype], aligned)
    groups = geo.channels // lanes if geo.channels else 1
    if geo.channels_last and geo.channels % lanes == 0:
        mode = "hoist"
    elif not geo.channels_last and geo.inner % lanes == 0:
        mode = "uniform"
    else:
        mode = "lane"
    blocks = max(1, min(-(-(geo.total // lanes) // kernels.THREADS), MAX_SWEEP_BLOCKS))
    if mode == "hoist":  # the grid's stride must keep each thread on its channels
        step = groups // math.gcd(groups, kernels.THREADS)
        if step > MAX_SWEEP_BLOCKS:
            mode = "lane"
        else:
            blocks = -(-blocks // step) * step
    params = Params(wide)
    name, text = _named(lambda n: kernels.sweep(n, program, geo, params, lanes, mode, reduced, built.out_node,
                                                out_dtype, restrict=not inplace), "sweep")
    return Launch(name, text, params, (blocks, 1, 1))


def _run_split(k1: int, a: int, k2: int, b: int, lanes: int) -> tuple[dict, tuple]:
    """``(split, grid)`` of a C-order reduction (``kernels.rows``) keeping
    ``k1 * k2`` entries, each summing ``a`` runs of ``b`` elements (``lanes``
    a vector): its splits (``_split``) and TE, the threads sharing a run, as
    few as give each thread about :data:`MIN_PER_THREAD` vectors."""
    s, per = _split(k1 * k2, a * (b // lanes), kernels.THREADS)
    te = min(kernels.THREADS, _pow2(-(-per // MIN_PER_THREAD)))
    return dict(K1=k1, A=a, K2=k2, B=b, S=s, PER=per, TE=te), (-(-k2 // (kernels.THREADS // te)), s, k1)


def _loads_per_iteration(split: dict, loads, lanes: int) -> None:
    """``split``'s ``ROWS`` (steps a thread loads an iteration) and ``MIN_BLOCKS``
    (the occupancy a kernel taking several declares: :data:`STEP_BLOCKS`)."""
    split["ROWS"] = _rows_per_iteration(loads, lanes)
    split["MIN_BLOCKS"] = STEP_BLOCKS if split["ROWS"] > 1 else 0


def _row_sweep(built, geo, wide, groups, out_dtype, aligned, inplace) -> Launch | None:
    """The single ``kernels.row_sweep`` launch of a program whose reductions are
    all ``row`` sums of one depth (one group) and whose output is full-size,
    where each row is reduced by one block (one split) and its threads take at
    most :data:`ROW_SWEEP_VECTORS` vectors each; else None (the reduction and
    the sweep: :data:`ROW_SWEEP`). V is one 16-byte word of the narrowest
    full-size operand, the output's included, where it divides the row."""
    if not ROW_SWEEP or built.out_node is None or len(groups) != 1 or groups[0].target != "row" or not geo.total:
        return None
    group = groups[0]
    summed = _full_loads(built, [built.nodes[n].args[0] for n in group.nodes], geo)
    lanes = _lanes(summed + _full_loads(built, [built.out_node], geo) + [out_dtype], aligned, geo.row_len)
    split, grid = _run_split(1, 1, geo.n_rows, geo.row_len, lanes)
    if split["S"] > 1 or -(-split["PER"] // split["TE"]) > ROW_SWEEP_VECTORS:
        return None
    _loads_per_iteration(split, summed, lanes)
    params = Params(wide)
    program = (built.nodes, built.dtypes)
    fill = None if built.fill is None else built.fill[0]
    name, text = _named(lambda n: kernels.row_sweep(n, program, geo, params, lanes, group, split, built.out_node,
                                                    out_dtype, restrict=not inplace, fill=fill), "rowsweep")
    return Launch(name, text, params, grid)


def _filled(built, geo, wide, sweep: Launch, fill_dtype: str, layout) -> Lowered:
    """The row sweep ``sweep`` that also wrote each block's column sums of ``built.fill``
    (``kernels.row_sweep``), then a ``kernels.finalize`` launch adding the blocks' sums of each
    column in a fixed order (the same bits whatever the timing), rounded once into the filled
    input (``kernels.fill_finish``)."""
    blocks, columns = sweep.grid[0], geo.row_len
    split = dict(S=blocks, K2=columns, CEB=_combine_entries(columns, blocks))
    params = Params(wide)
    group = Group("col", (built.fill[0],), 0, "fill")

    def finish(lane):
        return kernels.fill_finish(params, fill_dtype, built.fill[1])
    name, text = _named(lambda n: kernels.finalize(n, geo.ct, params, group, split, finish), "fillsums")
    final = Launch(name, text, params, (-(-columns // split["CEB"]), 1, 1))
    return Lowered((sweep, final), {"part": blocks * columns}, geo.ct, layout)


def _tile_groups(loads, lanes: int, groups: int) -> int:
    """GB: the groups of V channels a channels-last reduction block owns, as few
    as keep a warp's reads of one row :data:`TILE_BYTES` long (a 128-byte line),
    so that more tiles, not more splits, fill the GPU (module docstring)."""
    word = lanes * min((storage_of(d).itemsize for d in loads), default=4)
    return max(1, min(groups, kernels.THREADS, -(-TILE_BYTES // word)))


def _combine_entries(width: int, s: int) -> int:
    """CEB: entries one pass of ``kernels.combine`` adds (a power of two); the
    other ``256 / CEB`` threads share each entry's ``s`` partial sums, about
    MIN_PER_THREAD each, so that no thread adds a long chain of loads (a
    separate ``finalize`` of 528 splits runs one entry per block)."""
    share = min(kernels.THREADS, _pow2(-(-s // MIN_PER_THREAD)))
    return min(_pow2(width), max(1, kernels.THREADS // share))


def _reduction(built, geo, wide, group, reduced, rows, out_dtype, aligned, temps, tickets) -> list[Launch]:
    program, k = (built.nodes, built.dtypes), len(group.nodes)
    loads = _full_loads(built, [built.nodes[n].args[0] for n in group.nodes], geo)
    n, c, total = geo.batch, geo.channels, geo.total
    ct_bytes = 8 if geo.ct == "double" else 4
    # the split's targets in C order (``_layout``): a row is a run of K, a
    # column reduction keeps K adjacent entries of each of the R rows
    if group.target in ("scalar", "row") or (group.target in ("channel", "plane") and not geo.channels_last):
        k1, a, k2, b = {"scalar": (1, 1, 1, total), "channel": (1, n, c, geo.inner),
                        "plane": (n, 1, c, geo.inner), "row": (1, 1, geo.n_rows, geo.row_len)}[group.target]
        lanes = _lanes(loads, aligned, b)
        split, grid = _run_split(k1, a, k2, b, lanes)
        s, tile, make = split["S"], kernels.THREADS // split["TE"], kernels.rows
    else:
        k1, a, k2 = {"channel": (1, total // max(c, 1), c), "plane": (n, geo.inner, c),
                     "col": (1, geo.n_rows, geo.row_len)}[group.target]
        lanes = _lanes(loads, aligned, k2)
        if k * lanes * kernels.THREADS * ct_bytes > SHARED_BYTES:
            lanes = 1  # too many sums per thread for one word each
        gb = _tile_groups(loads, lanes, k2 // lanes)
        rb = kernels.THREADS // gb
        tiles = -(-(k2 // lanes) // gb)
        s, per = _split(tiles * k1, a, rb)
        tile = gb * lanes
        split, grid, make = dict(K1=k1, A=a, K2=k2, GB=gb, RB=rb, S=s, PER=per), (tiles, s, k1), kernels.columns
    _loads_per_iteration(split, loads, lanes)
    # the tile's last block adds the partial sums when they are few (module docstring)
    split["last"] = tickets and s > 1 and s * k * tile * ct_bytes <= FINISH_BYTES
    # one CEB for both adders, so the partial sums are added in the same order
    # (the same bits) whether the tile's last block or a finalize launch adds them
    split["CEB"] = _combine_entries(tile, s)
    params = Params(wide)
    sums = [f"s{r}" for r in range(k)]

    def finish(lane):
        return kernels.finish(program, geo, params, group, reduced, sums, rows, out_dtype)
    name, text = _named(lambda nm: make(nm, program, geo, params, lanes, group, reduced, split, finish), "reduce")
    out = [Launch(name, text, params, grid)]
    temps["part"] = max(temps.get("part", 1), k1 * s * k * k2 if s > 1 else 1)
    if split["last"]:
        temps["tickets"] = max(temps.get("tickets", 0), grid[0] * k1)
    elif s > 1:
        fparams = Params(wide)

        def final_finish(lane):
            return kernels.finish(program, geo, fparams, group, reduced, sums, rows, out_dtype)
        fname, ftext = _named(lambda nm: kernels.finalize(nm, geo.ct, fparams, group, split, final_finish),
                              "finalize")
        out.append(Launch(fname, ftext, fparams, (-(-k2 // split["CEB"]), 1, k1)))
    return out


__all__ = ["TARGET_BLOCKS", "MAX_SWEEP_BLOCKS", "TILE_BYTES", "FINISH_BYTES", "ROW_LOAD_BYTES",
           "MAX_ROWS_PER_ITERATION", "STEP_BLOCKS", "MIN_PER_THREAD", "ROW_SWEEP", "ROW_SWEEP_VECTORS",
           "SHARED_BYTES", "INT32_LIMIT", "as_program", "Group",
           "Launch", "Built", "Lowered", "build", "lower", "logical_strides"]
