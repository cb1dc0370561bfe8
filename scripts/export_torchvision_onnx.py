"""Export torchvision's classification convnets as weightless ONNX files: the
test data of ``tests/onnx/models/`` (its README says what they hold).

Usage, in an environment with torch, torchvision and onnx (the project's own
has no torchvision)::

    python scripts/export_torchvision_onnx.py tests/onnx/models [NAME ...]

Each NAME (default: :data:`MODELS`, one or two members of every torchvision
classification convnet family) is built with ``weights=None`` in eval mode and
exported by PyTorch's TorchScript exporter (``dynamo=False``) at opset 17 with
``export_params=False``: the parameters are graph inputs with static shapes,
the image is the first input ``x`` with a symbolic batch ``N``. In eval mode
the exporter folds every BatchNorm that follows a convolution into that
convolution, and deduplicates equal tensors behind ``Identity`` nodes.

Besides ``NAME.onnx`` it writes ``manifest.json``: per model the input shape,
the operators (with counts), torchvision's parameter count, and the parameter
and floating buffer element counts of the model with those BatchNorms folded
by ``torch.fx.experimental.optimization.fuse`` -- what an import that keeps
one source per parameter must declare (checked by
``tests/onnx/test_torchvision_models.py``).
"""

from __future__ import annotations

import collections
import json
import os
import sys

#: One or two members of each family; inception_v3 takes 299x299 images.
MODELS = ("alexnet", "squeezenet1_0", "squeezenet1_1", "vgg11", "vgg11_bn", "resnet18", "resnet50",
          "resnext50_32x4d", "wide_resnet50_2", "densenet121", "googlenet", "inception_v3",
          "mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large", "mnasnet0_5",
          "shufflenet_v2_x0_5", "efficientnet_b0", "efficientnet_v2_s", "regnet_x_400mf",
          "regnet_y_400mf", "convnext_tiny")
OPSET = 17


def export(name: str, folder: str) -> dict:
    """Write ``folder/name.onnx``; return its manifest entry."""
    import onnx
    import torch
    import torchvision
    from torch.fx.experimental.optimization import fuse

    model = getattr(torchvision.models, name)(weights=None).eval()
    size = 299 if name == "inception_v3" else 224
    path = os.path.join(folder, f"{name}.onnx")
    torch.onnx.export(model, torch.randn(1, 3, size, size), path, dynamo=False, opset_version=OPSET,
                      export_params=False, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "N"}, "y": {0: "N"}})
    ops = collections.Counter(n.op_type for n in onnx.load(path).graph.node)
    folded = fuse(model)  # what the exporter folds: each BatchNorm right after a convolution
    return {"input": [1, 3, size, size], "bytes": os.path.getsize(path), "operators": dict(sorted(ops.items())),
            "torchvision_params": sum(p.numel() for p in model.parameters()),
            "params": sum(p.numel() for p in folded.parameters()),
            "buffers": sum(b.numel() for b in folded.buffers() if b.is_floating_point())}


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    import torch
    import torchvision

    folder, names = argv[0], argv[1:] or list(MODELS)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "manifest.json")
    manifest = {"torch": torch.__version__, "torchvision": torchvision.__version__, "opset": OPSET,
                "models": {}}
    if os.path.exists(path):
        with open(path) as f:
            manifest["models"] = json.load(f)["models"]
    for name in names:
        manifest["models"][name] = entry = export(name, folder)
        print(f"{name}: {entry['bytes']} bytes, {entry['params']} parameters, "
              + ", ".join(f"{k}:{v}" for k, v in entry["operators"].items()), flush=True)
    with open(path, "w") as f:
        f.write(render(manifest))
    return 0


def render(manifest: dict) -> str:
    """The manifest as JSON with one line per model."""
    head = {k: v for k, v in manifest.items() if k != "models"}
    lines = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(manifest["models"].items())]
    return json.dumps(head)[:-1] + ', "models": {\n' + ",\n".join(lines) + "\n}}\n"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
