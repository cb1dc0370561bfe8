"""Emitting the IR as CUDA statements: kernel parameters, lanes, scopes and loads.

An :class:`Emitter` turns the IR nodes a kernel needs into ``const CT`` lines,
each placed in the outermost scope where its value is fixed, given the index
context (``contexts.py``) of the kernel:

* ``pre``: once per thread, before the loop (constants; in a channels-last
  sweep whose stride keeps each thread on the same channels, every
  per-channel value: ``rstd``, the affine weights);
* ``vec``: once per loop iteration (a vector of ``V`` lanes), for values that
  are equal across its lanes (per-channel values of an NCHW vector, which
  lies inside one (n, c) plane);
* ``lane``: once per lane (full-size loads and everything computed from them).

A value that differs between lanes is emitted once per lane (``v<id>_<j>``:
the lanes are unrolled, so every register index is a compile-time constant),
otherwise once (``v<id>``). Full-size operands are loaded 16 bytes at a time
(``storage.vector_load``) at the element index ``i0`` of lane 0.

:class:`Params` collects the kernel's parameters as they are referenced:
pointers (``const`` inputs, the output, carried sums, partial sums) and
scalars (sizes; the fast-division constants of :func:`storage.magic` in
32-bit kernels, the divisor itself in 64-bit ones). The launch plan reads
them back to build the argument tuple.
"""

from __future__ import annotations

import re

import numpy as np

from ...reference.dropout import GOLDEN, MIX1, MIX2
from .ir import Node
from .storage import magic, storage_of, vector_load

SCOPES = ("pre", "vec", "lane")

#: C type of a scalar parameter -> the NumPy scalar type CuPy passes by value.
SCALAR_TYPES = {"long long": np.int64, "unsigned int": np.uint32, "unsigned long long": np.uint64,
                "unsigned short": np.uint16, "unsigned char": np.uint8, "float": np.float32, "double": np.float64}


class Params:
    """The parameters of one kernel, in the order first referenced.

    Args:
        wide: 64-bit index arithmetic (``IDX`` is ``long long``) instead of 32-bit.
    """

    def __init__(self, wide: bool):
        self.wide = wide
        self.idx = "long long" if wide else "unsigned int"
        self.items: dict[str, tuple] = {}

    def scalar(self, name: str, value: int | float, ctype: str | None = None) -> str:
        """Scalar parameter ``name`` (type IDX unless ``ctype``) holding ``value``."""
        ctype = ctype or self.idx
        self.items.setdefault(name, ("scalar", ctype, SCALAR_TYPES[ctype](value)))
        return name

    def pointer(self, name: str, ctype: str, key, const: bool = True) -> str:
        """Pointer parameter ``name`` to the buffer the launch finds under ``key``."""
        self.items.setdefault(name, ("pointer", f"{'const ' if const else ''}{ctype}*", key))
        return name

    def div(self, expr: str, name: str, d: int) -> str:
        """``expr / d`` with ``d`` a run-time divisor called ``name`` (>= 1)."""
        d = max(int(d), 1)
        if self.wide:
            return f"(({expr}) / {self.scalar(name, d)})"
        mul, shift = magic(d)
        return (f"opgraph_div({expr}, {self.scalar(name + '_m', mul, 'unsigned int')}, "
                f"{self.scalar(name + '_s', shift, 'unsigned int')})")

    def signature(self, restrict: bool) -> str:
        qual = " __restrict__" if restrict else ""
        return ", ".join(f"{ctype}{qual if kind == 'pointer' else ''} {name}"
                         for name, (kind, ctype, _) in self.items.items())

    def arguments(self, buffers) -> tuple:
        """The launch arguments: scalars as stored, pointers as ``buffers[key]``."""
        return tuple(buffers[v] if kind == "pointer" else v for kind, _, v in self.items.values())


_PLACEHOLDER = re.compile(r"\{(\d+)\}")


def used_args(node: Node) -> list[int]:
    """Positions of ``node.args`` its template names (unused operands are not emitted)."""
    return sorted({int(m) for m in _PLACEHOLDER.findall(node.template)})


class Emitter:
    """The statements of one kernel body (module docstring).

    Args:
        nodes: the program's IR nodes.
        dtypes: storage dtype of each program input.
        ctx: the index context (``contexts.py``): lanes, scopes, indices.
        reduced: reduce node id -> ``('carry', pointer name, row, target)``
            (a result of an earlier phase) or ``('local', variable)`` (this
            kernel's own sum, in its finishing code).
    """

    def __init__(self, nodes: list[Node], dtypes, ctx, reduced: dict | None = None):
        self.nodes, self.dtypes, self.ctx = nodes, list(dtypes), ctx
        self.params = ctx.params
        self.reduced = reduced or {}
        self.lines = {s: [] for s in SCOPES}
        self.memo: dict = {}
        self._placement: dict[int, tuple[str, bool]] = {}

    def add(self, scope: str, line: str) -> None:
        self.lines[scope].append(line)

    def inherit(self, other: "Emitter") -> None:
        """Take the values ``other`` (an Emitter of the same kernel, whose
        statements come first) placed once per thread (``pre``) as emitted:
        the kernel declares each once, and this Emitter's statements read them
        where ``other`` computed them (``kernels.row_sweep``)."""
        for key, name in other.memo.items():
            if isinstance(key[0], int) and other.placement(key[0]) == self.placement(key[0]) \
                    and self.placement(key[0])[0] == "pre":
                self.memo[key] = name

    # ---- where a node lives ----------------------------------------------
    def placement(self, k: int) -> tuple[str, bool]:
        """``(scope, varies_by_lane)`` of node ``k``."""
        if k not in self._placement:
            node = self.nodes[k]
            if node.kind == "load":
                kind = node.load.kind
                where = (("lane", True) if kind in ("full", "strided") else
                         self.ctx.scope("col") if kind == "col" else
                         self._row_sample_scope(node.load) if kind == "rowsample" else
                         self.ctx.scope("plane" if kind == "plane" else "channel") if kind != "scalar" else
                         ("pre", False))
            elif node.kind == "keep":
                where = ("lane", True)
            elif node.kind == "count":
                where = ("pre", False)
            elif node.kind == "reduce":
                local = self.reduced.get(k, ("carry",))[0] == "local"
                where = ("pre", False) if local or node.target == "scalar" else self.ctx.scope(node.target)
            else:
                inner = [self.placement(node.args[a]) for a in used_args(node)]
                where = (max((s for s, _ in inner), key=SCOPES.index, default="pre"),
                         any(v for _, v in inner))
            self._placement[k] = where
        return self._placement[k]

    def _row_sample_scope(self, load) -> tuple[str, bool]:
        """A row's first element: where the row is known, unless the operand is
        read through its strides (then from the lane's own coordinates)."""
        return ("lane", True) if load.input in self.ctx.geo.strides else self.ctx.scope("row")

    # ---- values ---------------------------------------------------------
    def ref(self, k: int, lane: int) -> str:
        """The variable holding node ``k`` at ``lane``, emitting what it needs first."""
        scope, varies = self.placement(k)
        key = (k, lane if varies else None)
        if key in self.memo:
            return self.memo[key]
        node = self.nodes[k]
        if node.kind == "load" and node.load.kind == "full" and self._vectorised(node.load.input):
            self._vector(k, node)
            return self.memo[key]
        if node.kind == "load" and node.load.kind == "channel" and varies and self._row_vector(k, node, scope):
            return self.memo[key]
        if node.kind == "load" and node.load.kind == "col" and varies and self._col_vector(k, node, scope):
            return self.memo[key]
        rhs = self._rhs(k, node, lane)
        name = f"v{k}_{lane}" if varies else f"v{k}"
        self.add(scope, f"const CT {name} = {rhs};")
        self.memo[key] = name
        return name

    def _rhs(self, k: int, node: Node, lane: int) -> str:
        if node.kind == "expr":
            args = {a: self.ref(node.args[a], lane) for a in used_args(node)}
            return _PLACEHOLDER.sub(lambda m: args[int(m.group(1))], node.template)
        if node.kind == "load":
            return self._load(node, lane)
        if node.kind == "count":
            return f"(CT){self.params.scalar('NRED_' + node.target, self.ctx.reduced_count(node.target), 'long long')}"
        if node.kind == "keep":
            state, threshold = node.template.split(",")
            logical = self.ctx.index(self, "L", lane)
            return (f"(opgraph_dropout_keep((unsigned long long)({logical}), {state}ull, {GOLDEN}ull, {MIX1}ull, "
                    f"{MIX2}ull, {threshold}u) ? (CT)1 : (CT)0)")
        how = self.reduced.get(k)
        if how is None:
            raise AssertionError(f"reduction node {k} is not available in this kernel")
        if how[0] == "local":
            return how[1]
        _, pointer, row, target = how
        pointer = self.params.pointer(pointer, self.ctx.geo.ct, pointer)
        return f"{pointer}[{row} * {self.ctx.space_size(target)} + {self.ctx.space_index(self, target, lane)}]"

    def _vectorised(self, index: int) -> bool:
        """Whether full-size input ``index`` is loaded 16 bytes at a time: a
        dense operand, or a pitched view whose rows and start allow it."""
        geo, lanes = self.ctx.geo, self.ctx.lanes
        if lanes == 1:
            return False
        pitch = geo.pitched.get(index)
        return index not in geo.strides or (pitch is not None and pitch.vectorises(lanes))

    def _row_vector(self, k: int, node: Node, scope: str) -> bool:
        """Load a per-channel row's values of every lane as whole 16-byte words
        where the context walks adjacent channels (``channel_run``) and every
        buffer is aligned (a channels-last sweep's or reduction's rstd, affine
        weights, sums: one load per word instead of one per lane, which on
        small tensors, a few vectors per thread, cost as much as the data);
        False: loaded lane by lane."""
        st, lanes = storage_of(self.dtypes[node.load.input]), self.ctx.lanes
        pitched = self.ctx.geo.row_pitch.get(node.load.input)
        if not self.ctx.geo.aligned or lanes * st.itemsize % 16 or (pitched is not None and not pitched.aligned):
            return False
        base = self.ctx.channel_run(self)
        if base is None:
            return False
        self._words(k, st, self._pointer(node.load.input), f"{self._row_start(node.load)}{base}", scope)
        return True

    def _col_vector(self, k: int, node: Node, scope: str) -> bool:
        """Load a packed column operand (a layer norm's weight and bias, a linear
        layer's bias over C-order rows) of every lane as whole 16-byte words where
        the lanes are adjacent columns from a multiple of the lane count
        (``col_run``) and every buffer is aligned: two 16-byte loads a vector of
        bf16 instead of eight 2-byte ones each (ConvNeXt's layer norm ran at
        56 % of the copy bandwidth in bf16 against 79 % in fp32, its weight and
        bias loaded lane by lane; docs/performance.md, thirtieth session); False:
        loaded lane by lane."""
        st, lanes = storage_of(self.dtypes[node.load.input]), self.ctx.lanes
        if not self.ctx.geo.aligned or lanes * st.itemsize % 16:
            return False
        base = self.ctx.col_run(self)
        if base is None:
            return False
        self._words(k, st, self._pointer(node.load.input), base, scope)
        return True

    def _row_start(self, load) -> str:
        """``''`` or ``'<row> * <pitch> + '``: where row ``load.row`` of a
        ``(K, C)`` operand starts (C elements apart, or the row pitch of a
        column slice of a wider buffer: ``contexts.RowPitch``)."""
        if not load.row:
            return ""
        pitched = self.ctx.geo.row_pitch.get(load.input)
        step = (self.params.scalar(f"RP{load.input}", pitched.pitch) if pitched is not None
                else self.ctx.space_size("channel"))
        return f"{load.row} * {step} + "

    def _words(self, k: int, st, ptr: str, start: str, scope: str) -> None:
        """Node ``k``'s lanes loaded as 16-byte words from ``ptr[start]`` on, into ``scope``."""
        lines, values = vector_load(st, ptr, start, self.ctx.lanes, f"r{k}")
        for line in lines:
            self.add(scope, line)
        for j, expr in enumerate(values):
            self.add(scope, f"const CT v{k}_{j} = {expr};")
            self.memo[(k, j)] = f"v{k}_{j}"

    def _element(self, index: int, i: str) -> str:
        """The element of input ``index`` at physical index ``i`` of S: ``i``
        itself for a dense operand, ``(i / block) * pitch + i % block`` for a
        pitched view (one division, shared by the loads at ``i``)."""
        pitch = self.ctx.geo.pitched.get(index)
        if pitch is None:
            return i
        key = ("pitched", index, i)
        if key not in self.memo:
            name = f"p{index}_{len(self.memo)}"
            row = self.params.div(i, f"PB{index}", pitch.block)
            block = self.params.scalar(f"PBV{index}", pitch.block)
            step = self.params.scalar(f"PP{index}", pitch.pitch)
            self.add("lane", f"const IDX {name}r = {row};")
            self.add("lane", f"const IDX {name} = {name}r * {step} + ({i} - {name}r * {block});")
            self.memo[key] = name
        return self.memo[key]

    def _pointer(self, index: int) -> str:
        st = storage_of(self.dtypes[index])
        return self.params.pointer(f"in{index}", st.ctype, ("in", index))

    def _load(self, node: Node, lane: int) -> str:
        load, ctx = node.load, self.ctx
        st = storage_of(self.dtypes[load.input])
        ptr = self._pointer(load.input)
        if load.kind == "full" and (load.input not in ctx.geo.strides or load.input in ctx.geo.pitched):
            return st.load(f"{ptr}[{self._element(load.input, ctx.index(self, 'i', lane))}]")
        if load.kind == "scalar":
            return st.load(f"{ptr}[0]")
        if load.kind == "plane":
            return st.load(f"{ptr}[{ctx.space_index(self, 'plane', lane)}]")
        if load.kind in ("strided", "full"):  # a full operand in another layout: by its strides
            terms = [f"{ctx.index(self, ('coord', a), lane)} * "
                     f"{self.params.scalar(f'ST{load.input}_{a}', ctx.stride(load.input, a), 'long long')}"
                     for a in range(len(ctx.geo.full))]
            return st.load(f"{ptr}[{' + '.join(terms)}]")
        if load.kind == "col":  # a packed trailing-shape operand
            return st.load(f"{ptr}[{ctx.space_index(self, 'col', lane)}]")
        if load.kind == "rowsample":
            return self._row_sample(load, st, ptr, lane)
        c = ctx.space_index(self, "channel", lane)
        if load.kind == "sample":  # element (0, c, 0, 0): by the operand's own strides where it has them
            total = self.params.scalar("TOTAL", ctx.geo.total, "long long")
            if load.input in ctx.geo.strides:
                axis = 1 if len(ctx.geo.full) >= 2 else 0
                step = self.params.scalar(f"ST{load.input}_{axis}", ctx.stride(load.input, axis), "long long")
            else:
                step = self.params.scalar("CSTRIDE", ctx.geo.channel_stride)
            return f"({total} > 0 ? {st.load(f'{ptr}[{c} * {step}]')} : (CT)0)"
        return st.load(f"{ptr}[{self._row_start(load)}{c}]")

    def _row_sample(self, load, st, ptr: str, lane: int) -> str:
        """The first element of the lane's row of a full operand: ``row * K`` in C
        order, else its leading coordinates times its strides (trailing ones 0)."""
        ctx = self.ctx
        total = self.params.scalar("TOTAL", ctx.geo.total, "long long")
        if load.input not in ctx.geo.strides:
            k = self.params.scalar("KROW", ctx.geo.row_len)
            element = f"{ctx.space_index(self, 'row', lane)} * {k}"
        else:
            lead = len(ctx.geo.full) - ctx.geo.trailing
            element = " + ".join([f"{ctx.index(self, ('coord', a), lane)} * "
                                  f"{self.params.scalar(f'ST{load.input}_{a}', ctx.stride(load.input, a), 'long long')}"
                                  for a in range(lead)] or ["0"])
        return f"({total} > 0 ? {st.load(f'{ptr}[{element}]')} : (CT)0)"

    def _vector(self, k: int, node: Node) -> None:
        st = storage_of(self.dtypes[node.load.input])
        start = self._element(node.load.input, self.ctx.index(self, "i0", 0))
        self._words(k, st, self._pointer(node.load.input), start, "lane")

    def body(self, scope: str) -> str:
        return "\n".join("        " + line for line in self.lines[scope])


__all__ = ["SCOPES", "SCALAR_TYPES", "Params", "Emitter", "used_args"]
