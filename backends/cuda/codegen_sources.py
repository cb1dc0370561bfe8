"""Per-node fingerprints of the kernels the generator emits: the ``codegen`` rules' part of the autotune cache key.

Why decisions carry fingerprints at all: ``kernel_sources`` (module docstring). The hand-written
families hash the Python that writes their kernels; the generator of the element-wise and fused
kernels (``codegen.plan``, ``emit``, ``expressions``, ...) is edited too often for that: a hash of
its modules would tune every element-wise node of every cached model again after each edit. So the
``codegen`` rules' variants function (:func:`one_variant`) carries a ``node_fingerprint`` instead,
a hash of what the generator emits for the one node the key is made for
(``autotune_contenders.candidate_set``): an edit re-tunes exactly the nodes whose kernels it
changes (a formula, a vector width, a split), and a refactor that emits the same text re-tunes
nothing.

What is hashed (:func:`emitted_fingerprint`): the launches ``codegen.plan.lower`` makes for the
node as autotune runs its candidate: the node's run types (shapes, dtypes and each input's layout
as its dense array is stored: ``launch.array_layout``), inputs fresh, dense and 16-byte aligned
(``autotune_inputs``), the output a buffer of its own, not in place; and, for a node the
zero-copy plan puts in a slice of a concat's buffer whose rule writes that slice itself
(``Rule.writes_strided``, ``autotune_measure.out_forms``), also the form that writes it, as
``launch`` plans it for that view (its row pitch; a view it refuses, a marker of that refusal). For every launch: the
kernel's name and text, its grid and block, and its scalar arguments (divisors, sizes, splits: a
change of ``plan.TARGET_BLOCKS`` moves a reduction's speed without changing its text); and the
plan's compute type, scratch sizes and output order. A node the generator cannot plan hashes the
error instead: its candidate fails when run, and an edit that fixes it changes the hash.

Shapes are in it: the node's own, exactly, as in the text. The key holds them already (its
``in=``), so they split no decision the key does not split; and an edit that changes the text for
some shapes only (64-bit indices above 2^31 elements, a vector width a channel count allows)
re-tunes those nodes only.

Not hashed: what autotune does not time. The in-place form and the strided views an executable
may run (the memory plan's, made after autotune), CuPy's compile (``launch.compiled``: no options
of ours) and the launch path (buffers, tickets), which write no text. The data-movement rules
(``codegen_rules.MOVEMENT``): their copies are planned from the arrays' strides when they run,
and on CUDA no other rule competes with them (the oracle is dropped: ``autotune_contenders``),
so their decisions are never timed nor cached; they keep the registry's default variants.

Cost: one plan of the node, two for a homed one (pure Python, no GPU, no CuPy: about 0.4 ms for
an element-wise node, 1.5 ms for batch statistics' two forms on this project's 2-core CPU), made
once per process per node signature (:func:`emitted_fingerprint` is memoized), and only for the
keys that can be written (``passes/autotune.py``: two contenders or more, or a homed node).
DenseNet-121's bf16 training step: 65 nodes, ~0.1 s of a ~4.2 s compile whose tuned nodes all hit
the cache.
"""

from __future__ import annotations

import functools
import hashlib
import re

from opgraph.types import TensorType, numpy_dtype

from .codegen.contexts import row_pitch_of
from .codegen.plan import lower
from .kernel_sources import DIGITS

#: distinct node signatures whose fingerprint a process keeps
MEMO = 8192


def _stored(t: TensorType) -> TensorType:
    """``t`` with the layout ``launch`` reads off a dense array of it (``storage_order``): 4-D
    channels-last where the buffer is not also C-ordered (one channel, one pixel, no element),
    4-D NCHW otherwise, None for any other rank."""
    shape = tuple(t.shape)
    if len(shape) != 4:
        layout = None
    else:
        _, c, h, w = shape
        both = c == 1 or h * w == 1 or 0 in shape  # NumPy's and CuPy's flags call it C-ordered
        layout = "NHWC" if t.layout == "NHWC" and not both else "NCHW"
    return TensorType(shape, t.dtype, layout)


def _text(plan) -> str:
    """Everything of a ``plan.Lowered`` that the generator decides, as text."""
    parts = [f"ct={plan.ct} layout={plan.layout} temps={sorted(plan.temps.items())} tickets={plan.tickets}"]
    for launch in plan.launches:
        args = [f"{name}:{kind}:{ctype}:{value}" for name, (kind, ctype, value) in launch.params.items.items()]
        parts += [f"{launch.name} grid={launch.grid} block={launch.block} args={args}", launch.source]
    return "\n".join(parts)


def _emitted(op, in_types, out_type, **form) -> str:
    try:
        plan = lower(op, in_types, out_type, **form)
    except Exception as e:  # a PlanError, or a generator bug: the key must not raise where the
        # candidate would only fail its row when run; an object's address in the message would
        # give every process another key
        return f"{type(e).__name__}: " + _ADDRESS.sub("0x?", str(e))
    return _text(plan)  # outside the try: a bug here must fail loudly, not hash one constant for all


#: an object's address as ``repr`` writes it
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


def _strided_form(out_type, out) -> dict | str:
    """``lower``'s keywords for the output view ``out`` (``(element strides, element offset)``),
    as ``launch`` plans a given ``out=``: a dense view (C-ordered, or packed channels-last) as
    itself, aligned where its start is; a column slice of ``(K, C')`` rows through its row pitch;
    any other view, which the launch refuses (``PlanError``: the candidate fails), a marker."""
    strides, offset = out
    shape = tuple(out_type.shape)
    if _dense(shape, tuple(strides)):
        return {"inplace": True, "aligned": offset * numpy_dtype(out_type.dtype).itemsize % 16 == 0}
    pitch = row_pitch_of(shape, strides)
    if pitch is None:
        return f"PlanError: an output view of shape {shape} and strides {tuple(strides)}"
    return {"inplace": True, "out_row_pitch": pitch}


def _dense(shape: tuple, strides: tuple) -> bool:
    """Whether element ``strides`` over ``shape`` are C order's or, 4-D, packed channels-last's
    (axes of extent 1 ignored, as the arrays' flags ignore them)."""
    def same(want):
        return all(s == w for s, w, n in zip(strides, want, shape) if n != 1)
    c_order = [1] * len(shape)
    for a in range(len(shape) - 2, -1, -1):
        c_order[a] = c_order[a + 1] * shape[a + 1]
    if same(c_order):
        return True
    if len(shape) != 4:
        return False
    _, c, h, w = shape
    return same((h * w * c, 1, w * c, c))


def emitted_texts(op, in_types: tuple, out_type: TensorType, out: tuple | None = None) -> tuple:
    """What the generator emits for ``op`` on inputs of run types ``in_types`` into
    ``out_type``, as autotune runs it (module docstring): the text of its plan (each launch's
    name, grid, block, scalar arguments and source), or of the error planning it raises; with a
    second text, the form writing the output view ``out`` (``(element strides, element
    offset)`` of a homed node's slice), when ``out`` is given. Never raises."""
    stored = tuple(map(_stored, in_types))
    texts = [_emitted(op, stored, out_type)]
    if out is not None:
        form = _strided_form(out_type, out)
        texts.append(form if isinstance(form, str) else _emitted(op, stored, out_type, **form))
    return tuple(texts)


@functools.lru_cache(maxsize=MEMO)
def emitted_fingerprint(op, in_types: tuple, out_type: TensorType, out: tuple | None = None) -> str:
    """:data:`~kernel_sources.DIGITS` hex digits of SHA-256 over :func:`emitted_texts` (the
    ``node_fingerprint`` of the ``codegen`` rules), memoized per process (``cache_clear()``
    forgets them, as a test that edits the generator must). Never raises."""
    return hashlib.sha256("\n--\n".join(emitted_texts(op, in_types, out_type, out)).encode()).hexdigest()[:DIGITS]


def one_variant():
    """The ``codegen`` rules' variants function: one option set, as the registry's default, named
    ``_one_variant`` as that one is (so a key written before this fingerprint, ``codegen:_one_variant``,
    is the new one but for it: found superseded, tuned again with a note), with the
    ``node_fingerprint`` :func:`emitted_fingerprint`. The same function every call."""
    return _ONE_VARIANT


def _one_variant(op, in_types, device, **listing):
    return [{}]


_one_variant.node_fingerprint = emitted_fingerprint
_ONE_VARIANT = _one_variant

__all__ = ["MEMO", "emitted_texts", "emitted_fingerprint", "one_variant"]
