"""The generated kernels on the CPU: a fixture running them through the g++
emulator of ``cuda_cpu_emulator`` / ``cuda_raw_emulator``, the check of one op
against its float64 reference (shared by the test_codegen_* modules), and a
whole graph lowered for cuda run with them (:func:`emulated_cuda_executable`)."""

from __future__ import annotations

import contextlib
import zlib

import attrs
import numpy as np
import pytest

from cuda_cpu_emulator import GXX, EmulatedCupy
from cupy_standin import cupy_replaced
from codegen_cases import TOLERANCE, make_input, out_type, reference, rel_err
from opgraph.backends.cuda.codegen import copies, launch
from opgraph.backends.registry import KernelContext, rules_for
from opgraph.executable import Executable
from opgraph.graph import graph_of
from opgraph.passes.base import PassContext
from opgraph.passes.pipelines import default
from opgraph.passes.policy import LoweringPolicy
from opgraph.types import is_channels_last, is_float, numpy_dtype, to_layout

needs_gxx = pytest.mark.skipif(GXX is None, reason="no g++: the kernels' CUDA text cannot run on the CPU")


@contextlib.contextmanager
def codegen_emulated(monkeypatch, standin, *caches):
    """``standin`` (an :class:`EmulatedCupy`) as ``cupy`` for the generated kernels: their
    compile and plan caches, and ``caches`` (other kernels' compile caches), start empty and
    are emptied after."""
    monkeypatch.setattr(launch, "_PLANS", {})
    for name in ("_TICKET_OFFSETS", "_TICKET_BUFFERS", "_TICKET_VIEWS"):  # ticket counters start at zero
        monkeypatch.setattr(launch, name, {})
    monkeypatch.setattr(launch, "_RESERVED", [0])
    with cupy_replaced(monkeypatch, standin, launch.compiled, copies._plan, *caches) as e:
        yield e


@pytest.fixture
def emu(monkeypatch):
    """The emulated ``cupy``: generated kernels compile with g++ and run thread
    by thread; the compile and plan caches start empty and are emptied after."""
    if GXX is None:
        pytest.skip("no g++: the kernels' CUDA text cannot run on the CPU")
    with codegen_emulated(monkeypatch, EmulatedCupy()) as e:
        yield e


def seeded(*parts) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


def run_case(op, kinds, shape, dtype: str, layout: str, exact: bool = False, arrays=None, compare=True):
    """``op``'s ``codegen`` kernel on inputs of ``kinds`` against its reference;
    returns ``(out, ref, arrays)`` after checking dtype, shape, layout and (with
    ``compare``) the error."""
    if arrays is None:
        rng = seeded(op, kinds, shape, dtype, layout)
        arrays = [make_input(rng, k, shape, dtype, layout) for k in kinds]
    want_type = out_type(op, arrays, layout)
    rule = rules_for(type(op))["codegen"]
    assert rule.check(op, tuple(a for a in map(_type, arrays)), "cuda") is None
    out = rule.kernel(KernelContext(np, "cuda", {}, want_type), op, *arrays)
    ref = reference(op, arrays)
    assert out.dtype.name == want_type.dtype and out.shape == want_type.shape
    if want_type.layout == "NHWC":
        assert is_channels_last(out)
    if not compare:
        return out, ref, arrays
    err = rel_err(out, ref)
    if exact:
        np.testing.assert_array_equal(np.asarray(out, np.float64), ref)
    else:
        assert err < TOLERANCE[dtype], (op, dtype, layout, err)
    return out, ref, arrays


def _type(a):
    from opgraph.types import TensorType
    return TensorType(a.shape, a.dtype.name)


def launched(emu) -> list[str]:
    """Kinds of the generated kernels launched so far (``sweep``, ``reduce``, ...)."""
    return [x["name"].split("_")[2] for x in emu.raw_launches]


def steps_per_thread() -> int:
    """Steps of its run (rows of channels-last data, vectors of a C-order run) a
    thread of the first split of the last reduction planned takes: ``PER`` over
    the threads that share the run (``RB`` or ``TE``)."""
    reductions = [x for p, *_ in launch._PLANS.values() for x in p.launches if x.name.split("_")[2] == "reduce"]
    values = {name: int(value) for name, (_, _, value) in reductions[-1].params.items.items()
              if name in ("PER", "RB", "TE")}
    return values["PER"] // values.get("RB", values.get("TE"))


def emulated_cuda_executable(outputs, policy, dtype: str | None, kernels: tuple = ()):
    """``outputs`` through the default pipeline for device ``cuda`` (no GPU
    needed: the passes only ask the rules; cuDNN declines) under ``compile``'s
    ``dtype``, as an executable over host arrays: ``codegen`` steps run their
    generated kernels (inside the :func:`emu` fixture: through the emulator),
    and so do the ``cuda`` steps of the op types ``kernels`` (their own CuPy
    kernels: their compile caches must be the emulator's); every other step
    (GEMM convolutions, cuBLAS) the op's reference kernel in
    float32 on its inputs, its result rounded once to the node's run type, as
    a kernel storing that type and accumulating in float32 would."""
    policy = LoweringPolicy.from_mapping(policy)
    ctx = PassContext(device="cuda", policy=policy, dtype=dtype)
    source = graph_of(*outputs)
    graph, outs = default(policy).run(source, list(outputs), ctx)

    def resolve(op, out_type):
        if op.algorithm == "codegen" or (op.algorithm == "cuda" and isinstance(op.op, tuple(kernels))):
            kernel = rules_for(type(op.op))[op.algorithm].kernel
            return kernel, KernelContext(np, "cuda", op.option_dict, out_type)
        wide = attrs.evolve(out_type, dtype="float32") if is_float(out_type.dtype) else out_type
        reference = rules_for(type(op.op))["reference"].kernel

        def run(kctx, lowered_op, *arrays, out=None):
            arrays = [a.astype(np.float32) if is_float(a.dtype.name) else a for a in arrays]
            y = np.asarray(reference(kctx, lowered_op, *arrays))
            y = to_layout(np, y.astype(numpy_dtype(out_type.dtype)), out_type.layout)
            if out is None:
                return y
            out[...] = y  # an in-place plan's input, or a zero-copy slice of a concat's buffer
            return out

        return run, KernelContext(np, "cpu", {}, wide)

    # source_graph: grad_outputs keyed by the caller's values, as compile's executables take them
    exe = Executable(graph, outs, resolve, xp=np, device="cuda", dtype=dtype, source_graph=source)
    exe.report = ctx.report  # as compile's executables carry theirs (passes/compiler.py)
    return exe


__all__ = ["needs_gxx", "emu", "codegen_emulated", "seeded", "run_case", "launched", "emulated_cuda_executable"]
