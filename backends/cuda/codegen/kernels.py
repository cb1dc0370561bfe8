"""The kernel templates: element-wise sweeps, reductions and their finishing code.

Every kernel is one ``extern "C" __global__`` function of 256-thread blocks
whose body comes from an :class:`emit.Emitter`; its parameters are what the
body referenced (``emit.Params``). All loops are grid-stride loops, so any
grid size is correct and the launch plan picks one for occupancy.

* :func:`sweep` — element-wise over S: one vector of V lanes per iteration,
  16-byte loads and stores, then (``lane`` mode) a scalar tail.
* :func:`space_sweep` — element-wise over the channels / planes / rows /
  columns of a split / one value.
* :func:`columns` — reduction of channels-last data, kept entries (k1, k2)
  with k2 the contiguous channel axis: block ``(x, y, z)`` owns ``GB`` groups
  of V channels (threads ``tid % GB``), ``RB = 256 / GB`` rows at a time,
  rows ``[y * PER, (y + 1) * PER)`` of image ``z`` (a warp reads runs of ``GB``
  16-byte vectors, at least a 128-byte line, of consecutive rows: coalesced);
  the ``RB`` partial sums of each channel are added by a shared-memory tree
  over the rows.
* :func:`rows` — reduction of C-order data: ``TE`` threads (a power of two)
  per kept (image, channel) run, ``256 / TE`` runs per block, each summing the
  vectors ``[y * PER, (y + 1) * PER)`` of its run, then a tree over the ``TE``.
* :func:`row_sweep` — :func:`rows` of one split whose entries are rows, then
  the same threads write the full-size output of each row from its sums, kept
  on chip (a layer norm and its data gradient in one kernel).
* :func:`finalize` — the ``S`` partial sums of each kept entry, added by
  :func:`combine` for a tile of entries per block.

Where one step of a reduction's run (a row, a C-order vector) is a single
16-byte word, a thread takes ``ROWS`` steps an iteration, all their loads
written first, and the kernel declares its occupancy (:func:`_strided_loop`,
``plan.ROW_LOAD_BYTES``): more loads in flight, the same sums.

Partial sums are stored split-major, ``part[((k1 * S + split) * K + r) * K2 + k2]``
(``r`` the reduce node), so a block writes its tile's sums as one contiguous
run and the threads adding them read consecutive entries (both coalesced).

Every tree adds fixed partners (``x += x[+h]`` for h = HALF, HALF/2, ..., 1,
where the partner exists), so sums do not depend on timing.

Reductions are deterministic (every sum has a fixed order) and read their
inputs once. With one split (``DIRECT``) a reduction runs its finishing code
itself. Otherwise each block writes its partial sums, and then a separate
:func:`finalize` launch adds them, or (``last``, ``plan.FINISH_BYTES``: off
by default, slower on the H200) the last block of the tile to finish adds
them in the same kernel: each block fences its writes and takes a ticket
(``atomicAdd`` on the tile's counter in ``tickets``); the block that draws
ticket ``S - 1`` resets the counter to 0 and runs :func:`combine`. The
ticket only says who adds; the order of the additions is fixed, so the
result does not depend on which block came last. The counters start at zero
and every launch leaves them at zero (``launch.py`` keeps them per device).
The finishing code (:func:`finish`) writes the raw sums as *carried* values
for later phases and, in the last phase of a reduction program, the output
rows.
"""

from __future__ import annotations

import functools
import re

from .contexts import Columns, Finish, Rows, SpaceSweep, Sweep
from .emit import Emitter
from .storage import DEVICE_HELPERS, storage_of, vector_store

THREADS = 256
#: Iterations of a kernel's main loop the compiler is asked to unroll
#: (``#pragma unroll``), so that a thread may have several independent 16-byte
#: loads in flight; the order of every sum stays the loop's order. 1: no
#: pragma. Measured on the H200 (``scripts/gpu_codegen_bench.py``, DenseNet-121's
#: batch-norm kernels, docs/performance.md): 4 changed no reduction and slowed
#: the sweeps by up to 15 %, so the default is 1; the bench sweeps it.
UNROLL = 1


def _unroll(indent: int) -> str:
    """The pragma before a main loop indented by ``indent`` spaces."""
    return f"#pragma unroll {UNROLL}\n{' ' * indent}" if UNROLL > 1 else ""


def source(name: str, ct: str, params, body: str, restrict: bool = True, min_blocks: int = 0) -> str:
    """A whole NVRTC module: type aliases, device helpers, the kernel; with
    ``min_blocks``, declared to run ``min_blocks`` blocks of :data:`THREADS`
    per SM (``__launch_bounds__``: ptxas may use up to 65536 / (THREADS *
    min_blocks) registers a thread)."""
    bounds = f"__launch_bounds__({THREADS}, {min_blocks}) " if min_blocks else ""
    return (f"typedef {ct} CT;\ntypedef {params.idx} IDX;\n{DEVICE_HELPERS}\n"
            f'extern "C" __global__ void {bounds}{name}({params.signature(restrict)}) {{\n{body}}}\n')


def _block(em: Emitter) -> str:
    return "\n".join(em.body(s) for s in ("pre", "vec", "lane") if em.lines[s])


def _out_pointer(params, dtype: str) -> str:
    return params.pointer("out", storage_of(dtype).ctype, "out", const=False)


def sweep(name, program, geo, params, lanes: int, mode: str, reduced: dict, out_node: int, out_dtype: str,
          restrict: bool = True) -> str:
    """Element-wise kernel writing node ``out_node`` over S (module docstring)."""
    nodes, dtypes = program
    em = Emitter(nodes, dtypes, Sweep(geo, params, lanes, mode), reduced)
    values = [em.ref(out_node, j) for j in range(lanes)]
    out = _out_pointer(params, out_dtype)
    for line in vector_store(storage_of(out_dtype), out, "i0", values, "o"):
        em.add("lane", line)
    total = params.scalar("TOTAL", geo.total, "long long")
    nvec = params.scalar("NVEC", geo.total // lanes)
    body = ["    const IDX gtid = (IDX)blockIdx.x * blockDim.x + threadIdx.x;",
            "    const IDX gstride = (IDX)gridDim.x * blockDim.x;", em.body("pre"),
            f"    {_unroll(4)}for (IDX v = gtid; v < {nvec}; v += gstride) {{", f"        const IDX i0 = v * {lanes};",
            em.body("vec"), em.body("lane"), "    }"]
    if lanes > 1 and geo.total % lanes:
        tail = Emitter(nodes, dtypes, Sweep(geo, params, 1, "lane"), reduced)
        value = tail.ref(out_node, 0)
        tail.add("lane", vector_store(storage_of(out_dtype), out, "i0", [value], "t")[0])
        body += [f"    for (IDX i0 = {nvec} * {lanes} + gtid; i0 < (IDX){total}; i0 += gstride) {{",
                 _block(tail), "    }"]
    return source(name, geo.ct, params, "\n".join(line for line in body if line) + "\n", restrict)


def _store_rows(em: Emitter, rows, out_dtype: str, target: str) -> None:
    """Output row ``r`` at ``r * entries`` (or at the output's row pitch: a column
    slice of a wider buffer, ``Geometry.out_row_pitch``) plus the entry ``i0``."""
    out, st = _out_pointer(em.params, out_dtype), storage_of(out_dtype)
    pitch = em.ctx.geo.out_row_pitch
    size = em.ctx.space_size(target) if pitch is None else em.params.scalar("ORP", pitch)
    for r, k in enumerate(rows):
        em.add("lane", f"{out}[{r} * {size} + i0] = {st.store(em.ref(k, 0))};")


def space_sweep(name, program, geo, params, target: str, reduced: dict, rows, out_dtype: str) -> str:
    """Element-wise kernel over the entries of ``target``, writing ``rows``
    (one node per output row: ``out[r * entries + o]``)."""
    nodes, dtypes = program
    em = Emitter(nodes, dtypes, SpaceSweep(geo, params, target), reduced)
    _store_rows(em, rows, out_dtype, target)
    count = em.ctx.space_size(target)
    body = ("    const IDX gtid = (IDX)blockIdx.x * blockDim.x + threadIdx.x;\n"
            f"    for (IDX i0 = gtid; i0 < (IDX){count}; i0 += (IDX)gridDim.x * blockDim.x) {{\n"
            f"{_block(em)}\n    }}\n")
    return source(name, geo.ct, params, body)


def finish(program, geo, params, group, reduced: dict, sums: list[str], rows, out_dtype: str | None) -> str:
    """Statements after the sums ``sums`` (one per reduce node of ``group``) of the
    kept entry ``i0``: the carried sums, then the output ``rows`` if any."""
    nodes, dtypes = program
    local = {k: ("local", s) for k, s in zip(group.nodes, sums)}
    em = Emitter(nodes, dtypes, Finish(geo, params, group.target), {**reduced, **local})
    carry = params.pointer(group.carry, geo.ct, group.carry, const=False)
    size = em.ctx.space_size(group.target)
    for r, s in enumerate(sums):
        em.add("lane", f"{carry}[{r} * {size} + i0] = {s};")
    if rows:
        _store_rows(em, rows, out_dtype, group.target)
    return _block(em)


def _accumulators(em: Emitter, group, lanes: int, per_lane: bool) -> list[str]:
    """Accumulation statements of the loop body (lane order fixed)."""
    lines = []
    for r, k in enumerate(group.nodes):
        arg = em.nodes[k].args[0]
        for j in range(lanes):
            acc = f"acc{r}_{j}" if per_lane else f"acc{r}"
            lines.append(f"{acc} += {em.ref(arg, j)};")
    return lines


def _indent(lines, depth: int) -> str:
    return "\n".join(" " * depth + line for line in lines)


def _tree(slots: int, lane: str, width: str, stride: str, guard: str, half: str = "HALF") -> str:
    """A fixed-order shared-memory tree: ``red[slot * 256 + tid] += red[... + h * stride]``
    for h = ``half``, ``half``/2, ..., 1, over the ``width`` partners ``lane`` indexes."""
    adds = " ".join(f"red[{q * THREADS} + tid] += red[{q * THREADS} + tid + h * {stride}];" for q in range(slots))
    return (f"    for (IDX h = {half}; h > 0; h >>= 1) {{\n"
            f"        if ({guard} && {lane} < h && {lane} + h < {width}) {{ {adds} }}\n"
            f"        __syncthreads();\n    }}\n")


def _part_index(params, k: int, r: int, split: str, entry: str) -> str:
    """The address of partial sum ``r`` of ``split`` for entry ``entry`` of image ``k1``
    (split-major: module docstring); the kernel declared ``S`` and ``K2``."""
    assert "S" in params.items and "K2" in params.items, "declare S and K2 before the partial sums"
    return f"((k1 * S + {split}) * {k} + {r}) * K2 + {entry}"


def combine(params, ct: str, k: int, base: str, width: str, eb: int, finish_code) -> str:
    """Statements adding the ``S`` partial sums of entries ``[base, base + width)``
    of image ``k1`` and running ``finish_code`` on each: ``EB`` entries at a
    time (threads ``tid % EB``), each entry's splits taken by ``256 / EB``
    threads in a fixed order (``q = tid / EB``, ``+ 256 / EB``, ...), then a
    tree over those threads. ``base`` and ``width`` are the same for every
    thread of the block (the loop holds ``__syncthreads``). Reads bypass L1
    (``__ldcg``): other blocks wrote the partial sums during this kernel."""
    p = params
    ceb, cqs = p.scalar("CEB", eb), p.scalar("CQS", THREADS // eb)
    p.scalar("CHALF", _half(THREADS // eb))
    part = p.pointer("part", ct, "part", const=False)
    loads = " ".join(f"t{r} += __ldcg({part} + {_part_index(p, k, r, 'q', f'{base} + c')});" for r in range(k))
    sums = "".join(f" const CT s{r} = red[{r * THREADS} + tid];" for r in range(k))
    return f"""    for (IDX c0 = 0; c0 < {width}; c0 += {ceb}) {{
        const IDX c = c0 + tid % {ceb}, q0 = tid / {ceb};
        const bool on = c < {width};
        {" ".join(f"CT t{r} = 0;" for r in range(k))}
        if (on) {{
            for (IDX q = q0; q < S; q += {cqs}) {{ {loads} }}
        }}
{_indent([f"red[{r * THREADS} + tid] = t{r};" for r in range(k)], 8)}
        __syncthreads();
{_indent(_tree(k, "q0", cqs, ceb, "on", "CHALF").splitlines(), 4)}
        if (on && q0 == 0) {{
            const IDX i0 = k1 * K2 + {base} + c;{sums}
{finish_code(0)}
        }}
        __syncthreads();
    }}
"""


def _last_block(params, ct: str, k: int, base: str, width: str, eb: int, finish_code) -> str:
    """After every thread wrote its partial sums: the ticket of this block's tile
    (counter ``k1 * gridDim.x + blockIdx.x``) and, in the tile's last block,
    :func:`combine` (module docstring)."""
    tickets = params.pointer("tickets", "unsigned int", "tickets", const=False)
    return f"""    __threadfence();
    __syncthreads();
    __shared__ unsigned int og_last;
    if (tid == 0) {{
        const IDX tile = k1 * gridDim.x + blockIdx.x;
        og_last = atomicAdd({tickets} + tile, 1u) == S - 1;
        if (og_last) {tickets}[tile] = 0;
    }}
    __syncthreads();
    if (og_last) {{
{combine(params, ct, k, base, width, eb, finish_code)}    }}
"""


def columns(name, program, geo, params, lanes, group, reduced, split, finish_code) -> str:
    """Channels-last reduction kernel (module docstring); ``split``: the launch
    geometry (``K1``, ``A``, ``K2``, ``GB``, ``RB``, ``S``, ``PER``, ``ROWS``:
    rows a thread loads per iteration, ``MIN_BLOCKS``: the blocks per SM the
    kernel declares, 0 none, and ``CEB`` with ``last``: the tile's last block
    adds the partial sums);
    ``finish_code(lane)``: the finishing block of the lane's channel."""
    nodes, dtypes = program
    em = Emitter(nodes, dtypes, Columns(geo, params, lanes, group.target), reduced)
    acc = _accumulators(em, group, lanes, per_lane=True)  # first: emits the values summed and what they use
    p = params
    k, slots = len(group.nodes), len(group.nodes) * lanes
    gb, rb, g = p.scalar("GB", split["GB"]), p.scalar("RB", split["RB"]), p.scalar("G", split["K2"] // lanes)
    a_n, k2, per, s = p.scalar("A", split["A"]), p.scalar("K2", split["K2"]), p.scalar("PER", split["PER"]), \
        p.scalar("S", split["S"])
    tw = p.scalar("TW", split["GB"] * lanes)
    p.scalar("HALF", _half(split["RB"]))
    part = p.pointer("part", geo.ct, "part", const=False)
    direct = p.scalar("DIRECT", int(split["S"] == 1))
    loop = _strided_loop(em, acc, split.get("ROWS", 1), "a", "a0 + r0", "a1", rb,
                         [f"const IDX i0 = (k1 * {a_n} + a) * {k2} + g * {lanes};"])
    slot = {(r, j): (r * lanes + j) * THREADS for r in range(k) for j in range(lanes)}
    finishes = [f"{{ const IDX i0 = k1 * {k2} + g * {lanes} + {j};"
                + "".join(f" const CT s{r} = red[{slot[r, j]} + gl];" for r in range(k))
                + f"\n{finish_code(j)}\n}}" for j in range(lanes)]
    # row 0 of the tree holds the tile's sums: channel c of the tile is lane
    # c % V of group c / V; all threads write them, consecutive channels together
    writes = [f"for (IDX c = tid; c < {tw}; c += {THREADS}) if (blockIdx.x * {tw} + c < {k2}) "
              f"{part}[{_part_index(p, k, r, 'blockIdx.y', f'blockIdx.x * {tw} + c')}] = "
              f"red[({r * lanes} + c % {lanes}) * {THREADS} + c / {lanes}];" for r in range(k)]
    tail = ""
    if split.get("last"):
        tail = _last_block(p, geo.ct, k, f"blockIdx.x * {tw}",
                           f"({k2} - blockIdx.x * {tw} < {tw} ? {k2} - blockIdx.x * {tw} : {tw})",
                           split["CEB"], finish_code)
    body = f"""    __shared__ CT red[{slots * THREADS}];
    const IDX tid = threadIdx.x, gl = tid % {gb}, r0 = tid / {gb};
    const IDX graw = (IDX)blockIdx.x * {gb} + gl, k1 = blockIdx.z;
    const bool active = r0 < {rb} && graw < {g};
    const IDX g = graw < {g} ? graw : {g} - 1;
{em.body("pre")}
    {" ".join(f"CT acc{r}_{j} = 0;" for r in range(k) for j in range(lanes))}
    const IDX a0 = (IDX)blockIdx.y * {per}, a1 = a0 + {per} < {a_n} ? a0 + {per} : {a_n};
    if (active) {{
{loop}
    }}
{_indent([f"red[{slot[r, j]} + tid] = acc{r}_{j};" for r in range(k) for j in range(lanes)], 4)}
    __syncthreads();
{_tree(slots, "r0", rb, gb, "active")}    if ({direct}) {{
        if (active && r0 == 0) {{
{_indent(finishes, 12)}
        }}
        return;
    }}
{_indent(writes, 4)}
{tail}"""
    return source(name, geo.ct, params, body, min_blocks=split.get("MIN_BLOCKS", 0))


#: One statement of a loop body: ``const <type> <name> = <value>;`` (all the emitter writes there).
_DECLARATION = re.compile(r"^const [\w ]+? (\w+) = (.*);$")
#: A value read from an input buffer: ``in3[...]`` or ``(in3 + ...)`` (a 16-byte word).
_LOAD = re.compile(r"\bin\d+(\[| \+)")


def _strided_loop(em: Emitter, acc: list[str], rows: int, var: str, first: str, end: str, step: str,
                  head: list[str]) -> str:
    """A reduction kernel's main loop: ``for (var = first; var < end; var += step)``
    over the thread's run, each iteration the ``head`` lines (its indices), the
    loads and values (``em``'s bodies), then the sums ``acc``.

    With ``rows`` > 1 (``plan.ROW_LOAD_BYTES`` says why) an iteration takes
    ``rows`` steps of the run together (:func:`_steps_together`), then the
    run's last steps are taken one at a time. Every sum adds the same terms,
    written the same way, in the same order as with one step per iteration: the
    same bits."""
    lines = "\n".join(f"            {line}" for line in head)
    body = [*head, *em.lines["vec"], *em.lines["lane"]]

    def one(value: str) -> str:
        declare = "" if value == var else f"            const IDX {var} = {value};\n"
        return f"{declare}{lines}\n{em.body('vec')}\n{em.body('lane')}\n{_indent(acc, 12)}"
    if rows == 1:
        return f"        {_unroll(8)}for (IDX {var} = {first}; {var} < {end}; {var} += {step}) {{\n{one(var)}\n        }}"
    run = f"{var}r"
    steps = [[f"const IDX {var} = {run} + {q} * {step};" if q else f"const IDX {var} = {run};", *body]
             for q in range(rows)]
    together = _indent(_steps_together(steps, acc), 12)
    return (f"        IDX {run} = {first};\n"
            f"        {_unroll(8)}for (; {run} + {rows - 1} * {step} < {end}; {run} += {rows} * {step}) {{\n"
            f"{together}\n        }}\n"
            f"        for (; {run} < {end}; {run} += {step}) {{\n{one(run)}\n        }}")


def _steps_together(steps: list[list[str]], acc: list[str]) -> list[str]:
    """The statements of several steps of a loop, each step's names suffixed
    ``_s<q>``: first every step's loads and what they need (their indices), in
    step order, then each step's values computed from its loads and its sums,
    in step order. Loads written first are issued together: ptxas did not hoist
    a second step's load above the first step's arithmetic, which waits for the
    first load (checked in the SASS of the batch-norm statistics), so written
    step after step the loads were still issued one at a time."""
    early, late = [], []
    for q, statements in enumerate(steps):
        parsed = [_DECLARATION.match(s) for s in statements]
        assert all(parsed), f"a loop statement that declares nothing: {statements[parsed.index(None)]}"
        suffixed = re.compile(r"\b(" + "|".join(re.escape(m.group(1)) for m in parsed) + r")\b")
        rename = functools.partial(suffixed.sub, rf"\1_s{q}")
        waits: set[str] = set()  # names computed from a load
        for statement, m in zip(statements, parsed):
            name, value = m.groups()
            if waits & set(re.findall(r"\w+", value)):
                waits.add(name)
                late.append(rename(statement))
            else:
                if _LOAD.search(value):
                    waits.add(name)
                early.append(rename(statement))
        late.extend(rename(line) for line in acc)
    return early + late


def _half(width: int) -> int:
    """Half the power of two at or above ``width`` (the first step of a tree over ``width``)."""
    return (1 << max(int(width) - 1, 0).bit_length()) // 2


def _run_step(p, split: dict, lanes: int) -> list[str]:
    """The head of an iteration over vector ``j`` of a C-order run (``split`` as
    for :func:`rows`): its image ``a`` and the element ``i0`` of its lane 0."""
    a_n, k2, b = p.scalar("A", split["A"]), p.scalar("K2", split["K2"]), p.scalar("B", split["B"])
    a_of_j = p.div("j", "BV", split["B"] // lanes)
    bvec = p.scalar("BVN", split["B"] // lanes)
    return [f"const IDX a = {a_of_j};",
            f"const IDX i0 = ((k1 * {a_n} + a) * {k2} + k2) * {b} + (j - a * {bvec}) * {lanes};"]


def _run_sizes(p, split: dict, lanes: int, splits: bool = True) -> dict:
    """The size parameters of a C-order reduction (``split`` as for :func:`rows`;
    ``S`` only with ``splits``), declared in the order the kernels always had
    them (so their text, and what autotune keyed on it, stays): name by key."""
    keys = ("A", "K2", "B", *(("S",) if splits else ()))
    names = {key: p.scalar(key, split[key]) for key in keys}
    names["JV"] = p.scalar("JV", split["A"] * (split["B"] // lanes))
    names["PER"], names["TE"] = p.scalar("PER", split["PER"]), p.scalar("TE", split["TE"])
    names["EB"] = p.scalar("EB", THREADS // split["TE"])
    p.scalar("HALF", split["TE"] // 2)
    return names


def _run_sums(em: Emitter, group, acc: list[str], lanes: int, split: dict, sizes: dict, slots: int = 0) -> str:
    """A C-order reduction kernel's body up to its tree (:func:`rows`): block
    ``(x, y, k1)``'s ``EB = 256 / TE`` entries ``k2`` (``active``: within ``K2``),
    each summed over the vectors ``[j0, j1)`` of split ``y`` by the ``TE``
    threads ``lt`` of the entry, then added by a fixed tree: after it, sum
    ``r`` of the thread's entry is ``red[r * 256 + tid - lt]``. ``em``: the
    reduction's Emitter (a :class:`Rows` context), ``acc`` its sums
    (:func:`_accumulators`), ``sizes``: :func:`_run_sizes`; ``slots``: the sums a thread keeps in
    ``red`` later, if more than ``k`` (:func:`row_sweep`'s column sums)."""
    p, k = em.params, len(group.nodes)
    k2, jv, per, te, eb = (sizes[key] for key in ("K2", "JV", "PER", "TE", "EB"))
    loop = _strided_loop(em, acc, split.get("ROWS", 1), "j", "j0 + lt", "j1", te, _run_step(p, split, lanes))
    return f"""    __shared__ CT red[{max(k, slots) * THREADS}];
    const IDX tid = threadIdx.x, lt = tid % {te}, k1 = blockIdx.z;
    const IDX kraw = (IDX)blockIdx.x * {eb} + tid / {te};
    const bool active = kraw < {k2};
    const IDX k2 = active ? kraw : {k2} - 1;
{em.body("pre")}
    {" ".join(f"CT acc{r} = 0;" for r in range(k))}
    const IDX j0 = (IDX)blockIdx.y * {per}, j1 = j0 + {per} < {jv} ? j0 + {per} : {jv};
    if (active) {{
{loop}
    }}
{_indent([f"red[{r * THREADS} + tid] = acc{r};" for r in range(k)], 4)}
    __syncthreads();
{_tree(k, "lt", te, "1", "active")}"""


def rows(name, program, geo, params, lanes, group, reduced, split, finish_code) -> str:
    """C-order reduction kernel (module docstring); ``split``: ``K1``, ``A``,
    ``K2``, ``B``, ``S``, ``PER`` (vectors per split), ``TE`` (threads per
    entry, a power of two: a block sums ``256 / TE`` entries), ``ROWS``
    (vectors a thread loads per iteration), ``MIN_BLOCKS`` (as for
    :func:`columns`), and ``CEB``
    with ``last`` (the tile's last block adds the partial sums);
    ``finish_code``: the finishing block of an entry."""
    nodes, dtypes = program
    em = Emitter(nodes, dtypes, Rows(geo, params, lanes, group.target), reduced)
    acc = _accumulators(em, group, lanes, per_lane=False)  # first: emits the values summed and what they use
    p, k = params, len(group.nodes)
    sizes = _run_sizes(p, split, lanes)
    part = p.pointer("part", geo.ct, "part", const=False)
    direct = p.scalar("DIRECT", int(split["S"] == 1))
    sums = _run_sums(em, group, acc, lanes, split, sizes)
    eb, k2 = sizes["EB"], sizes["K2"]
    finish_block = (f"const IDX i0 = k1 * {k2} + k2;" + "".join(f" const CT s{r} = red[{r * THREADS} + tid];"
                                                              for r in range(k)) + f"\n{finish_code(0)}")
    writes = [f"{part}[{_part_index(p, k, r, 'blockIdx.y', 'k2')}] = red[{r * THREADS} + tid];"
              for r in range(k)]
    tail = ""
    if split.get("last"):
        tail = _last_block(p, geo.ct, k, f"blockIdx.x * {eb}",
                           f"({k2} - blockIdx.x * {eb} < {eb} ? {k2} - blockIdx.x * {eb} : {eb})",
                           split["CEB"], finish_code)
    body = f"""{sums}    if (active && lt == 0) {{
        if ({direct}) {{
{finish_block}
        }} else {{
{_indent(writes, 12)}
        }}
    }}
{tail}"""
    return source(name, geo.ct, params, body, min_blocks=split.get("MIN_BLOCKS", 0))


def row_sweep(name, program, geo, params, lanes, group, split, out_node: int, out_dtype: str,
              restrict: bool = True, fill: int | None = None) -> str:
    """One kernel for a program whose reductions are ``row`` sums of one depth
    and whose output is full-size (``plan.ROW_SWEEP`` says when): each block
    reduces its ``EB`` rows as :func:`rows` does with one split (``split``
    likewise, ``S`` 1), keeps the row sums on chip instead of carrying them
    through global memory, and then the same ``TE`` threads of each row walk
    its vectors again (the vectors each summed, so the second read comes from
    L1, or L2) writing node ``out_node``, as :func:`sweep` does, from the
    reduced nodes bound to those sums (as :func:`finish` binds its own).

    The sums are the same (same terms, same tree, where both plans pick the same V) as the two-kernel plan's;
    the values computed from them per thread, not once per row in
    :func:`finish`. The values the reduction computed once per thread (the
    row's first element, the shift of its moments) are read where it computed
    them, before any thread of the block stored: with ``restrict`` False (the
    output is an input's buffer) every element is read before its own thread
    overwrites it, and each thread writes only the vectors it re-read.

    ``fill``: a full node also summed per column over the block's rows (a layer norm's weight
    gradient, ``plan._filled``): each thread keeps the value of each lane of each vector it
    writes in its own slots of ``red`` (``VPT * V`` of them, VPT the most vectors a thread
    takes; zero where it takes fewer, or its row is past the last), a fixed tree over the
    block's ``EB`` rows adds the threads holding the same columns (``tid % TE`` alike), and the
    row's first ``TE`` threads write the block's sums to ``part[blockIdx.x * K + column]``
    (``K`` the row length: :func:`finalize`'s layout with one sum, ``S`` = the blocks)."""
    nodes, dtypes = program
    em = Emitter(nodes, dtypes, Rows(geo, params, lanes, group.target), {})
    acc = _accumulators(em, group, lanes, per_lane=False)
    sizes = _run_sizes(params, split, lanes, splits=False)
    vpt = -(-split["PER"] // split["TE"])
    slots = vpt * lanes if fill is not None else 0
    sums = _run_sums(em, group, acc, lanes, split, sizes, slots)
    local = {k: ("local", f"s{r}") for r, k in enumerate(group.nodes)}
    out = Emitter(nodes, dtypes, Rows(geo, params, lanes, group.target), local)
    out.inherit(em)
    values = [out.ref(out_node, j) for j in range(lanes)]
    stores = vector_store(storage_of(out_dtype), _out_pointer(params, out_dtype), "i0", values, "o")
    te = sizes["TE"]
    if fill is not None:  # after the stores, as the sums' terms: the same loop keeps them
        stores += [f"red[((j - lt) / {te} * {lanes} + {j}) * {THREADS} + tid] = {out.ref(fill, j)};"
                   for j in range(lanes)]
    loop = _strided_loop(out, stores, split.get("ROWS", 1), "j", "j0 + lt", "j1", te,
                         _run_step(params, split, lanes))
    keep = _indent([f"const CT s{r} = red[{r * THREADS} + tid - lt];" for r in range(len(local))], 4)
    if fill is not None:  # every thread read its row's sums before red holds the column sums
        keep += (f"\n    __syncthreads();\n    for (int q = 0; q < {slots}; ++q) red[q * {THREADS} + tid] = 0;")
    body = f"""{sums}{keep}
    if (active) {{
{out.body("pre")}
{loop}
    }}
{"" if fill is None else _block_columns(params, geo, split, lanes, slots, sizes)}"""
    return source(name, geo.ct, params, body, restrict, min_blocks=split.get("MIN_BLOCKS", 0))


def _block_columns(params, geo, split: dict, lanes: int, slots: int, sizes: dict) -> str:
    """:func:`row_sweep`'s column sums of its block: the tree over the block's rows (threads
    ``tid % TE`` alike hold the same columns, in rows ``e = tid / TE``), then the block's sums
    written by its first row's threads, vector ``j = lt + q * TE`` of the row (if the row has
    it) at ``part[blockIdx.x * K + j * V + lane]``."""
    te, eb, jv = sizes["TE"], sizes["EB"], sizes["JV"]
    row = params.scalar("KROW", geo.row_len)
    part = params.pointer("part", geo.ct, "part", const=False)
    writes = " ".join(f"{part}[(IDX)blockIdx.x * {row} + j * {lanes} + {j}] = red[(q * {lanes} + {j}) * {THREADS} "
                      f"+ tid];" for j in range(lanes))
    return f"""    __syncthreads();
    const IDX e = tid / {te};
{_tree(slots, "e", eb, te, "true", str(_half(THREADS // split["TE"])))}    if (tid < {te}) {{
        for (int q = 0; q < {slots // lanes}; ++q) {{
            const IDX j = lt + q * {te};
            if (j < {jv}) {{ {writes} }}
        }}
    }}
"""


def fill_finish(params, dtype: str, slot: int) -> str:
    """:func:`finalize`'s finishing code of a filled input (``plan._filled``): the column's sum
    ``s0`` rounded once into input ``slot``'s storage at the column ``i0``."""
    st = storage_of(dtype)
    fill = params.pointer("fill", st.ctype, ("in", slot), const=False)
    return f"            {fill}[i0] = {st.store('s0')};"


def finalize(name, ct, params, group, split, finish_code) -> str:
    """The ``S`` partial sums of ``CEB`` entries per block (block ``(x, 1, k1)``:
    entries ``[x * CEB, (x + 1) * CEB)`` of image ``k1``), added by
    :func:`combine`, then their finishing blocks."""
    p, k = params, len(group.nodes)
    p.scalar("S", split["S"])
    k2 = p.scalar("K2", split["K2"])
    ceb = p.scalar("CEB", split["CEB"])
    body = (f"    __shared__ CT red[{k * THREADS}];\n    const IDX tid = threadIdx.x, k1 = blockIdx.z;\n"
            + combine(p, ct, k, f"blockIdx.x * {ceb}",
                      f"({k2} - blockIdx.x * {ceb} < {ceb} ? {k2} - blockIdx.x * {ceb} : {ceb})",
                      split["CEB"], finish_code))
    return source(name, ct, params, body)


__all__ = ["THREADS", "source", "sweep", "space_sweep", "finish", "combine", "columns", "rows", "row_sweep",
           "finalize", "fill_finish"]
