"""The modern convnets compute what torchvision's models compute, in training mode.

The same random weights, batch-norm affine parameters and running statistics
go into torchvision's model (``load_state_dict``) and into our graph (fed by
name: our parameter and buffer names are torchvision's ``state_dict`` keys).
In float64 on the CPU, with a random output gradient, the forward output,
every parameter gradient and every new running statistic of our graph on
the reference pipeline must equal torchvision's ``train()`` forward and
autograd. Dropout and stochastic depth are random in torchvision; they are
replaced there by modules multiplying with our masks (the ``Dropout`` op's
seeded mask, the stochastic-depth ``Constant``), so the comparison is exact.

Needs torchvision (``pip install torchvision``), which the CPU test
environment lacks (its wheel needs CUDA torch): the module skips without it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import opgraph as og
from opgraph.benchmarks import models as M
from opgraph.passes.autotune import relative_error

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

pytestmark = pytest.mark.slow

BATCH = 2
#: Image size: global pooling lets every model take it; small enough for a float64 run
#: of seconds, large enough that the last batch norms see 2 x 3 x 3 values per channel.
IMAGE = 96
TOL = 1e-9  # float64 on both sides; only the summation order differs
#: A gradient below this fraction of the whole gradient's norm is compared on that
#: scale: the bias of a batch norm whose output reaches the loss only through a
#: convolution and a training-form batch norm (MobileNet's and EfficientNet's
#: projections) has gradient exactly 0 (the batch mean removes any per-channel
#: shift), so both sides hold rounding noise of ~1e-14 whose relative error is ~1.
FLOOR = 1e-6


class Masked(torch.nn.Module):
    """``x * mask``: our fixed mask in place of a random torchvision module."""

    def __init__(self, mask):
        super().__init__()
        self.mask = torch.tensor(np.asarray(mask, np.float64))

    def forward(self, x):
        return x * self.mask


def dropout_mask(op, shape) -> np.ndarray:
    """The mask the reference ``Dropout`` kernel applies (its documented rule)."""
    keep = np.random.default_rng(op.seed).random(shape) >= op.p
    return keep / (1.0 - op.p)


def random_state(tv_model, rng) -> dict[str, np.ndarray]:
    """Random values for every parameter and running statistic of ``tv_model``."""
    state = {}
    for key, t in tv_model.state_dict().items():
        shape = tuple(t.shape)
        if key.endswith("num_batches_tracked"):
            continue
        if key.endswith("running_var"):
            state[key] = rng.uniform(0.5, 1.5, shape)
        elif key.endswith(("running_mean", ".bias")):
            state[key] = 0.1 * rng.standard_normal(shape)
        elif len(shape) == 1:  # a batch-norm scale
            state[key] = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            state[key] = rng.standard_normal(shape) / math.sqrt(math.prod(shape[1:]))
    return state


def replace_random_modules(tv_model, model: M.Model) -> int:
    """Put our masks in place of torchvision's dropout and stochastic depth; how many."""
    g, count = model.graph, 0
    for path, module in list(tv_model.named_modules()):
        kind = type(module).__name__
        if kind not in ("Dropout", "StochasticDepth") or path not in g:
            continue
        node = g[path]
        mask = (dropout_mask(node.op, node.shape) if kind == "Dropout"
                else g[f"{path}/mask"].op.value)
        parent, _, child = path.rpartition(".")
        setattr(tv_model.get_submodule(parent), child, Masked(mask))
        count += 1
    return count


@pytest.mark.parametrize("name", M.MODERN)
def test_forward_gradients_and_running_statistics_equal_torchvision(name):
    model = M.MODELS[name](batch=BATCH, dtype="float64", image=IMAGE)
    tv_model = torchvision.models.get_model(name, weights=None).double().train()
    rng = np.random.default_rng(7)
    state = random_state(tv_model, rng)
    tv_model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=False)
    replaced = replace_random_modules(tv_model, model)
    assert replaced == {"mobilenet_v2": 1, "efficientnet_b0": 1 + 9}.get(name, 0)

    x = rng.standard_normal(model.input.shape)
    gy = rng.standard_normal(model.output.shape)
    grads = og.grad(model.output, model.params)
    run = og.compile([model.output, *grads, *model.state_updates.values()],
                     pipeline="reference", dtype="float64")
    ours = run(grad_outputs={model.output: gy}, data=x, **state)

    params = dict(tv_model.named_parameters())
    assert sorted(params) == sorted(p.name for p in model.params)
    y = tv_model(torch.from_numpy(x))
    want = torch.autograd.grad(y, [params[p.name] for p in model.params], torch.from_numpy(gy))
    buffers = dict(tv_model.named_buffers())

    assert relative_error(np, ours[0], y.detach().numpy()) < TOL
    n = len(model.params)
    scale = FLOOR * math.sqrt(sum(float((w * w).sum()) for w in want))
    errors = {p.name: np.linalg.norm(got - w.numpy()) / max(np.linalg.norm(w.numpy()), scale)
              for p, got, w in zip(model.params, ours[1:1 + n], want)}
    worst = max(errors, key=errors.get)
    assert errors[worst] < TOL, (worst, errors[worst])
    for key, got in zip(model.state_updates, ours[1 + n:]):
        assert relative_error(np, got, buffers[key].numpy()) < TOL, key
