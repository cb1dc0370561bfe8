"""Training-form batch norm against ``torch.nn.functional.batch_norm(training=True)``
(CPU, float64): output, updated running statistics, gradients and double backward,
through ``og.compile``'s default CPU pipeline."""

import numpy as np
import pytest

import opgraph as og

from .torch_compare import compare

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _feeds(shape, seed=7, affine=True):
    """Inputs drawn apart from ``compare``'s output gradient (seed 0): a gradient that
    is affine in x per channel has a zero data gradient."""
    rng = np.random.default_rng(seed)
    c = shape[1]
    feeds = {"x": 3.0 + 2.0 * rng.standard_normal(shape)}  # mean and scale far from 0 and 1
    if affine:
        feeds.update(w=1.0 + 0.5 * rng.standard_normal(c), b=rng.standard_normal(c))
    feeds.update(rm=rng.standard_normal(c), rv=0.5 + rng.random(c))
    return feeds


@pytest.mark.parametrize("shape", [(4, 3, 5, 5), (2, 3, 1, 1), (6, 4), (3, 2, 7)])
@pytest.mark.parametrize("momentum, eps", [(0.1, 1e-5), (0.7, 0.25)])
def test_batch_norm_training_matches_torch(shape, momentum, eps):
    def ours(x, w, b, rm, rv):
        return og.batch_norm(x, rm, rv, w, b, training=True, momentum=momentum, eps=eps,
                             return_running_stats=True)

    def theirs(x, w, b, rm, rv):
        rm, rv = rm.detach().clone(), rv.detach().clone()  # updated in place by PyTorch
        return F.batch_norm(x, rm, rv, w, b, training=True, momentum=momentum, eps=eps), rm, rv

    compare(ours, theirs, _feeds(shape), ["x", "w", "b"])


@pytest.mark.parametrize("affine", ["none", "weight", "bias"])
def test_batch_norm_training_without_affine_parameters_matches_torch(affine):
    feeds = {"x": _feeds((3, 2, 2, 3))["x"]}
    if affine != "none":
        feeds["p"] = 1.0 + np.random.default_rng(5).standard_normal(2)
    kw = lambda *p: {affine: p[0]} if p else {}  # noqa: E731
    # PyTorch's CPU kernel refuses a bias without a weight: give it the weight 1 ours implies.
    ones = {"weight": torch.ones(2, dtype=torch.float64)} if affine == "bias" else {}
    compare(lambda x, *p: og.batch_norm(x, None, None, **kw(*p), training=True),
            lambda x, *p: F.batch_norm(x, None, None, **kw(*p), **ones, training=True),
            feeds, list(feeds))


def test_batch_norm_inference_builder_matches_torch():
    """training=False is the existing inference op; absent weight and bias are 1 and 0."""
    feeds = _feeds((2, 3, 4, 4), affine=False)
    compare(lambda x, rm, rv: og.batch_norm(x, rm, rv, eps=1e-3),
            lambda x, rm, rv: F.batch_norm(x, rm, rv, eps=1e-3), feeds, ["x"])
