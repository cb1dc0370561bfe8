"""opgraph: abstract convnet op graphs, lowering passes and an autotuning meta-optimizer.

Public API::

    import opgraph as og
    g = og.Graph()
    x = g.input("x", (8, 3, 32, 32))
    w = g.param("w", (16, 3, 3, 3))
    y = og.relu(og.conv2d(x, w, padding=1))
    dx, dw = og.grad(y, [x, w])
    run = og.compile([y, dx, dw], device="cpu")
    y_val, dx_val, dw_val = run(x=x_np, w=w_np, grad_outputs={y: gy_np})
"""

from .autodiff import grad
from .builders import (add, avg_pool2d, bias_add, concat, conv2d, cross_entropy, dropout, flatten,
                       linear, local_response_norm, log_softmax, matmul, max_pool2d, pad, relu,
                       reshape, softmax, threshold)
from .builders import (adaptive_avg_pool2d, batch_norm, div, gelu, hardsigmoid, hardswish, hardtanh,
                       layer_norm, mean, mul, narrow, neg, permute, relu6, sigmoid, silu, split,
                       transpose)
from .errors import (ExecutionError, LoweringError, NotDifferentiableError, NotLoweredError,
                     OpgraphError, ParameterError, ShapeError)
from .graph import Graph, NodeView, Value
from .types import TensorType

__version__ = "0.1.0"  # the one place it is written: setup.cfg reads it (version = attr:)

_LAZY = {  # composed from the passes and backends packages, loaded on first use
    "compile": ("opgraph.passes.compiler", "compile"),
    "LoweringPolicy": ("opgraph.passes.policy", "LoweringPolicy"),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'opgraph' has no attribute {name!r}")
