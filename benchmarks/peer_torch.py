"""The PyTorch peer's model: *our* forward graph run by PyTorch, node by node.

:class:`TorchModel` walks the opgraph forward graph of a benchmark model and
calls one ``torch`` / ``torch.nn.functional`` function per node (the
converters of :mod:`.peer_converters`) on the same parameter and input values
as the opgraph run (its feeds), not on a look-alike from torchvision. The
gradients come from one ``torch.autograd.grad`` pass, as in a PyTorch
user's training step: the model output passed back as its own output
gradient (the seed's protocol), parameters only unless ``input_grad``.

How it is run and timed (eager, ``torch.compile``, CUDA graphs) is
:mod:`.peer_run`; here are the pieces every variant shares:

* **storage dtype** (:func:`storage_dtype`): the peer stores what opgraph
  stores: float32 parameters and activations for a float32 model,
  bfloat16 (float16) ones for a ``--dtype bfloat16`` (``float16``) model;
  integer sources (class targets) stay integers;
* **layout**: ``channels_last`` puts the input and 4-D weights in
  ``torch.channels_last`` (opgraph's NHWC);
* **precision** (:func:`tf32_flags`, :func:`autocast`): fp32 with TF32 off
  (``torch.backends.cudnn.allow_tf32`` and
  ``torch.backends.cuda.matmul.allow_tf32`` False), tf32 with both on, bf16
  / fp16 with ``torch.autocast`` entered around each forward (convolutions
  and matmuls in the low precision, as opgraph's bf16 policy), its weight
  cache off: ``torch.cuda.graph`` asks for that, and each weight is read once
  per forward, so the cache saves nothing here.
"""

from __future__ import annotations

import contextlib

import numpy as np

from opgraph.errors import OpgraphError
from opgraph.op import Source, abstract_of

from .models import Model
from .peer_converters import (CONVERTERS, PREPARED, PeerContext, fused_running, running_update_step,
                              training_step)

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


class TorchModel:
    """A functional PyTorch runner of ``model``'s forward graph.

    Args:
        model: the opgraph model (only its forward graph is read).
        feeds: host or CuPy arrays by source name (input, parameters,
            buffers); a source not fed takes the graph's ``param_values``.
        device: ``'cpu'`` or ``'cuda'``.
        dtype: PyTorch dtype of the floating values (``torch.float32``;
            the converter check and the tests use float64).
        channels_last: 4-D input and weights in ``torch.channels_last``.
        input_grad: the image requires a gradient too (and :meth:`grads`
            returns it last), as for the single-layer suite.
        outputs: the values computed (default ``[model.output]``; the first
            is the one differentiated), e.g. the new running statistics of a
            training batch norm too.

    Raises:
        PeerError: PyTorch missing, or an op without a converter.
    """

    def __init__(self, model: Model, feeds: dict, device: str = "cpu", dtype=None,
                 channels_last: bool = False, input_grad: bool = False, outputs=None):
        torch = import_torch()
        import torch.nn.functional as F

        self.torch, self.model = torch, model
        self.device = torch.device("cuda" if device == "cuda" else "cpu")
        self.ctx = PeerContext(torch, F, self.device, dtype or torch.float32)
        g = model.graph
        self.outputs = [v.node for v in (outputs or [model.output])]
        order = list(g.nodes_in_order([g.value(n) for n in self.outputs]))
        in_plan = {node.id for node in order}
        self.params, self.inputs, plan = {}, {}, []
        self.unused = False  # some parameter the outputs do not read
        training_of: dict[int, int] = {}  # stats node -> the training node updating its buffers
        for node in order:
            if isinstance(node.op, Source):
                value = feeds[node.name] if node.name in feeds else g.param_values[node.name]
                t = self._tensor(value, channels_last)
                if node.op.role == "param":
                    self.params[node.id] = t.requires_grad_(True)
                else:
                    self.inputs[node.id] = t.requires_grad_(input_grad and node.id == model.input.node)
                continue
            op = abstract_of(node.op)
            if op.name not in CONVERTERS:
                raise PeerError(f"node {node.name}: {op.name} has no PyTorch converter "
                                f"(have: {', '.join(sorted(CONVERTERS))})")
            fn, args = CONVERTERS[op.name], tuple(g.input_ids(node.id))
            if op.name in PREPARED:
                key = ("prepared", node.id)
                self.inputs[key] = PREPARED[op.name](self.ctx, op, node.input_types)
                args += (key,)
            if op.name == "BatchNormTraining":
                fused = fused_running(g, node, in_plan)
                if fused is not None:
                    fn, extra = training_step(fused)
                    args += extra
                    training_of[args[1]] = node.id
            plan.append([node.id, fn, op, args])
        for step in plan:  # an update F.batch_norm does in place follows that call
            if step[2].name == "BatchNormRunningUpdate":
                fused = running_update_step(g, step[0], training_of)
                if fused is not None:
                    step[1], step[3] = fused
        self.plan = _dependency_order([tuple(s) for s in plan])
        last = {}
        for i, (_, _, _, args) in enumerate(self.plan):
            for a in args:
                last[a] = i
        keep = set(self.outputs) | set(self.params) | set(self.inputs)
        self.frees = [[a for a in set(args) if last[a] == i and a not in keep]
                      for i, (_, _, _, args) in enumerate(self.plan)]
        self.output = self.outputs[0]
        for p in model.params:  # one the output does not read: its gradient is zeros, as opgraph's
            if p.node not in self.params:
                value = feeds[p.name] if p.name in feeds else g.param_values[p.name]
                self.params[p.node] = self._tensor(value, channels_last).requires_grad_(True)
                self.unused = True
        self.param_list = [self.params[p.node] for p in model.params]
        if input_grad:
            self.param_list.append(self.inputs[model.input.node])

    def _tensor(self, array, channels_last: bool):
        torch = self.torch
        if not hasattr(array, "dtype"):
            array = np.asarray(array)
        floating = array.dtype.kind == "f" or array.dtype.name == "bfloat16"
        if array.dtype.name == "bfloat16":  # neither torch.as_tensor nor DLPack takes ml_dtypes' bf16
            array = array.astype("float32")
        if hasattr(array, "__dlpack__") and type(array).__module__.startswith("cupy"):
            t = torch.from_dlpack(array)
        else:
            t = torch.as_tensor(array)
        t = t.to(device=self.device, dtype=self.ctx.dtype if floating else None).clone()
        if channels_last and t.ndim == 4:
            t = t.contiguous(memory_format=torch.channels_last)
        return t.detach()

    def forward_outputs(self) -> list:
        """Every requested output (``outputs``), the first recording autograd history."""
        vals = {**self.inputs, **self.params}
        ctx = self.ctx
        for (node, fn, op, args), frees in zip(self.plan, self.frees):
            vals[node] = fn(ctx, op, *[vals[a] for a in args])
            for a in frees:
                vals.pop(a, None)
        return [vals[n] for n in self.outputs]

    def forward(self):
        """The model output (a tensor recording autograd history)."""
        return self.forward_outputs()[0]

    def grads(self, y, gy=None, retain_graph: bool = False):
        """Parameter gradients (then the input's, with ``input_grad``) for output
        gradient ``gy`` (default ``y`` itself)."""
        gy = y.detach() if gy is None else gy
        zeros = {"materialize_grads": True} if self.unused else {}
        return self.torch.autograd.grad(y, self.param_list, grad_outputs=gy, retain_graph=retain_graph,
                                        **zeros)


def _dependency_order(plan: list) -> list:
    """``plan`` reordered so that each step follows the steps it reads, the
    original order kept otherwise: a running-statistics update that
    ``F.batch_norm`` does in place reads that call's node, which the graph's
    order may put later."""
    ids = {step[0] for step in plan}
    done, out, pending = set(), [], list(plan)
    while pending:
        i = next(i for i, step in enumerate(pending) if all(a in done or a not in ids for a in step[3]))
        step = pending.pop(i)
        out.append(step)
        done.add(step[0])
    return out


def storage_dtype(torch, dtype: str):
    """The PyTorch dtype of opgraph's storage dtype name: the peer stores what
    opgraph stores (float16 / bfloat16 models run PyTorch in that dtype too,
    under autocast to the run's precision)."""
    return {"float64": torch.float64, "float16": torch.float16,
            "bfloat16": torch.bfloat16}.get(dtype, torch.float32)


@contextlib.contextmanager
def tf32_flags(torch, precision: str):
    """TF32 on for ``precision == 'tf32'``, off otherwise, in cuDNN and cuBLAS
    matmuls; the previous flags are restored on exit."""
    old = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old


def autocast(torch, precision: str, device: str):
    """``torch.autocast`` to bf16 / fp16 for those precisions (weight cache off,
    module docstring), a null context otherwise; a new context per call."""
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    if low is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type="cuda" if device == "cuda" else "cpu", dtype=low,
                          cache_enabled=False)


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


__all__ = ["INSTALL_HINT", "PeerError", "import_torch", "TorchModel", "storage_dtype", "tf32_flags",
           "autocast", "to_xp"]
