"""Reading a model: an empty, truncated or corrupt file is an error that names
the file and says what is wrong, never a confusing error about its contents
(issue 17: an empty file said "the model imports no opset of the default ONNX
domain")."""

from pathlib import Path

import pytest

pytest.importorskip("onnx")

from onnx import helper  # noqa: E402

import opgraph.onnx as oxi  # noqa: E402

RESNET18 = Path(__file__).parent / "models" / "resnet18.onnx"


def load_error(source) -> str:
    with pytest.raises(oxi.OnnxImportError) as e:
        oxi.load(source, inputs=["x"])
    return str(e.value)


def test_empty_file_names_the_file_and_says_it_is_empty(tmp_path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    msg = load_error(path)
    assert f"ONNX file {str(path)!r} is empty (0 bytes)" in msg and "opset" not in msg
    assert "the byte string given is empty" in load_error(b"")


@pytest.mark.parametrize("fraction", [0.001, 0.01, 0.1, 0.5, 0.9, 0.999])
def test_truncated_file_names_the_file(tmp_path, fraction):
    data = RESNET18.read_bytes()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[:max(1, int(len(data) * fraction))])
    msg = load_error(path)
    assert msg.startswith(f"ONNX file {str(path)!r}"), msg


def test_corrupt_and_graphless_files(tmp_path):
    path = tmp_path / "junk.onnx"
    path.write_bytes(b"\x08\x07 this is not protobuf \xff\xff\xff")
    assert "is not a valid ONNX model, corrupt or truncated" in load_error(path)
    path.write_bytes(helper.make_model(helper.make_graph([], "g", [], [])).SerializeToString()[:2])  # ir_version only
    assert f"ONNX file {str(path)!r} holds no graph (2 bytes)" in load_error(path)
    assert "cannot be read" in load_error(tmp_path / "missing.onnx")


def test_errors_inside_a_file_name_it(tmp_path):
    path = tmp_path / "tanh.onnx"
    g = helper.make_graph([helper.make_node("Tanh", ["x"], ["y"], name="act")], "g",
                          [helper.make_tensor_value_info("x", 1, [2])], [helper.make_tensor_value_info("y", 1, [2])])
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    assert load_error(path).startswith(f"ONNX file {str(path)!r}: ONNX node 'act' (Tanh): operator Tanh")
