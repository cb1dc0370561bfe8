"""``Slice`` and ``Split`` imported from small ONNX models and compared with
``onnx.reference.ReferenceEvaluator``: negative and out-of-range bounds, axes
and steps as the spec clamps them, each operator version, folded constants."""

import numpy as np
import pytest

pytest.importorskip("onnx.reference")

from onnx import helper, numpy_helper  # noqa: E402

from onnxcheck import compare, model, randn  # noqa: E402

import opgraph.onnx as oxi  # noqa: E402

BIG = np.iinfo(np.int64).max

#: (starts, ends, axes, steps) on a (4, 5, 6) input; axes/steps None: absent.
SLICES = [([1], [3], None, None), ([0, 1], [2, -1], [0, 2], None), ([-3], [BIG], [-1], None),
          ([-100], [2], [1], None), ([2], [2], [1], [1]), ([4], [1], [2], [1]), ([1, 0, 2], [3, 5, 5], None, None)]


def slice_model(x, starts, ends, axes, steps, opset):
    if opset < 10:
        attrs = dict(starts=starts, ends=ends, **({} if axes is None else {"axes": axes}))
        return model([helper.make_node("Slice", ["x"], ["y"], name="s", **attrs)], {"x": x}, ["y"], opset=opset)
    inits = {"starts": np.array(starts, np.int64), "ends": np.array(ends, np.int64)}
    names = ["x", "starts", "ends"]
    for key, value in (("axes", axes), ("steps", steps)):
        if value is not None:
            inits[key] = np.array(value, np.int64)
            names.append(key)
        elif key == "axes" and steps is not None:
            names.append("")
    return model([helper.make_node("Slice", names, ["y"], name="s")], {"x": x}, ["y"], inits, opset=opset)


@pytest.mark.parametrize("starts,ends,axes,steps", SLICES)
@pytest.mark.parametrize("opset", [1, 10, 11, 13])
def test_slice_of_a_computed_tensor(starts, ends, axes, steps, opset):
    if opset < 10 and (steps is not None or any(a < 0 for a in axes or [])):
        pytest.skip("version 1 has no steps and no negative axes")
    x = randn(4, 5, 6)
    compare(slice_model(x, starts, ends, axes, steps, opset), {"x": x}, tol=0.0)


@pytest.mark.parametrize("starts,ends,steps", [([5], [-BIG], [-1]), ([-1], [0], [-2]), ([0], [6], [2]),
                                               ([-100], [100], [3]), ([100], [-100], [-1])])
def test_strided_slice_of_a_constant_folds(starts, ends, steps):
    """Any step on import-time values (a Constant), clamped as the spec says."""
    c = np.arange(6, dtype=np.float32) * 1.5
    nodes = [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(c)),
             helper.make_node("Slice", ["c", "starts", "ends", "axes", "steps"], ["s"]),
             helper.make_node("Mul", ["x", "s"], ["y"])]
    inits = {"starts": np.array(starts, np.int64), "ends": np.array(ends, np.int64),
             "axes": np.array([0], np.int64), "steps": np.array(steps, np.int64)}
    x = randn(2, 1)  # broadcasts against the slice, whatever its length
    compare(model(nodes, {"x": x}, ["y"], inits), {"x": x}, tol=0.0)


def test_slice_errors_name_the_node():
    x = randn(4, 5, 6)
    with pytest.raises(oxi.OnnxImportError, match="ONNX node 's' \\(Slice\\): step 2 on axis 1"):
        oxi.load(slice_model(x, [0], [5], [1], [2], 13))
    m = model([helper.make_node("Slice", ["x", "b", "e"], ["y"], name="s")],
              {"x": x, "b": np.array([0], np.int64), "e": np.array([1], np.int64)}, ["y"])
    with pytest.raises(oxi.OnnxImportError, match="input 1 \\(starts\\) must be a constant"):
        oxi.load(m)


@pytest.mark.parametrize("opset,axis,split,outputs", [
    (2, 1, [2, 3], 2), (11, -1, [1, 1, 4], 3), (11, 0, None, 2), (13, 1, [0, 5], 2), (13, 2, None, 3),
    (18, 2, None, 4), (18, 1, [1, 4], 2)])
def test_split(opset, axis, split, outputs):
    x = randn(4, 5, 6)
    outs = [f"y{i}" for i in range(outputs)]
    attrs = {"axis": axis}
    ins, inits = ["x"], None
    if split is not None and opset < 13:
        attrs["split"] = split
    elif split is not None:
        ins, inits = ["x", "split"], {"split": np.array(split, np.int64)}
    elif opset >= 18:
        attrs["num_outputs"] = outputs  # 6 into 4 parts: ceil(6 / 4) = 2 each, the last 0
    m = model([helper.make_node("Split", ins, outs, name="sp", **attrs)], {"x": x}, outs, inits, opset=opset,
              check=False)
    compare(m, {"x": x}, tol=0.0)


def test_split_errors_name_the_node():
    x = randn(4, 5)
    m = model([helper.make_node("Split", ["x"], ["a", "b"], name="sp", axis=1)], {"x": x}, ["a", "b"],
              opset=13, check=False, output_shapes={"a": (4, 2), "b": (4, 3)})
    with pytest.raises(oxi.OnnxImportError, match="ONNX node 'sp' \\(Split\\): an extent of 5 does not split"):
        oxi.load(m)
