"""The PyTorch peer: the same model, inputs and protocol, run by PyTorch in the same process.

``--compare torch`` (eager) and ``--compare torch-compile`` (``torch.compile``
of the same function) run *our* model, not a look-alike from torchvision:
:class:`TorchModel` walks the opgraph forward graph and calls one
``torch.nn.functional`` function per node (:data:`CONVERTERS`), on the same
parameter and input values (the feeds of the opgraph run). Its output and
parameter gradients are compared with the float64 reference like every
lowering (end to end), which also checks the converter.

Protocol, as close to the seed's as autograd allows: ``cudnn.benchmark =
True``; the model output passed back as the output gradient
(``torch.autograd.grad(y, params, grad_outputs=y)``) with the image not
requiring a gradient, so the first convolution computes no input gradient
(L1-L5: the image's gradient is asked for too, as in opgraph's graph);
``warmup`` forward + backward iterations; then forward timed alone
(autograd recording on, as in training) and backward timed alone
(``autograd.grad`` of a retained graph). PyTorch computes a layer's input
and weight gradients in one backward pass, so its backward-data /
backward-filter split is not available ("n/a"); its backward is compared
with our backward-data + backward-filter.

Precision: fp32 with TF32 off (``torch.backends.cudnn.allow_tf32`` and
``torch.backends.cuda.matmul.allow_tf32`` False), tf32 with both on, bf16 /
fp16 with ``torch.autocast`` (convolutions and matmuls in the low precision,
as opgraph's bf16 policy). The peer stores what opgraph stores
(:func:`storage_dtype`): float32 parameters and activations for a float32
model (autocast's usual mixed precision), bfloat16 (float16) ones for a
``--dtype bfloat16`` (``float16``) model;
layout ``nhwc`` puts the input and 4-D weights in ``torch.channels_last``.
"""

from __future__ import annotations

import contextlib
import time

from opgraph.errors import OpgraphError
from opgraph.op import Source, abstract_of

from .models import Model
from .timer import CpuTimer, Timing

PEERS = ("torch", "torch-compile")
INSTALL_HINT = ("PyTorch is not installed: pip install -e \".[torch]\" (or pip install torch); "
                "without it, leave out --compare")


class PeerError(OpgraphError):
    """The peer cannot run (PyTorch missing, an op without a converter)."""


def import_torch():
    """``torch``, or a :class:`PeerError` that says how to install it."""
    try:
        import torch
    except ImportError as e:
        raise PeerError(f"{INSTALL_HINT} ({e})") from None
    return torch


def _symmetric(padding) -> tuple[int, int] | None:
    (t, b), (l, r) = padding
    return (t, l) if (t, l) == (b, r) else None


def _conv2d(torch, F, op, x, w, b=None):
    pad = _symmetric(op.padding)
    if pad is None:  # asymmetric: explicit zero padding, then none
        (t, bo), (l, r) = op.padding
        x, pad = F.pad(x, (l, r, t, bo)), 0
    return F.conv2d(x, w, b, stride=op.stride, padding=pad, dilation=op.dilation, groups=op.groups)


def _pool_padding(op) -> tuple[int, int]:
    pad = _symmetric(op.padding)
    if pad is None:
        raise PeerError(f"{op.describe()}: asymmetric pooling padding has no torch.nn.functional form")
    return pad


def _lrn(torch, F, op, x):
    """SEMANTICS.md's window (``c - floor((size-1)/2) .. c + ceil((size-1)/2)``;
    ``F.local_response_norm`` centres even windows the other way)."""
    lo = (op.size - 1) // 2
    sq = F.pad((x * x).unsqueeze(1), (0, 0, 0, 0, lo, op.size - 1 - lo))
    s = F.avg_pool3d(sq, (op.size, 1, 1), stride=1).squeeze(1) * op.size
    return x / (op.k + op.alpha / op.size * s) ** op.beta


def _dropout(torch, F, op, x):
    if op.training:
        raise PeerError("Dropout in training mode: opgraph's seeded mask has no PyTorch equivalent")
    return x


#: abstract op name -> ``fn(torch, F, op, *inputs)``.
CONVERTERS = {
    "Conv2d": _conv2d,
    "MaxPool2d": lambda torch, F, op, x: F.max_pool2d(x, op.kernel_size, op.stride, _pool_padding(op),
                                                      ceil_mode=op.ceil_mode),
    "AvgPool2d": lambda torch, F, op, x: F.avg_pool2d(x, op.kernel_size, op.stride, _pool_padding(op),
                                                      ceil_mode=op.ceil_mode,
                                                      count_include_pad=op.count_include_pad),
    "Relu": lambda torch, F, op, x: F.relu(x),
    "Threshold": lambda torch, F, op, x: F.threshold(x, op.threshold, op.value),
    "Linear": lambda torch, F, op, x, w, b=None: F.linear(x, w, b),
    "Flatten": lambda torch, F, op, x: torch.flatten(x, op.start_dim),
    "Reshape": lambda torch, F, op, x: x.reshape(op.shape),
    "Concat": lambda torch, F, op, *xs: torch.cat(xs, dim=op.axis),
    "LocalResponseNorm": _lrn,
    "BiasAdd": lambda torch, F, op, x, b: x + b.reshape(1, -1, *([1] * (x.ndim - 2))),
    "Add": lambda torch, F, op, a, b: a + b,
    "Dropout": _dropout,
    "Pad": lambda torch, F, op, x: F.pad(x, (*op.padding[1], *op.padding[0]), value=op.value),
    "Softmax": lambda torch, F, op, x: F.softmax(x, dim=op.axis),
    "LogSoftmax": lambda torch, F, op, x: F.log_softmax(x, dim=op.axis),
}


class TorchModel:
    """A functional PyTorch runner of ``model``'s forward graph.

    Args:
        model: the opgraph model (only its forward graph is read).
        feeds: host or CuPy arrays by source name (input and parameters).
        device: ``'cpu'`` or ``'cuda'``.
        dtype: PyTorch dtype of the values (``torch.float32``; tests use float64).
        channels_last: 4-D input and weights in ``torch.channels_last``.
        input_grad: the image requires a gradient too (and :meth:`grads`
            returns it last), as for the single-layer suite.

    Raises:
        PeerError: PyTorch missing, or an op without a converter.
    """

    def __init__(self, model: Model, feeds: dict, device: str = "cpu", dtype=None,
                 channels_last: bool = False, input_grad: bool = False):
        torch = import_torch()
        import torch.nn.functional as F

        self.torch, self.F, self.model = torch, F, model
        self.device = torch.device("cuda" if device == "cuda" else "cpu")
        dtype = dtype or torch.float32
        g = model.graph
        order = list(g.nodes_in_order([model.output]))
        self.params, self.inputs, self.plan = {}, {}, []
        for node in order:
            if isinstance(node.op, Source):
                t = self._tensor(feeds[node.name], dtype, channels_last)
                if node.op.role == "param":
                    self.params[node.id] = t.requires_grad_(True)
                else:
                    self.inputs[node.id] = t.requires_grad_(input_grad and node.id == model.input.node)
                continue
            op = abstract_of(node.op)
            if op.name not in CONVERTERS:
                raise PeerError(f"node {node.name}: {op.name} has no PyTorch converter "
                                f"(have: {', '.join(sorted(CONVERTERS))})")
            self.plan.append((node.id, CONVERTERS[op.name], op, tuple(g.input_ids(node.id))))
        last = {}
        for i, (_, _, _, args) in enumerate(self.plan):
            for a in args:
                last[a] = i
        self.frees = [[a for a in set(args) if last[a] == i] for i, (_, _, _, args) in enumerate(self.plan)]
        self.output = model.output.node
        self.param_list = [self.params[p.node] for p in model.params]
        if input_grad:
            self.param_list.append(self.inputs[model.input.node])

    def _tensor(self, array, dtype, channels_last: bool):
        torch = self.torch
        if array.dtype.name == "bfloat16":  # neither torch.as_tensor nor DLPack takes ml_dtypes' bf16
            array = array.astype("float32")
        if hasattr(array, "__dlpack__") and type(array).__module__.startswith("cupy"):
            t = torch.from_dlpack(array)
        else:
            t = torch.as_tensor(array)
        t = t.to(device=self.device, dtype=dtype).clone()
        if channels_last and t.ndim == 4:
            t = t.contiguous(memory_format=torch.channels_last)
        return t.detach()

    def forward(self):
        """The model output (a tensor recording autograd history)."""
        vals = {**self.inputs, **self.params}
        torch, F = self.torch, self.F
        for (node, fn, op, args), frees in zip(self.plan, self.frees):
            vals[node] = fn(torch, F, op, *[vals[a] for a in args])
            for a in frees:
                if a != self.output and a not in self.params and a not in self.inputs:
                    vals.pop(a, None)
        return vals[self.output]

    def grads(self, y, gy=None, retain_graph: bool = False):
        """Parameter gradients (then the input's, with ``input_grad``) for output
        gradient ``gy`` (default ``y`` itself)."""
        gy = y.detach() if gy is None else gy
        return self.torch.autograd.grad(y, self.param_list, grad_outputs=gy, retain_graph=retain_graph)


def storage_dtype(torch, dtype: str):
    """The PyTorch dtype of opgraph's storage dtype name: the peer stores what
    opgraph stores (float16 / bfloat16 models run PyTorch in that dtype too,
    under autocast to the run's precision)."""
    return {"float64": torch.float64, "float16": torch.float16,
            "bfloat16": torch.bfloat16}.get(dtype, torch.float32)


@contextlib.contextmanager
def precision_mode(torch, precision: str, device: str):
    """TF32 flags and autocast for ``precision`` (module docstring); restores the flags."""
    old = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = tf32
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    cast = (torch.autocast(device_type="cuda" if device == "cuda" else "cpu", dtype=low)
            if low is not None else contextlib.nullcontext())
    try:
        with cast:
            yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old


class TorchCudaTimer:
    """``torch.cuda.Event`` pairs around each call (the peer's own stream)."""

    clock = "CUDA events (torch.cuda.Event) around each call"

    def __init__(self, torch):
        self.torch = torch

    def measure(self, fn, *, label: str = "", repeat: int = 1) -> list[float]:
        torch = self.torch
        torch.cuda.synchronize()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(repeat)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return [float(s.elapsed_time(e)) for s, e in events]

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()


def to_xp(t, device: str):
    """A detached float32-or-wider tensor as a NumPy (cpu) or CuPy (cuda) array."""
    import torch

    t = t.detach()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.float()
    if device == "cuda":
        import cupy

        return cupy.from_dlpack(t.contiguous())
    return t.cpu().numpy()


def run_peer(model: Model, feeds: dict, *, device: str, precision: str = "fp32",
             layout: str = "NCHW", warmup: int = 1, repeat: int = 3, compiled: bool = False,
             reference=None, input_grad: bool = False) -> dict:
    """Run and time the peer on ``model`` (module docstring).

    Returns:
        ``{"times": {"forward", "backward"}: Timing.as_dict(), "first_call_s",
        "check": end-to-end errors vs ``reference`` (or None), "memory":
        {"measured_peak_bytes", "reserved_peak_bytes"} (cuda:
        ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` over one
        forward + backward, minus what was allocated / reserved before),
        "versions": {"torch", "cudnn"}}``.

    Raises:
        PeerError: PyTorch missing or the model has an op without a converter.
    """
    from .check import end_to_end

    torch = import_torch()
    if device == "cuda":
        torch.backends.cudnn.benchmark = True
    tm = TorchModel(model, feeds, device, dtype=storage_dtype(torch, model.dtype),
                    channels_last=layout.upper() == "NHWC", input_grad=input_grad)
    if compiled:
        # The backward loop reuses one forward's graph (retain_graph=True), which
        # AOTAutograd's donated buffers forbid; and shapes never change here, so
        # no dynamic-shape recompiles (they failed in inductor on the H200).
        import torch._functorch.config as functorch_config
        functorch_config.donated_buffer = False
        fwd = torch.compile(tm.forward, dynamic=False)
    else:
        fwd = tm.forward
    timer = TorchCudaTimer(torch) if device == "cuda" else CpuTimer()

    def step():
        y = fwd()
        return y, tm.grads(y)

    with precision_mode(torch, precision, device):
        t0 = time.perf_counter()
        y, grads = step()
        timer.synchronize()
        first_call_s = time.perf_counter() - t0
        check = None
        if reference is not None:
            outs = [to_xp(y, device), *(to_xp(g, device) for g in grads)]
            check = end_to_end(reference.xp, outs, reference)
        del y, grads
        memory = {"measured_peak_bytes": None, "reserved_peak_bytes": None}
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()  # reserved starts from what is in use, as CuPy's pool figure does
            before, before_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
            torch.cuda.reset_peak_memory_stats()
            step()
            torch.cuda.synchronize()
            memory["measured_peak_bytes"] = torch.cuda.max_memory_allocated() - before
            memory["reserved_peak_bytes"] = torch.cuda.max_memory_reserved() - before_reserved
        for _ in range(warmup):
            step()
        timer.synchronize()
        t_fwd = Timing(timer.measure(fwd, label="torch/forward", repeat=repeat))
        y = fwd()
        gy = y.detach()
        t_bwd = Timing(timer.measure(lambda: tm.grads(y, gy, retain_graph=True),
                                     label="torch/backward", repeat=repeat))
        del y, gy
    del tm
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # give the memory back to CuPy's pool for the next columns
    versions = {"torch": torch.__version__,
                "cudnn": torch.backends.cudnn.version() if device == "cuda" else None}
    return {"times": {"forward": t_fwd.as_dict(), "backward": t_bwd.as_dict()},
            "first_call_s": first_call_s, "check": check, "memory": memory, "versions": versions}


__all__ = ["PEERS", "PeerError", "import_torch", "CONVERTERS", "TorchModel", "precision_mode",
           "TorchCudaTimer", "to_xp", "run_peer"]
