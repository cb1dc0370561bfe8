"""Test helpers for the ONNX importer (a test utility, not library code).

``model(...)`` builds a small ONNX model with ``onnx.helper``; the graph
outputs get their shapes from a first run of ``onnx.reference.ReferenceEvaluator``
(the spec's own reference) so that ``onnx.checker`` accepts the model. The
reference's LRN is replaced by one written from the spec (see :class:`LRN`).
``compare(...)`` imports the model, runs it with opgraph under each lowering
the pass layer offers, and checks each output against the reference by the
relative error ``||out - ref|| / ||ref||`` of SEMANTICS.md (Numbers).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

import opgraph as og
import opgraph.onnx as oxi

#: relative-error bounds of SEMANTICS.md for float32: direct/GEMM, FFT/Winograd.
TOL = {"default": 1e-4, "direct": 1e-4, "gemm": 1e-4, "fft": 1e-3, "winograd": 1e-3}
ELEM = {np.dtype("float32"): TensorProto.FLOAT, np.dtype("float64"): TensorProto.DOUBLE,
        np.dtype("int64"): TensorProto.INT64, np.dtype("float16"): TensorProto.FLOAT16}


def rng(seed=0):
    return np.random.default_rng(seed)


class LRN(OpRun):
    """ONNX LRN written from the operator spec's formula, replacing onnx 1.23's
    reference, which loops over ``x.shape[0]`` (the batch) where the spec sums
    over channels (right only when N == C)::

        square_sum[n, c] = sum(x[n, i]^2), max(0, c - floor((size-1)/2))
                           <= i <= min(C-1, c + ceil((size-1)/2))
        y = x / (bias + alpha / size * square_sum)^beta
    """

    op_domain = ""

    def _run(self, x, alpha=None, beta=None, bias=None, size=None):
        xd = x.astype(np.float64)
        square_sum = np.zeros_like(xd)
        channels = x.shape[1]
        for c in range(channels):
            lo, hi = max(0, c - (size - 1) // 2), min(channels - 1, c + size // 2)
            square_sum[:, c] = np.sum(xd[:, lo:hi + 1] ** 2, axis=1)
        return ((xd / (bias + alpha / size * square_sum) ** beta).astype(x.dtype),)


def evaluator(m, spec_lrn: bool = True) -> ReferenceEvaluator:
    """The ONNX reference of ``m`` (with the spec-faithful :class:`LRN` unless told not to)."""
    return ReferenceEvaluator(m, new_ops=[LRN] if spec_lrn else None)


def randn(*shape, seed=0, dtype=np.float32):
    return rng(seed).standard_normal(shape).astype(dtype)


def model(nodes, inputs: dict, outputs, initializers: dict | None = None, opset: int = 17,
          input_dims: dict | None = None, check: bool = True, output_shapes: dict | None = None):
    """An ONNX model of ``nodes``.

    Args:
        inputs: name -> example array (its dtype and shape declare the input;
            ``input_dims[name]`` overrides the declared dims, e.g. ``['N', 3]``).
        outputs: output tensor names.
        initializers: name -> array.
        check: run ``onnx.checker.check_model`` on the result.
        output_shapes: name -> shape of each output (float32), for models the
            reference cannot run; by default the reference run gives them.
    """
    initializers = initializers or {}
    input_dims = input_dims or {}
    vis = [helper.make_tensor_value_info(n, ELEM[np.asarray(a).dtype], input_dims.get(n, list(np.shape(a))))
           for n, a in inputs.items()]
    inits = [numpy_helper.from_array(np.asarray(a), n) for n, a in initializers.items()]

    def build(outs):
        g = helper.make_graph(nodes, "test", vis, outs, initializer=inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])

    if output_shapes is not None:
        ref = [np.zeros(output_shapes[n], np.float32) for n in outputs]
    else:
        untyped = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs]
        ref = evaluator(build(untyped)).run(None, dict(inputs))
    typed = [helper.make_tensor_value_info(n, ELEM[np.asarray(r).dtype], list(np.shape(r)))
             for n, r in zip(outputs, ref)]
    m = build(typed)
    if check:
        onnx.checker.check_model(m)
    return m


def reference(m, feeds: dict, spec_lrn: bool = True) -> list[np.ndarray]:
    """The ONNX reference outputs of ``m`` (see :func:`evaluator`)."""
    return [np.asarray(r) for r in evaluator(m, spec_lrn).run(None, dict(feeds))]


def lowerings():
    """``(name, policy)`` for the default compile and each convolution algorithm
    the pass layer offers (only the default until ``opgraph.passes.policy`` exists)."""
    out = [("default", None)]
    try:
        from opgraph.passes.policy import LoweringPolicy
    except ImportError:
        return out
    return out + [(alg, LoweringPolicy(prefer={"conv": [alg]})) for alg in ("direct", "gemm", "fft", "winograd")]


def run(m, feeds: dict, batch=None, policy=None, dtype=None) -> list[np.ndarray]:
    """Import ``m`` and run it with opgraph on the CPU."""
    _, _, outs = oxi.load(m, batch=batch)
    return [np.asarray(o) for o in og.compile(outs, policy=policy, dtype=dtype)(**feeds)]


def rel_error(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"shape {got.shape} != reference {want.shape}"
    assert not np.isnan(got).any() or np.isnan(want).any(), "NaN in the output"
    den = np.linalg.norm(want)
    return float(np.linalg.norm(got - want) / (den if den > 0 else 1.0))


def compare(m, feeds: dict, *, tol: float | None = None, all_lowerings: bool = False, batch=None,
            spec_lrn: bool = True):
    """Check opgraph's outputs of ``m`` against the ONNX reference.

    ``all_lowerings`` repeats the check under each lowering of :func:`lowerings`
    with that lowering's tolerance; otherwise the default compile with ``tol``
    (default 1e-5: a single op in float32).
    """
    want = reference(m, feeds, spec_lrn)
    for name, policy in (lowerings() if all_lowerings else [("default", None)]):
        bound = TOL[name] if all_lowerings else (1e-5 if tol is None else tol)
        got = run(m, feeds, batch=batch, policy=policy)
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            err = rel_error(g, w)
            assert err <= bound, f"output {i} under {name}: relative error {err:.3g} > {bound}"
    return want


def single(op_type, x, initializers=None, extra_inputs=(), opset=17, y_shape=None, **attrs):
    """A one-node model ``y = op_type(x, *extra_inputs)`` with input ``x``
    (``y_shape``: the output shape, where the reference cannot run the node)."""
    node = helper.make_node(op_type, ["x", *extra_inputs], ["y"], name="n0", **attrs)
    return model([node], {"x": x}, ["y"], initializers, opset=opset,
                 output_shapes=None if y_shape is None else {"y": y_shape})
