"""Generated strided copies (concat, slice, pad, their gradients, reshapes,
transposes, zeros) run on the CPU through the g++ emulator, against the
reference kernels (bit for bit: copies move bits), in both layouts and in
float32, bfloat16 and float16; 16-byte words where the views allow them,
one element otherwise; reshapes of C-ordered arrays are views."""

from __future__ import annotations

import numpy as np
import pytest

from codegen_cases import channels_last
from codegen_emulated import emu, needs_gxx, seeded  # noqa: F401  (emu: fixture)
from opgraph import ops
from opgraph.backends.cuda.codegen import copies
from opgraph.backends.registry import KernelContext, rules_for
from opgraph.types import TensorType, is_channels_last, numpy_dtype

pytestmark = needs_gxx


def _x(shape, dtype, layout, seed=0):
    a = seeded(seed, shape).standard_normal(shape).astype(numpy_dtype(dtype))
    return channels_last(a) if layout == "NHWC" else a


def _both(op, arrays, layout):
    """The ``codegen`` and ``reference`` results of ``op``; the generated one
    in ``layout`` for a 4-D output."""
    types = [TensorType(a.shape, a.dtype.name) for a in arrays]
    t = op.infer(*types)
    t = TensorType(t.shape, t.dtype, layout if len(t.shape) == 4 else None)
    got = rules_for(type(op))["codegen"].kernel(KernelContext(np, "cuda", {}, t), op, *arrays)
    want = rules_for(type(op))["reference"].kernel(KernelContext(np), op, *arrays)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(_bits(got), _bits(want))
    return got


def _bits(a):
    return np.asarray(a).view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize])


def _words(emu) -> bool:
    return "typedef uint4 ELEM;" in emu.raw_launches[-1]["source"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_concat_slice_and_the_slice_gradient(emu, dtype, layout):
    xs = [_x((2, c, 5, 6), dtype, layout, c) for c in (8, 16, 24)]
    y = _both(ops.Concat(axis=1), xs, layout)
    assert is_channels_last(y) == (layout == "NHWC")
    if layout == "NHWC":
        assert _words(emu)  # channel runs of 8 bfloat16 / float16 elements or 4 float32 ones
    s = _both(ops.Slice(axis=1, start=8, stop=24), [y], layout)
    np.testing.assert_array_equal(np.asarray(s, np.float64), np.asarray(xs[1], np.float64))
    _both(ops.SliceBackward(axis=1, start=8, stop=24, input_shape=y.shape), [s], layout)
    _both(ops.Slice(axis=3, start=1, stop=4), [y], layout)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_odd_channel_counts_copy_element_by_element(emu, layout):
    xs = [_x((2, c, 3, 3), "bfloat16", layout, c) for c in (3, 5)]
    _both(ops.Concat(axis=1), xs, layout)
    assert not _words(emu)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_pad_with_minus_infinity_and_its_gradient(emu, dtype, layout):
    x = _x((2, 3, 4, 5), dtype, layout)
    padding = ((1, 2), (0, 3))
    y = _both(ops.Pad(padding=padding, value=float("-inf")), [x], layout)
    assert np.isneginf(np.asarray(y, np.float64)[:, :, 0]).all()
    _both(ops.PadBackward(padding=padding), [y], layout)


def test_reshape_is_a_view_of_a_c_ordered_array_and_a_copy_of_a_channels_last_one(emu):
    x = _x((2, 8, 3, 4), "bfloat16", "NCHW")
    y = _both(ops.Flatten(start_dim=1), [x], "NCHW")
    assert np.shares_memory(y, x) and emu.raw_launches == []
    assert rules_for(ops.Reshape)["codegen"].fresh_output is False
    z = _both(ops.Reshape(shape=(2, 96)), [channels_last(x)], "NCHW")
    assert not np.shares_memory(z, x) and len(emu.raw_launches) == 1
    _both(ops.Transpose(perm=(0, 2, 3, 1)), [x], "NCHW")


def test_zeros_in_either_layout(emu):
    t = TensorType((2, 3, 4, 5), "bfloat16")
    rule = rules_for(ops.Zeros)["cuda"]
    for layout in ("NCHW", "NHWC"):
        z = rule.kernel(KernelContext(np, "cuda", {}, TensorType(t.shape, t.dtype, layout)), ops.Zeros(type=t))
        assert z.dtype.name == "bfloat16" and not np.asarray(z, np.float32).any()


def test_collapse_merges_contiguous_unbounded_axes():
    # an NHWC channel slice (N, H, W, 8 of 24): N, H, W merge into rows
    dims, ds, ss, lo, bounded = copies.collapse([2, 5, 6, 8], [720, 144, 24, 1], [240, 48, 8, 1], [0] * 4,
                                                [False] * 4)
    assert (dims, ds, ss) == ([60, 8], [24, 1], [8, 1])
    assert copies.collapse([4, 6], [6, 1], [6, 1], [0, 1], [False, True])[0] == [4, 6]  # bounded: kept apart
