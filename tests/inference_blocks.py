"""An inference-form block for the ``bn-fold`` rule's tests (``tests/passes/test_fold_bn.py``,
``tests/gpu/test_fuse_gpu.py``): convolution, batch norm with running statistics, ReLU."""

from __future__ import annotations

import numpy as np

import opgraph as og


def conv_bn_relu(bias: bool = True, groups: int = 1):
    """x -> conv (8 channels) -> inference batch norm -> relu -> global average pool:
    ``(graph, y, params, feeds)``."""
    g = og.Graph()
    x, w = g.input("x", (2, 4, 9, 9)), g.param("w", (8, 4 // groups, 3, 3))
    b = g.param("b", (8,)) if bias else None
    scale, shift = g.param("bn.weight", (8,)), g.param("bn.bias", (8,))
    mean, var = g.buffer("bn.running_mean", (8,)), g.buffer("bn.running_var", (8,))
    h = og.relu(og.batch_norm(og.conv2d(x, w, b, stride=2, padding=1, groups=groups), mean, var, scale, shift,
                              training=False, eps=1e-3, name="bn"))
    y = og.flatten(og.adaptive_avg_pool2d(h, 1))  # the relu is no output: the epilogue may take it
    rng = np.random.default_rng(1)
    feeds = {s.name: rng.standard_normal(s.type.shape).astype(np.float32) for s in g.sources()}
    feeds["bn.running_var"] = rng.uniform(0.2, 3.0, 8).astype(np.float32)  # a variance is positive
    return g, y, [w, *([b] if bias else []), scale, shift], feeds
