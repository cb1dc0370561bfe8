"""cuDNN frontend graphs for 2-D convolution, one per signature, built once.

A *signature* (:class:`ConvSignature`) fixes everything a cuDNN graph depends
on: the operation (fprop, dgrad, wgrad) with its epilogue (:func:`epilogue_name`:
fprop's bias, residual add and ReLU / ReLU6; dgrad's ReLU gradient), every
operand's dims and element strides (so NCHW and
NHWC are just different strides), the I/O dtype, the precision and the
convolution parameters. :func:`plan_for` builds the graph for a signature the
first time it is asked and caches it; a later call is one dict lookup.

Engines: the frontend's heuristics (modes A then FALLBACK) rank execution
plans; each plan index is one engine configuration, and every one that builds, or
the first ``policy.engine_limit`` of them, is an autotune candidate
(:meth:`ConvPlan.engines`). The default engine is the
first plan in heuristic order that builds, which is what
``build_plans(HEURISTICS_CHOICE)`` picks.

Precision (how TF32 is kept out of fp32): engines carry cuDNN *numerical
notes*. For ``precision='fp32'`` the plans noted ``TENSOR_CORE`` are
deselected (for float32 I/O a tensor-core engine is a TF32 engine; this is
PyTorch's ``allow_tf32=False`` filter in ``aten/src/ATen/native/cudnn/Conv_v8.cpp``);
plans noted ``DOWN_CONVERT_INPUTS`` are deselected in every precision, as
PyTorch does. A deselected plan stays in the ranked list but cannot be built,
so it never appears among the engines. Compute and intermediates are float32
in every precision (fp32 accumulation).

Source of the API: NVIDIA cudnn-frontend Python samples (``pygraph``,
``conv_fprop/conv_dgrad/conv_wgrad``, ``execute_plan_at_index``).
"""

from __future__ import annotations

import os
import threading
import time
from typing import NamedTuple

from opgraph.errors import LoweringError
from opgraph.ops.conv_fused import ACTIVATIONS, EPILOGUE_STEPS

#: Operand names, inputs then the output, by operation (an epilogue's operands,
#: ``EPILOGUE_STEPS``, go between the inputs and the output).
OPERANDS = {"fprop": ("x", "w", "y"), "dgrad": ("dy", "w", "dx"), "wgrad": ("x", "dy", "dw")}
#: operation -> the epilogue steps its graphs take (``EPILOGUE_STEPS``' names).
EPILOGUES = {"fprop": ("bias", "add", "relu", "relu6"), "dgrad": ("drelu",), "wgrad": ()}


def epilogue_name(steps) -> str:
    """A signature's ``epilogue``: the steps joined by ``_`` (``'bias_add_relu6'``),
    ``'none'`` without any."""
    return "_".join(steps) or "none"


def epilogue_steps(name: str) -> tuple[str, ...]:
    """The steps of an epilogue name (:func:`epilogue_name`'s inverse)."""
    return () if name == "none" else tuple(name.split("_"))


class ConvSignature(NamedTuple):
    """Everything a convolution graph depends on (hashable; the cache key).

    ``dims``/``strides`` hold one 4-tuple per operand in :data:`OPERANDS`
    order, with the epilogue's operands inserted before the output (the bias
    as ``(1, K, 1, 1)``; a residual, or dgrad's ReLU output, of the output's
    shape). Strides are in elements. Padding is split into ``pre`` (top,
    left) and ``post`` (bottom, right).
    """

    kind: str
    epilogue: str
    dims: tuple
    strides: tuple
    io_dtype: str
    precision: str
    pre_padding: tuple
    post_padding: tuple
    stride: tuple
    dilation: tuple
    channels_last: bool = False
    device: int = 0


class ConvPlan:
    """A built cuDNN graph and its engines, for one :class:`ConvSignature`.

    ``uids`` are the graph tensors' ids in signature operand order, so a call
    binds pointers with ``dict(zip(uids, ptrs))`` and nothing else.
    """

    def __init__(self, sig: ConvSignature, graph, uids: tuple, handle):
        self.sig, self.graph, self.uids, self.handle = sig, graph, uids, handle
        self.count = graph.get_execution_plan_count()
        self.workspace: dict[int, int] = {}  # built plan index -> workspace bytes
        self.failed: dict[int, str] = {}     # plan index -> why it did not build
        self.build_seconds: dict[int, float] = {}  # plan index -> time to build it
        self.default: int | None = None
        self._all_built = False
        self._fast: dict[int, tuple | bool] = {}  # plan index -> backend call, or False

    def ensure(self, index: int) -> int:
        """Build plan ``index`` if needed; return its workspace bytes.

        Raises:
            LoweringError: the index is out of range or the plan cannot be built
                (deselected by the precision, or unsupported).
        """
        ws = self.workspace.get(index)
        if ws is not None:
            return ws
        if not 0 <= index < self.count:
            raise LoweringError(f"cuDNN engine {index} does not exist for {self.describe()}: "
                                f"{self.count} plans")
        if index in self.failed:
            raise LoweringError(f"cuDNN engine {index} cannot run {self.describe()}: {self.failed[index]}")
        start = time.perf_counter()
        try:
            self.graph.build_plan_at_index(index)
            ws = int(self.graph.get_workspace_size_plan_at_index(index))
        except Exception as exc:  # cudnnGraphNotSupportedError, RuntimeError, ValueError
            self.failed[index] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            raise LoweringError(f"cuDNN engine {index} cannot run {self.describe()}: "
                                f"{self.failed[index]}") from None
        finally:
            self.build_seconds[index] = time.perf_counter() - start
        self.workspace[index] = ws
        return ws

    def _builds(self, index: int) -> bool:
        """Whether plan ``index`` builds (built now if not tried yet)."""
        try:
            self.ensure(index)
        except LoweringError:
            return False
        return True

    def pick_default(self) -> int:
        """The first plan in heuristic order that builds (built on the way)."""
        if self.default is None:
            self.default = next((i for i in range(self.count) if self._builds(i)), None)
            if self.default is None:
                reasons = "; ".join(f"[{i}] {r}" for i, r in list(self.failed.items())[:4])
                raise LoweringError(f"no cuDNN engine builds for {self.describe()}: {reasons}")
        return self.default

    def engines(self, limit: int | None = None) -> list[int]:
        """The plan indices that build, in heuristic order: every one (``limit``
        None; builds them all once) or the first ``limit`` of them (builds only
        as far down the ranking as it takes)."""
        if limit is None:
            if not self._all_built:
                for i in range(self.count):
                    self._builds(i)
                self._all_built = True
            return sorted(self.workspace)
        found = []
        for i in range(self.count):
            if len(found) >= limit:
                break
            if self._builds(i):
                found.append(i)
        return found

    def name(self, index: int) -> str:
        """cuDNN's name of plan ``index`` (engine id and knobs)."""
        return str(self.graph.get_plan_name_at_index(index))

    def describe(self) -> str:
        s = self.sig
        return (f"{s.kind}{'' if s.epilogue == 'none' else '+' + s.epilogue} dims={s.dims} "
                f"strides={s.strides} {s.io_dtype}/{s.precision} pre={s.pre_padding} "
                f"post={s.post_padding} stride={s.stride} dilation={s.dilation}")

    def execute(self, ptrs, index: int, workspace_ptr: int) -> None:
        """Run plan ``index`` (built, see :meth:`ensure`) on device pointers
        given in operand order, on CuPy's current stream.

        The first call of an index goes through the frontend's public
        ``execute_plan_at_index``; later calls go straight to the lowered
        backend graph's ``_execute_plan_at_index`` (what the public call ends
        in), which skips the frontend's per-call re-validation of the plan list
        and of the buffers (measured in docs/gpu.md). ``OPGRAPH_CUDNN_PUBLIC_EXECUTE=1``
        keeps every call on the public path.
        """
        _sync_stream(self.handle)
        pack = dict(zip(self.uids, ptrs))
        fast = self._fast.get(index)
        if fast:
            fn, cpp_index, raw = fast
            try:
                fn(pack, workspace_ptr, cpp_index, raw, None, None, None)
                return
            except TypeError:  # argument shape of another frontend version: raised before launch
                self._fast[index] = False
        self.graph.execute_plan_at_index(pack, workspace_ptr or None, index, handle=self.handle)
        if fast is None:
            self._fast[index] = _fast_path(self.graph, index, self.handle)


def _fast_path(graph, index: int, h):
    """``(backend_execute, backend_plan_index, raw_handle)`` for plan ``index``,
    or False when this frontend version does not have that shape."""
    if os.environ.get("OPGRAPH_CUDNN_PUBLIC_EXECUTE") == "1":
        return False
    try:
        cpp_index = graph._plans[index].cpp_index
        fn = graph._lowered_graph._execute_plan_at_index
        raw = h.backend_handle
    except (AttributeError, IndexError, TypeError):
        return False
    return (fn, cpp_index, raw) if cpp_index is not None and raw is not None else False


_CACHE: dict[ConvSignature, ConvPlan] = {}
_HANDLES: dict[int, object] = {}
_LOCK = threading.Lock()


def cudnn_module():
    """The ``cudnn`` frontend module.

    Raises:
        LoweringError: ``nvidia-cudnn-frontend`` is not installed.
    """
    try:
        import cudnn
    except Exception as exc:
        raise LoweringError(f"the cuDNN frontend cannot be imported ({exc}); "
                            "install it with pip install nvidia-cudnn-frontend") from None
    return cudnn


def handle(device: int = 0):
    """The process's cuDNN handle for CUDA device ``device`` (created once)."""
    h = _HANDLES.get(device)
    if h is None:
        cudnn = cudnn_module()
        h = _HANDLES[device] = cudnn.create_handle()
    return h


def _sync_stream(h) -> None:
    """Run cuDNN on CuPy's current stream (``set_stream`` is a no-op when unchanged)."""
    import cupy
    import cudnn
    cudnn.set_stream(h, cupy.cuda.get_current_stream().ptr)


def workspace(nbytes: int, device: int = 0):
    """Scratch of ``nbytes`` for one call, from CuPy's memory pool on ``device``
    (None for 0 bytes). The caller holds it until the call is launched; the
    pool then reuses the block in stream order. So only the running node's
    workspace is resident, as the memory plan assumes, rather than a shared
    buffer grown to the largest workspace any engine ever asked for (autotune
    tries engines that ask for gigabytes, which then stayed allocated)."""
    if nbytes <= 0:
        return None
    import cupy
    with cupy.cuda.Device(device):
        return cupy.empty(int(nbytes), dtype=cupy.uint8)


def pointer(buffer) -> int:
    """Device pointer of a :func:`workspace` buffer (0 for None)."""
    return 0 if buffer is None else buffer.data.ptr


def data_type(cudnn, dtype: str):
    """cuDNN frontend's ``data_type`` of I/O dtype name ``dtype`` ('float32',
    'float16' or 'bfloat16'); KeyError for another name. Used by every graph
    builder (convolution here, batch norm in :mod:`.cudnn_norm_graph`)."""
    return {"float32": cudnn.data_type.FLOAT, "float16": cudnn.data_type.HALF,
            "bfloat16": cudnn.data_type.BFLOAT16}[dtype]


def build_graph(sig: ConvSignature, h):
    """Build (validate, plan, filter) the cuDNN graph of ``sig``; return
    ``(graph, uids)``. No plan is built yet (see :meth:`ConvPlan.ensure`).

    Raises:
        cudnn.cudnnGraphNotSupportedError, RuntimeError: cuDNN rejects it.
    """
    cudnn = cudnn_module()
    io, f32 = data_type(cudnn, sig.io_dtype), cudnn.data_type.FLOAT
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=f32, compute_data_type=f32, handle=h)
    steps = epilogue_steps(sig.epilogue)
    if any(step not in EPILOGUES[sig.kind] for step in steps):
        raise ValueError(f"{sig.kind} takes the epilogue steps {EPILOGUES[sig.kind]}, not {sig.epilogue!r}")
    names = list(OPERANDS[sig.kind][:2]) + [EPILOGUE_STEPS[s] for s in steps if EPILOGUE_STEPS[s]]
    ins = [g.tensor(name=n, dim=list(d), stride=list(s), data_type=io)
           for n, d, s in zip(names, sig.dims, sig.strides)]
    conv = dict(pre_padding=list(sig.pre_padding), post_padding=list(sig.post_padding),
                stride=list(sig.stride), dilation=list(sig.dilation), compute_data_type=f32)
    if sig.kind == "fprop":
        out = g.conv_fprop(image=ins[0], weight=ins[1], **conv)
    elif sig.kind == "dgrad":
        out = g.conv_dgrad(loss=ins[0], filter=ins[1], **conv)
    elif sig.kind == "wgrad":
        out = g.conv_wgrad(image=ins[0], loss=ins[1], **conv)
    else:
        raise ValueError(f"unknown convolution kind {sig.kind!r}")
    out = _epilogue(g, steps, out, iter(ins[2:]), f32)
    out.set_output(True).set_data_type(io).set_dim(list(sig.dims[-1])).set_stride(list(sig.strides[-1]))
    g.validate()
    g.build_operation_graph()
    notes = [cudnn.numerical_note.DOWN_CONVERT_INPUTS]
    if sig.precision == "fp32":
        notes.append(cudnn.numerical_note.TENSOR_CORE)  # no TF32 (see the module docstring)
    g.deselect_numeric_notes(notes)
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    return g, tuple(t.get_uid() for t in ins) + (out.get_uid(),)


def _epilogue(g, steps, out, operands, f32):
    """The epilogue's pointwise ops after the convolution ``out``, in order:
    ``bias`` and ``add`` (the bias and the residual tensors), ``relu``,
    ``relu6`` (``relu`` clipped to ``ACTIVATIONS['relu6']``), ``drelu``
    (``relu_backward`` of the gradient, masked where the ReLU output is > 0)."""
    for step in steps:
        if step == "bias":
            out = g.bias(input=out, bias=next(operands), compute_data_type=f32)
        elif step == "add":
            out = g.add(a=out, b=next(operands), compute_data_type=f32)
        elif step == "drelu":
            out = g.relu_backward(loss=out, input=next(operands), compute_data_type=f32)
        else:
            lo, hi = ACTIVATIONS[step]
            clips = {"lower_clip": lo, "upper_clip": hi} if hi is not None else {}
            out = g.relu(input=out, compute_data_type=f32, **clips)
    return out


def cached_plan(cache: dict, sig, build, plan_type=None, describe=None, *, need_default: bool = True):
    """The plan of ``sig`` in ``cache``, built on first use: ``build(sig, handle)``
    gives ``(graph, uids)``, wrapped in ``plan_type`` (default :class:`ConvPlan`).
    ``describe(sig)`` names the graph in errors. Shared by every cuDNN graph family.

    Raises:
        LoweringError: cuDNN rejects the graph, or (``need_default``) no
            engine builds for it. The message holds cuDNN's reason.
    """
    plan = cache.get(sig)
    if plan is None:
        with _LOCK:
            plan = cache.get(sig)
            if plan is None:
                h = handle(sig.device)
                try:
                    graph, uids = build(sig, h)
                except LoweringError:
                    raise
                except Exception as exc:
                    msg = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                    what = describe(sig) if describe else f"{sig.kind} {sig}"
                    raise LoweringError(f"cuDNN rejects {what}: {msg}") from None
                plan = cache[sig] = (plan_type or ConvPlan)(sig, graph, uids, h)
    if need_default:
        plan.pick_default()
    return plan


def plan_for(sig: ConvSignature, *, need_default: bool = True) -> ConvPlan:
    """The cached :class:`ConvPlan` of ``sig``, built on first use (:func:`cached_plan`).

    Raises:
        LoweringError: cuDNN rejects the graph, or (``need_default``) no
            engine builds for it. The message holds cuDNN's reason.
    """
    return cached_plan(_CACHE, sig, build_graph, need_default=need_default)


def cache_size() -> int:
    return len(_CACHE)


__all__ = ["OPERANDS", "EPILOGUES", "epilogue_name", "epilogue_steps", "ConvSignature", "ConvPlan",
           "cudnn_module", "data_type", "handle", "workspace", "pointer", "build_graph", "cached_plan", "plan_for",
           "cache_size"]
