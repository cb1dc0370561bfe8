"""Registers our CuPy kernels as the ``cuda`` lowering (device ``cuda``) of their ops.

Two kernel conventions, as in the reference backend:

* :data:`CUDA_KERNELS`: ``fn(cupy, *arrays, **op.params())``; the functions of
  :mod:`.relu`, :mod:`.colsum`, :mod:`.lrn`, :mod:`.loss` take exactly the
  op fields as keywords, like their NumPy references, plus the option of an
  autotune variant where :data:`OPTIONS` names one (bias gradient: ``method``);
* :data:`NODE_KERNELS`: ``kernel(ctx, op, *arrays)`` reading the node's
  geometry (the pooling kernels of :mod:`.pool`: the op's canonical fields
  and the node's extents, ``reference.pool.node_geometry``), with the
  variant's ``specialize`` from ``ctx.options``; and ``Zeros``, a memset of
  the type the node runs in.

A third: the depthwise convolution's stride-1 forward (:mod:`.depthwise_forward`,
tag ``depthwise-fprop``), backward-data (:mod:`.depthwise`) and
backward-filter (:mod:`.depthwise_filter`, tag ``depthwise-wgrad``), autotune
candidates beside cuDNN's engines for the convolutions they take, each with
its own variants (``depthwise_forward.variants``, ``depthwise.variants``,
``depthwise_filter.variants``, revisioned). A
fourth: the ``unfold`` rules (:mod:`.unfold`) of the forward convolutions and
backward-filter with few input channels (an ImageNet stem), unfolded and
multiplied on cuBLAS.

Importing this module needs neither CuPy nor a GPU; the kernels compile on
first use.
"""

from __future__ import annotations

from opgraph import ops
from opgraph.types import INDEX_DTYPES

from ..reference.kernel import params_kernel
from ..registry import Rule, register
from . import (colsum, colsum_relu, colsum_vector, depthwise, depthwise_filter, depthwise_forward, loss, lrn, pool,
               pool_indices, pool_vector, relu, unfold)
from .cublas import capture_requirement
from .codegen import movement
from .kernel_sources import fingerprinted, one_variant

def zeros_node(ctx, op):
    """A ``Zeros`` node's memset in the type it runs in (``ctx.out_type``, compile's
    dtype applied), else the op's declared type (``reference.elementwise.zeros_node``)."""
    return movement.zeros(ctx.xp, type=ctx.out_type or op.type)


#: the pooling kernels, which take ``specialize`` (geometry compiled in)
POOL_KERNELS = {
    ops.MaxPool2d: pool.max_pool2d_kernel,
    ops.MaxPool2dBackward: pool.max_pool2d_backward_kernel,
    ops.MaxPool2dBackwardRelu: pool.max_pool2d_backward_relu_kernel,
    ops.MaxPool2dSelect: pool.max_pool2d_select_kernel,
    ops.AvgPool2d: pool.avg_pool2d_kernel,
    ops.AvgPool2dBackward: pool.avg_pool2d_backward_kernel,
    ops.MaxPool2dArgmax: pool_indices.max_pool2d_argmax_kernel,
    ops.MaxPool2dScan: pool_indices.max_pool2d_scan_kernel,
    ops.MaxPool2dTake: pool_indices.max_pool2d_take_kernel,
    ops.MaxPool2dBackwardIndices: pool_indices.max_pool2d_backward_indices_kernel,
}

#: abstract op type -> node kernel ``kernel(ctx, op, *arrays)``; the argmax slot and the
#: ReLU gradient's sums slot only allocate (no kernel to specialize or vectorise: no variants);
#: the ReLU gradient that fills its sums takes its fused kernels where the arrays allow
#: (``colsum_relu.declines``), else the ReLU gradient and the bias gradient's column sums
NODE_KERNELS = {**POOL_KERNELS, ops.Zeros: zeros_node,
                ops.MaxPool2dArgmaxSlot: pool_indices.max_pool2d_argmax_slot_kernel,
                ops.ReluBackwardSumsSlot: colsum_relu.relu_backward_sums_slot_kernel,
                ops.ReluBackwardSums: colsum_relu.relu_backward_sums_kernel}

#: abstract op type -> CuPy kernel ``fn(xp, *arrays, **op.params())``.
CUDA_KERNELS = {
    ops.Relu: relu.relu,
    ops.ReluBackward: relu.relu_backward,
    ops.Threshold: relu.threshold,
    ops.ThresholdBackward: relu.threshold_backward,
    ops.BiasAddBackward: colsum.bias_add_backward,
    ops.LocalResponseNorm: lrn.local_response_norm,
    ops.LocalResponseNormBackward: lrn.local_response_norm_backward,
    ops.Softmax: loss.softmax,
    ops.SoftmaxBackward: loss.softmax_backward,
    ops.LogSoftmax: loss.log_softmax,
    ops.LogSoftmaxBackward: loss.log_softmax_backward,
    ops.CrossEntropy: loss.cross_entropy,
    ops.CrossEntropyBackward: loss.cross_entropy_backward,
    ops.Constant: movement.constant,
}

_FLOATS = ("float16", "bfloat16", "float32", "float64")

#: Ops whose kernels take ``specialize`` (geometry compiled in: :mod:`.pool`).
SPECIALIZABLE = tuple(POOL_KERNELS)


#: Ops with the channels-last vector path (:mod:`.pool_vector`).
VECTOR_POOLS = (ops.MaxPool2d, ops.MaxPool2dBackward, ops.MaxPool2dBackwardRelu, ops.AvgPool2d,
                ops.AvgPool2dBackward, ops.MaxPool2dArgmax, ops.MaxPool2dScan, ops.MaxPool2dTake,
                ops.MaxPool2dBackwardIndices)
#: The most window cells of the vector kernels that index each window's winner in a byte
INDEXED_CELLS = {ops.MaxPool2dBackward: pool_vector.MAX_CELLS, ops.MaxPool2dBackwardRelu: pool_vector.MASKED,
                 ops.MaxPool2dArgmax: pool_vector.MASKED, ops.MaxPool2dScan: pool_vector.MASKED,
                 ops.MaxPool2dTake: pool_vector.MASKED,
                 ops.MaxPool2dBackwardIndices: pool_vector.MASKED}
#: Of them, those whose vector kernels scan max-pool windows (the ``pixels`` option)
MAX_POOLS = (ops.MaxPool2d, ops.MaxPool2dBackward, ops.MaxPool2dBackwardRelu, ops.MaxPool2dArgmax,
             ops.MaxPool2dScan)
#: Of them, those with a bfloat16 window scan, take or gather from shared-memory tiles
#: (the ``tile`` option: ``pool_vector.tile_declines``)
TILED_POOLS = tuple(INDEXED_CELLS)


def pool_variants(op, in_types, device):
    """Two autotune candidates: geometry as kernel arguments (the default) or
    compiled in as constants."""
    return [{}, {"specialize": True}]


def vector_pool_variants(op, in_types, device):
    """:func:`pool_variants`, and for channels-last bfloat16 or float32 whose
    channels fill 16-byte words the ``vector`` kernels (:mod:`.pool_vector`;
    they still fall back where a call's operands do not qualify, e.g. an
    unaligned channel slice): for max pools' window scans also 2 and 4 output
    columns per thread (``pixels``), and for the bfloat16 scan, take and gather
    the shared-memory ``tile`` variant where ``pool_vector.tile_declines`` gives
    no reason (windows and strides up to ``TILE_WINDOW``). The autotune cache keys a decision by its
    variant functions' names and revisions (``autotune.candidate_set``): this
    name is not :func:`pool_variants`', so decisions taken before the vector
    kernels existed are tuned again, and its ``revision`` (below) does the
    same when the vector kernels change."""
    out = pool_variants(op, in_types, device)
    if _vector_types(op, in_types):
        out.append({"vector": True})
        if type(op) in MAX_POOLS:  # their window scans: several output columns per thread
            out += [{"vector": True, "pixels": n} for n in pool_vector.PIXELS if n != 1]
        dtype = next(t.dtype for t in in_types if t.dtype not in INDEX_DTYPES)
        if type(op) in TILED_POOLS and pool_vector.tile_declines(dtype, op.kernel_size, op.stride) is None:
            out.append({"vector": True, "tile": True})  # the bfloat16 scan, take and gather from shared memory
    return out


#: part of the autotune cache key (``autotune_contenders._stable_name``): the vector kernels'
#: revision (3: the max-pool scans' ``pixels``; 9: the ``tile`` variant; 10: its take), so decisions
#: tuned against older ones are tuned again; and the source fingerprint of every pooling kernel
#: (``kernel_sources``), so an edit of their text re-tunes them without a revision bump
vector_pool_variants.revision = pool_vector.REVISION
vector_pool_variants.fingerprint = fingerprinted(pool, pool_indices)
pool_variants.fingerprint = fingerprinted(pool)


def _vector_types(op, in_types) -> bool:
    """Whether ``in_types`` are channels-last 4-D values the vector kernels take
    (``pool_vector.declines``; the call's own strides are checked when it runs);
    saved window indices (uint8) are read beside values of another dtype."""
    values = [t for t in in_types if t.dtype not in INDEX_DTYPES]
    if not values:
        return False
    x = values[0]
    return (all(t.layout == "NHWC" and len(t.shape) == 4 for t in in_types)
            and all(t.dtype == x.dtype for t in values)
            and pool_vector.declines(x.dtype, x.shape[1], op.kernel_size, INDEXED_CELLS.get(type(op))) is None)


def bias_variants(op, in_types, device):
    """Autotune candidates of the bias gradient: for a channels-last 4-D
    gradient our column-sum kernel (the default, capturable into a CUDA graph),
    the same sums with 16-byte loads (``method='vector'``, capturable; where its
    dtype and channel count allow: ``colsum_vector.LANES``) and the cuBLAS
    matrix-vector product (``method='gemv'``, not capturable:
    :data:`VARIANT_CAPTURE_BLOCKERS`); otherwise one, as every method runs the
    same NCHW code."""
    t = in_types[0] if in_types else None
    if t is not None and t.ndim == 4 and t.layout == "NHWC":
        lanes = colsum_vector.LANES.get(t.dtype)
        vector = [{"method": "vector"}] if lanes and t.shape[1] % lanes == 0 else []
        return [{}, *vector, {"method": "gemv"}]
    return [{}]


#: part of the autotune cache key: the ``vector`` kernels' revision (1: ``method='vector'``
#: added), so decisions tuned without it, or against an older one, are tuned again
bias_variants.revision = colsum_vector.REVISION
bias_variants.fingerprint = fingerprinted(colsum, colsum_vector)


#: op type -> (kernel options an autotune variant may set, its ``variants``).
OPTIONS = {**{op_type: (("specialize", "vector") + (("pixels",) if op_type in MAX_POOLS else ())
                        + (("tile",) if op_type in TILED_POOLS else ()),
                        vector_pool_variants) if op_type in VECTOR_POOLS
              else (("specialize",), pool_variants) for op_type in SPECIALIZABLE},
           ops.BiasAddBackward: (("method",), bias_variants)}


#: op type -> the modules its kernel comes from, for the ``fingerprint`` of a rule with no variants
#: of its own (``kernel_sources.one_variant``): the module defining its kernel function, but for
#: ``Zeros`` (:func:`zeros_node`, defined here, runs ``codegen.movement.zeros``); those of
#: :data:`OPTIONS` carry their variants function's fingerprint instead
KERNEL_MODULES = {**{t: (fn.__module__,) for t, fn in {**NODE_KERNELS, **CUDA_KERNELS}.items()},
                  ops.Zeros: (movement.__name__,)}


#: op type -> its rule's ``variant_capture_blocker``: the kernel options that
#: call a library refusing CUDA-graph capture (the bias gradient's
#: ``method='gemv'``), so that autotune leaves them out of a replayed step.
VARIANT_CAPTURE_BLOCKERS = {ops.BiasAddBackward: colsum.method_capture_blocker}


def check(op, in_types, device):
    """Our kernels take float16, bfloat16, float32 and float64 (float16 and
    bfloat16 compute in float32; bfloat16 is loaded and stored inside the
    kernels); integer inputs (cross-entropy targets) are not checked here."""
    bad = sorted({t.dtype for t in in_types
                  if t.dtype not in _FLOATS and not t.dtype.startswith(("int", "uint"))})
    if bad:
        return f"the CuPy kernels take {', '.join(_FLOATS)}; got {', '.join(bad)}"
    return None


#: op type -> the input its kernel may write its output into (``out=``,
#: ``Rule.inplace``): ReLU into x, its gradient into gy, and so the gradient that also fills its
#: sums (into gy, never into input 2, the slot it fills: a (C,) buffer of another type anyway)
INPLACE = {ops.Relu: 0, ops.ReluBackward: 1, ops.ReluBackwardSums: 1}


def _relu_backward_sums_check(op, in_types, device):
    """The dtype check, then ``colsum_relu.declines_types``: where the fused path can never run,
    the fuse pass keeps the ReLU gradient and the bias gradient apart (``relu-bias-sums``)."""
    return check(op, in_types, device) or colsum_relu.declines_types(*in_types[:2])


#: op type -> its rule's ``check`` where it is not :func:`check`
CHECKS = {ops.ReluBackwardSums: _relu_backward_sums_check}

#: op type -> its rule's ``workspace`` (scratch bytes of one call) where the kernel allocates
#: temporaries beside its output: the one-scan pooling's scalar path (float16 in float32, and
#: the winners of a slot not dense in x's storage order: ``pool_indices.scan_workspace``)
WORKSPACES = {ops.MaxPool2dScan: pool_indices.scan_workspace}


def register_rules() -> None:
    """Register one ``cuda`` rule per entry of :data:`NODE_KERNELS` and
    :data:`CUDA_KERNELS` (idempotent). Every kernel returns a new array, never
    a view of an input (``fresh_output``); ReLU and its gradients may run in
    place (:data:`INPLACE`). Every kernel is capturable into a CUDA graph: its
    constants are launch arguments or fill kernels, a ``Constant`` is uploaded
    once in its first (uncaptured) run, nothing synchronises; but for the
    variants of :data:`VARIANT_CAPTURE_BLOCKERS` (cuBLAS on CuPy's handle). Every rule's
    variants function carries the fingerprint of its kernels' code into the autotune cache key
    (``kernel_sources``): its own (:data:`OPTIONS`), else one variant over
    :data:`KERNEL_MODULES`."""
    kernels = dict(NODE_KERNELS)
    kernels.update((t, params_kernel(fn, "cuda", OPTIONS.get(t, ((), None))[0])) for t, fn in CUDA_KERNELS.items())
    for op_type, kernel in kernels.items():
        variants = OPTIONS.get(op_type, ((), None))[1] or one_variant(*KERNEL_MODULES[op_type])
        blocker = VARIANT_CAPTURE_BLOCKERS.get(op_type)
        register(Rule(op_type, "cuda", kernel, devices={"cuda"}, check=CHECKS.get(op_type, check),
                      tags={"cuda", "gpu"}, inplace=INPLACE.get(op_type), fresh_output=True, capturable=True,
                      variants=variants,
                      **({"workspace": WORKSPACES[op_type]} if op_type in WORKSPACES else {}),
                      **({"variant_capture_blocker": blocker} if blocker else {})))
    # a candidate beside cuDNN's engines for the stride-1 depthwise forward (the same gather, mirrored taps;
    # the engines cuDNN built for ConvNeXt's biased 7x7 layers ran at 1.1-1.2 % of the copy bandwidth:
    # depthwise_forward's docstring)
    register(Rule(ops.Conv2d, "cuda", depthwise_forward.conv2d_kernel, devices={"cuda"},
                  check=depthwise_forward.check, variants=depthwise_forward.variants,
                  tags={"cuda", "gpu", "depthwise-fprop"},
                  fresh_output=True, capturable=True))
    # a candidate beside cuDNN's engines for depthwise backward-data (it declines every other convolution);
    # its variants (thread tiles) carry the kernels' revision into the autotune cache key
    register(Rule(ops.Conv2dBackwardData, "cuda", depthwise.conv2d_backward_data_kernel, devices={"cuda"},
                  check=depthwise.check, variants=depthwise.variants, tags={"cuda", "gpu"}, fresh_output=True,
                  capturable=True))
    # the same for depthwise backward-filter (two deterministic passes, no atomics; tag depthwise-wgrad)
    register(Rule(ops.Conv2dBackwardFilter, "cuda", depthwise_filter.conv2d_backward_filter_kernel,
                  devices={"cuda"}, check=depthwise_filter.check, variants=depthwise_filter.variants,
                  tags={"cuda", "gpu", "depthwise-wgrad"}, fresh_output=True, capturable=True))
    # few input channels (an ImageNet stem): unfolded and multiplied on cuBLAS, beside cuDNN's engines,
    # which need 16-byte channel rows; forward (bias and ReLU / ReLU6 included) and backward-filter
    # (no backward-data: a stem's input needs no gradient, and cuDNN's dgrad writes C-channel rows)
    # (tag im2col, as the gemm lowering: exclude=['im2col'] leaves no unfolding lowering)
    for op_type, kernel in ((ops.Conv2d, unfold.forward_kernel), (ops.Conv2dBiasRelu, unfold.forward_kernel),
                            (ops.Conv2dBiasActivation, unfold.forward_kernel),
                            (ops.Conv2dBackwardFilter, unfold.backward_filter_kernel)):
        register(Rule(op_type, "unfold", kernel, devices={"cuda"}, check=unfold.check, variants=unfold.variants,
                      workspace=unfold.workspace, tags={"unfold", "im2col", "cublas", "gpu", "option:precision"},
                      fresh_output=True, capturable=True, capture_requires=capture_requirement))


register_rules()

__all__ = ["CUDA_KERNELS", "NODE_KERNELS", "KERNEL_MODULES", "INPLACE", "WORKSPACES", "INDEXED_CELLS", "OPTIONS", "SPECIALIZABLE",
           "VARIANT_CAPTURE_BLOCKERS", "VECTOR_POOLS", "MAX_POOLS", "TILED_POOLS", "bias_variants", "check", "vector_pool_variants",
           "pool_variants", "register_rules"]
