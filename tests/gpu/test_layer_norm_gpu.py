"""Layer normalisation's generated kernels and the sums over leading axes
(``backends/cuda/codegen/layer_norm.py``, the ``row`` / ``col`` targets) on the GPU,
against the float64 reference on the same stored inputs: the emulated tests'
cases (``tests/layer_norm_cases.py``) in fp32, bf16 and fp16, then ConvNeXt's
sizes (stage one's 56x56 rows of 96, its 384-wide MLP's bias sums). Nothing is timed here."""

from __future__ import annotations

import pytest

from opgraph import ops
from opgraph.backends.device import cuda_status
from opgraph.backends.registry import KernelContext, rules_for
from opgraph.types import TensorType, storage_order

from codegen_cases import TOLERANCE, reference, rel_err
from layer_norm_cases import (DTYPES, LAYER_NORM_CASES, SHAPES, SUM_SHAPES, case_ids, inputs, layout_of,
                              shape_ids)
from test_codegen_gpu import dev, host

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_status()[0], reason=f"no GPU: {cuda_status()[1]}")]


def check(cp, op, arrays, dtype):
    """``op``'s ``codegen`` kernel on the device copies of host ``arrays``, within the tolerance."""
    types = tuple(TensorType(a.shape, a.dtype.name, storage_order(a)) for a in arrays)
    rule = rules_for(type(op))["codegen"]
    assert rule.check(op, types, "cuda") is None
    t = op.infer(*types)
    got = rule.kernel(KernelContext(cp, "cuda", {}, t), op, *(dev(cp, a) for a in arrays))
    assert got.dtype.name == dtype and tuple(got.shape) == t.shape
    err = rel_err(host(cp, got), reference(op, arrays))
    assert err < TOLERANCE[dtype], (op, [a.shape for a in arrays], dtype, err)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,k", SHAPES, ids=shape_ids(SHAPES))
@pytest.mark.parametrize("op_type,kinds", LAYER_NORM_CASES, ids=case_ids(LAYER_NORM_CASES))
def test_layer_norm_ops(cp, rng, op_type, kinds, shape, k, dtype):
    op = op_type(normalized_shape=shape[len(shape) - k:], eps=1e-5)
    check(cp, op, inputs(rng, kinds, shape, k, dtype, layout_of(shape, k)), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,to", SUM_SHAPES, ids=[f"{s}->{t}" for s, t in SUM_SHAPES])
def test_sums_over_the_leading_axes(cp, rng, shape, to, dtype):
    check(cp, ops.SumTo(shape=to), inputs(rng, "g", shape, 1, dtype, layout_of(shape)), dtype)


@pytest.mark.parametrize("op_type,kinds", LAYER_NORM_CASES[2:6], ids=case_ids(LAYER_NORM_CASES[2:6]))
def test_convnext_stage_one_sizes(cp, rng, op_type, kinds):
    """Batch 8 of ConvNeXt-tiny's first stage, permuted channels-last: 25,088 rows of 96."""
    shape = (8, 56, 56, 96)
    check(cp, op_type(normalized_shape=(96,), eps=1e-6), inputs(rng, kinds, shape, 1, "bfloat16", "NHWC"),
          "bfloat16")


def test_convnext_mlp_bias_sums(cp, rng):
    """Stage one's 384-wide hidden layer's bias gradient: 25,088 rows summed per column, in bf16."""
    check(cp, ops.SumTo(shape=(384,)), inputs(rng, "g", (8, 56, 56, 384), 1, "bfloat16", "NHWC"), "bfloat16")


def test_float64_storage(cp, rng):
    op = ops.LayerNormBackwardData(normalized_shape=(16,))
    check(cp, op, inputs(rng, "gxw", (4, 3, 16), 1, "float64"), "float64")
