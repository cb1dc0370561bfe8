"""cuDNN frontend graphs of training batch normalisation, one per signature, built once.

Three graphs (:data:`OPERANDS` lists their operands, inputs then outputs):

* ``bn_train``: cuDNN's ``batchnorm`` node, the whole training forward:
  statistics over N, H, W, the normalisation, and the running-statistics
  update with ``momentum`` (x, scale, bias, running mean and variance,
  epsilon, momentum -> y, saved mean, saved inverse standard deviation,
  next running mean and variance);
* ``bn_normalize``: cuDNN's ``batchnorm_inference`` node fed with the batch
  statistics a ``BatchNormStats`` node computed (x, mean, inv_variance,
  scale, bias -> y): the normalisation alone;
* ``bn_backward``: cuDNN's ``batchnorm_backward`` node (dy, x, scale, mean,
  inv_variance -> dx, dscale, dbias), the gradient through the statistics.

A signature (:class:`NormSignature`) fixes the graph kind, x's 4-D dims and
element strides (NCHW and NHWC are just other strides; dy and dx share x's,
y too), the I/O dtype and the device. Per-channel vectors are float32
``(1, C, 1, 1)``. Epsilon and momentum are pass-by-value scalars (float32
``(1, 1, 1, 1)``), bound per call through a host pointer, so one graph serves
every eps and momentum. Compute and intermediates are float32.

Plans are :class:`~.cudnn_graph.ConvPlan`\\ s (the engine list, lazy builds,
the lean execute path are the convolution's); only the description differs.

Source of the API: NVIDIA cuDNN frontend documentation, "Normalizations"
(``batchnorm``, ``batchnorm_inference``, ``batchnorm_backward``; the outputs
in the order ``[y, saved_mean, saved_inv_variance, next_running_mean,
next_running_var]``) and its Python batch-norm tests (pass-by-value epsilon
and momentum as ``(1, 1, 1, 1)`` host tensors).
"""

from __future__ import annotations

from typing import NamedTuple

from . import cudnn_graph as cg

#: kind -> (input operands, output operands), in the order of a call's pointers.
OPERANDS = {
    "bn_train": (("x", "scale", "bias", "running_mean", "running_var", "epsilon", "momentum"),
                 ("y", "mean", "inv_variance", "next_running_mean", "next_running_var")),
    "bn_normalize": (("x", "mean", "inv_variance", "scale", "bias"), ("y",)),
    "bn_backward": (("dy", "x", "scale", "mean", "inv_variance"), ("dx", "dscale", "dbias")),
}
#: operands of x's shape and strides (the rest are per-channel vectors or scalars).
TENSORS = frozenset({"x", "y", "dy", "dx"})
SCALARS = frozenset({"epsilon", "momentum"})
IO_DTYPES = ("float32", "float16", "bfloat16")


class NormSignature(NamedTuple):
    """Everything a batch-norm graph depends on (hashable; the cache key).

    ``dims`` is x's logical ``(N, C, H, W)``, ``strides`` its element strides.
    """

    kind: str
    dims: tuple
    strides: tuple
    io_dtype: str
    device: int = 0

    def describe(self) -> str:
        return f"{self.kind} dims={self.dims} strides={self.strides} {self.io_dtype}"


class NormPlan(cg.ConvPlan):
    """A built batch-norm graph and its engines (``ConvPlan``'s machinery)."""

    def describe(self) -> str:
        return self.sig.describe()


def vector_dims(c: int) -> tuple[list, list]:
    """``(dims, strides)`` of a per-channel float32 vector: ``(1, C, 1, 1)``, dense."""
    return [1, c, 1, 1], [c, 1, c, c]


def build_graph(sig: NormSignature, h):
    """Build (validate, plan) the cuDNN graph of ``sig``; return ``(graph, uids)``
    with the uids in :data:`OPERANDS` order. No plan is built yet.

    Raises:
        ValueError: an unknown kind or dtype. cudnn.cudnnGraphNotSupportedError,
        RuntimeError: cuDNN rejects the graph.
    """
    if sig.kind not in OPERANDS:
        raise ValueError(f"unknown batch-norm graph kind {sig.kind!r}; one of {sorted(OPERANDS)}")
    if sig.io_dtype not in IO_DTYPES:
        raise ValueError(f"cuDNN batch norm takes {IO_DTYPES}, not {sig.io_dtype!r}")
    cudnn = cg.cudnn_module()
    io, f32 = cg.data_type(cudnn, sig.io_dtype), cudnn.data_type.FLOAT
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=f32, compute_data_type=f32, handle=h)
    vdims, vstrides = vector_dims(sig.dims[1])
    inputs, outputs = OPERANDS[sig.kind]

    def operand(name):
        if name in TENSORS:
            return g.tensor(name=name, dim=list(sig.dims), stride=list(sig.strides), data_type=io)
        if name in SCALARS:
            return g.tensor(name=name, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=f32,
                            is_pass_by_value=True)
        return g.tensor(name=name, dim=vdims, stride=vstrides, data_type=f32)

    t = {name: operand(name) for name in inputs}
    if sig.kind == "bn_train":
        outs = g.batchnorm(name="bn", input=t["x"], scale=t["scale"], bias=t["bias"],
                           in_running_mean=t["running_mean"], in_running_var=t["running_var"],
                           epsilon=t["epsilon"], momentum=t["momentum"])
    elif sig.kind == "bn_normalize":
        outs = [g.batchnorm_inference(name="bn", input=t["x"], mean=t["mean"],
                                      inv_variance=t["inv_variance"], scale=t["scale"], bias=t["bias"])]
    else:
        outs = g.batchnorm_backward(name="dbn", grad=t["dy"], input=t["x"], scale=t["scale"],
                                    mean=t["mean"], inv_variance=t["inv_variance"])
    for name, out in zip(outputs, outs):
        out.set_output(True)
        if name in TENSORS:
            out.set_data_type(io).set_dim(list(sig.dims)).set_stride(list(sig.strides))
        else:
            out.set_data_type(f32).set_dim(vdims).set_stride(vstrides)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    return g, tuple(t[n].get_uid() for n in inputs) + tuple(o.get_uid() for o in outs)


_CACHE: dict[NormSignature, NormPlan] = {}


def plan_for(sig: NormSignature, *, need_default: bool = True) -> NormPlan:
    """The cached :class:`NormPlan` of ``sig``, built on first use
    (:func:`.cudnn_graph.cached_plan`).

    Raises:
        LoweringError: the frontend is missing, cuDNN rejects the graph, or
            (``need_default``) no engine builds for it; the message holds
            cuDNN's reason.
    """
    return cg.cached_plan(_CACHE, sig, build_graph, NormPlan, NormSignature.describe, need_default=need_default)


def cache_size() -> int:
    return len(_CACHE)


__all__ = ["OPERANDS", "TENSORS", "SCALARS", "IO_DTYPES", "NormSignature", "NormPlan", "vector_dims",
           "build_graph", "plan_for", "cache_size"]
