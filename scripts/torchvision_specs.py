#!/usr/bin/env python3
"""Record torchvision's modern convnets layer by layer into ``benchmarks/specs/modern_convnets.json``.

Usage (needs torch and torchvision, which the project's CPU environment lacks)::

    python scripts/torchvision_specs.py [--output benchmarks/specs/modern_convnets.json]

For each of resnet50, densenet121, mobilenet_v2 and efficientnet_b0 (built by
``torchvision.models.get_model(name, weights=None)``, eval mode, one image of
3x224x224) a forward hook on every leaf module records, per call in execution
order:

* ``name``: the module path (``layer1.0.conv1``); a module called more than
  once (ResNet's bottleneck ReLU runs three times) gets ``path``, ``path_2``,
  ``path_3``, ... for its calls, as ``opgraph.Graph`` names repeated nodes;
* ``type``: the module class (``Conv2d``, ``BatchNorm2d``, ``ReLU6``, ...);
* ``out``: the output shape without the batch axis;
* ``params``: the module's own parameter elements (0 after its first call);
* per type, the attributes the DSL must reproduce: convolutions ``kernel``,
  ``stride``, ``padding``, ``groups``, ``bias`` and ``flops`` (per image, a
  multiply-add = 2); linear layers ``flops``; batch norm ``eps`` and
  ``momentum``; pooling ``kernel``, ``stride``, ``padding``; dropout and
  stochastic depth ``p`` (and ``mode``).

Totals per model: ``params`` (checked here against the ``num_params`` of
torchvision's weight metadata, which needs no download), and the conv and
linear FLOPs per image (what torchvision-style counts use: the element-wise
work of activations, batch norm and pooling is not counted).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from pathlib import Path

import torch
import torchvision
from torch import nn

MODELS = ("resnet50", "densenet121", "mobilenet_v2", "efficientnet_b0")
IMAGE = (3, 224, 224)
DEFAULT_OUTPUT = Path(__file__).resolve().parents[1] / "benchmarks" / "specs" / "modern_convnets.json"


def _pair(v) -> list[int]:
    return list(v) if isinstance(v, (tuple, list)) else [v, v]


def attributes(module: nn.Module, out_shape) -> dict:
    """The type-specific fields of one call of ``module`` (see the module docstring)."""
    if isinstance(module, nn.Conv2d):
        kh, kw = module.kernel_size
        macs = math.prod(out_shape) * (module.in_channels // module.groups) * kh * kw
        return {"kernel": list(module.kernel_size), "stride": list(module.stride),
                "padding": list(module.padding), "groups": module.groups,
                "bias": module.bias is not None, "flops": 2 * macs}
    if isinstance(module, nn.Linear):
        return {"bias": module.bias is not None, "flops": 2 * module.in_features * module.out_features}
    if isinstance(module, nn.BatchNorm2d):
        return {"eps": module.eps, "momentum": module.momentum}
    if isinstance(module, (nn.MaxPool2d, nn.AvgPool2d)):
        return {"kernel": _pair(module.kernel_size), "stride": _pair(module.stride),
                "padding": _pair(module.padding)}
    if isinstance(module, nn.AdaptiveAvgPool2d):
        return {"output_size": _pair(module.output_size)}
    if isinstance(module, nn.Dropout):
        return {"p": module.p}
    if type(module).__name__ == "StochasticDepth":
        return {"p": module.p, "mode": module.mode}
    return {}


def record(name: str) -> dict:
    """The spec entry of one torchvision model (see the module docstring)."""
    torch.manual_seed(0)
    model = torchvision.models.get_model(name, weights=None).eval()
    layers, calls = [], {}

    def hook(path):
        def fn(module, inputs, output):
            k = calls[path] = calls.get(path, 0) + 1
            out = list(output.shape[1:])
            own = sum(p.numel() for p in module.parameters(recurse=False)) if k == 1 else 0
            layers.append({"name": path if k == 1 else f"{path}_{k}", "type": type(module).__name__,
                           "out": out, "params": own, **attributes(module, out)})
        return fn

    handles = [m.register_forward_hook(hook(path)) for path, m in model.named_modules()
               if path and not any(True for _ in m.children())]
    with torch.no_grad():
        y = model(torch.zeros(1, *IMAGE))
    for h in handles:
        h.remove()
    params = sum(p.numel() for p in model.parameters())
    meta = torchvision.models.get_model_weights(name).DEFAULT.meta["num_params"]
    if params != meta:
        raise SystemExit(f"{name}: {params} parameters, torchvision's metadata says {meta}")
    conv = sum(layer["flops"] for layer in layers if layer["type"] == "Conv2d")
    linear = sum(layer["flops"] for layer in layers if layer["type"] == "Linear")
    return {"title": type(model).__name__, "input_chw": list(IMAGE), "output": list(y.shape[1:]),
            "params": params, "conv_flops_per_image": conv, "linear_flops_per_image": linear,
            "layers": layers}


def dump(doc: dict) -> str:
    """JSON with one layer per line: readable diffs, a compact file."""
    models = doc.pop("models")
    head = json.dumps(doc, indent=1)[:-2]
    parts = []
    for key, spec in models.items():
        layers = spec.pop("layers")
        fields = "".join(f'\n   "{k}": {json.dumps(v)},' for k, v in spec.items())
        rows = ",\n    ".join(json.dumps(layer, separators=(",", ":")) for layer in layers)
        parts.append(f'  "{key}": {{{fields}\n   "layers": [\n    {rows}\n   ]\n  }}')
    return head + ',\n "models": {\n' + ",\n".join(parts) + "\n }\n}\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = p.parse_args(argv)
    doc = {
        "source": {
            "made_by": "scripts/torchvision_specs.py (forward hooks on every leaf module, eval "
                       "mode, one image 3x224x224, torchvision.models.get_model(name, weights=None))",
            "date": datetime.date.today().isoformat(),
            "torch": torch.__version__, "torchvision": torchvision.__version__,
        },
        "conventions": {
            "out": "output shape without the batch axis (C, H, W) or (features,)",
            "name": "module path; a module called k > 1 times: path, path_2, ..., path_k",
            "params": "the module's own parameter elements at its first call (buffers excluded)",
            "flops": "per image, a multiply-add = 2, conv and linear only (bias adds not counted)",
        },
        "models": {name: record(name) for name in MODELS},
    }
    text = dump(doc)
    json.loads(text)  # the hand-made layout is valid JSON
    args.output.write_text(text)
    print(f"wrote {args.output} ({len(text)} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
