"""Layer normalisation's and the leading-axis sums' kernel cases, shared by the
emulated tests (``tests/backends/test_codegen_layer_norm.py``) and the GPU ones
(``tests/gpu/test_layer_norm_gpu.py``): the same shapes, ops and operands on both."""

from __future__ import annotations

from opgraph import ops
from opgraph.types import numpy_dtype

from codegen_cases import channels_last

#: (x's shape, k = len(normalized_shape)): rows R and row length K of each
#: kind: K a multiple of 8 (vector rows), K odd and R not a multiple of a block's
#: rows, two normalised axes, one row, K = 1, a 4-D ConvNeXt-like value
SHAPES = [((3, 7, 24), 1), ((37, 5), 1), ((5, 3, 6, 10), 2), ((1, 40), 1), ((6, 1), 1), ((2, 3, 4, 16), 1)]
DTYPES = ["float32", "bfloat16", "float16"]

#: (op type, input kinds): each with and without its optional weight / bias
LAYER_NORM_CASES = [(ops.LayerNorm, "x"), (ops.LayerNorm, "xw"), (ops.LayerNorm, "xwb"),
                    (ops.LayerNormBackwardData, "gx"), (ops.LayerNormBackwardData, "gxw"),
                    (ops.LayerNormBackwardScale, "xg"),
                    (ops.LayerNormDoubleBackward, "ggx"), (ops.LayerNormDoubleBackward, "ggxw")]

#: (x's shape, SumTo's target): sums over the leading axes (the ``col`` target)
SUM_SHAPES = [((3, 7, 24), (24,)), ((37, 5), (5,)), ((5, 3, 6, 10), (6, 10)), ((2, 3, 4, 16), (16,)),
              ((2, 3, 4, 16), (1, 4, 16)), ((2, 1, 1, 40), (40,)), ((6, 1, 1), (1, 1)), ((1, 1, 9, 8), (8,))]


def shape_ids(shapes):
    return [f"{'x'.join(map(str, s))}-k{k}" for s, k in shapes]


def case_ids(cases):
    return [f"{t.__name__}-{k}" for t, k in cases]


def layout_of(shape, k: int = 1) -> str | None:
    """Channels-last for a 4-D value normalised over its last axis (ConvNeXt's
    permuted values under the NHWC layout), else the array's own order."""
    return "NHWC" if len(shape) == 4 and k == 1 else None


def array(rng, shape, dtype, offset=0.0, layout=None):
    a = (rng.standard_normal(shape) + offset).astype(numpy_dtype(dtype))
    return channels_last(a) if layout == "NHWC" and a.ndim == 4 else a


def inputs(rng, kinds, shape, k, dtype, layout=None):
    """Operands by kind: ``x`` (full, offset 3: the shift matters), ``g`` (full),
    ``w`` (normalized_shape, around 1), ``b`` (normalized_shape)."""
    ns = shape[len(shape) - k:]
    made = {"x": lambda: array(rng, shape, dtype, 3.0, layout), "g": lambda: array(rng, shape, dtype, 0.0, layout),
            "w": lambda: array(rng, ns, dtype, 1.0), "b": lambda: array(rng, ns, dtype)}
    return [made[kind]() for kind in kinds]
