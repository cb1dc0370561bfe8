"""Reading an ONNX model from a file, its serialized bytes or an
``onnx.ModelProto``, with errors that say which file and what is wrong with it.

protobuf parses an empty byte string as an empty, valid ``ModelProto``, and a
file cut at a field boundary as a smaller valid message; both would otherwise
surface later as puzzling import errors ("no opset of the default domain").
So an empty file and a model without a graph are reported here, by file.
"""

from __future__ import annotations

import os

from .registry import OnnxImportError


def read_model(onnx, source, external_data: bool = True):
    """``(model, origin)``: the ``ModelProto`` of ``source`` and a phrase naming
    where it came from (``"ONNX file 'path'"``), for error messages.

    Args:
        onnx: the ``onnx`` module.
        source: a path (str or ``os.PathLike``), bytes, or an ``onnx.ModelProto``.
        external_data: load the tensors a file keeps in external files (False:
            the graph only).

    Raises:
        OnnxImportError: the file cannot be read, is empty, does not parse as
            an ONNX model (corrupt or truncated) or holds no graph.
        TypeError: ``source`` is none of the accepted kinds.
    """
    if isinstance(source, onnx.ModelProto):
        return source, "the ONNX model"
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        origin = f"ONNX file {path!r}"
        try:
            size = os.path.getsize(path)
            model = onnx.load(path, load_external_data=external_data) if size else None
        except OSError as e:
            raise OnnxImportError(f"{origin} cannot be read ({e.strerror or e})") from None
        except Exception as e:  # protobuf's DecodeError and friends: not an ONNX model
            raise OnnxImportError(f"{origin} is not a valid ONNX model, corrupt or truncated "
                                  f"({type(e).__name__}: {e})") from None
    elif isinstance(source, (bytes, bytearray)):
        origin, size = "the byte string given", len(source)
        try:
            model = onnx.load_from_string(bytes(source)) if size else None
        except Exception as e:
            raise OnnxImportError(f"{origin} is not a valid ONNX model, corrupt or truncated "
                                  f"({type(e).__name__}: {e})") from None
    else:
        raise TypeError(f"load: expected a path, bytes or onnx.ModelProto, got {type(source).__name__}")
    if model is None:
        raise OnnxImportError(f"{origin} is empty (0 bytes): it holds no ONNX model")
    if not model.HasField("graph"):
        raise OnnxImportError(f"{origin} holds no graph ({size} bytes): it is truncated or not an "
                              "ONNX model")
    return model, origin


__all__ = ["read_model"]
