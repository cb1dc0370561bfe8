"""Whole-model gradients: AlexNet and GoogLeNet from ``opgraph.benchmarks.models``
at their real size (3x224x224), batch 1, in float64 on the reference kernels.

The gradients w.r.t. the first convolution's weight, a middle convolution's
weight and the last linear layer's weight are checked along random directions
against central differences (``gradcheck.check_grad``, directional mode).

A ReLU/max-pool net is piecewise linear in each weight tensor, so a step that
crosses a kink spoils a finite difference; the step is kept tiny (1e-8, far
below float64 rounding trouble for these values) and a crossing, seen as two
one-sided slopes that disagree, is retried with a smaller step
(``kink_retries``). Cost: one forward+backward, then two forward evaluations
per direction and weight (12 forwards; a GoogLeNet forward takes ~0.3 s on
the reference kernels, 2 cores).
"""

import numpy as np
import pytest

from opgraph.benchmarks.models import MODELS

from .gradcheck import check_grad

pytestmark = pytest.mark.slow


def _he_init(model, seed=0):
    """Image N(0, 1); weights N(0, 2/fan_in) (He et al. 2015) so activations stay
    O(1) through the depth; biases N(0, 0.01)."""
    rng = np.random.default_rng(seed)
    feeds = {model.input.name: rng.standard_normal(model.input.shape)}
    for p in model.params:
        fan_in = int(np.prod(p.shape[1:]))
        scale = np.sqrt(2.0 / fan_in) if len(p.shape) > 1 else 0.1
        feeds[p.name] = scale * rng.standard_normal(p.shape)
    return feeds


@pytest.mark.parametrize("model, weights", [
    ("alexnet", ["conv1.weight", "conv3.weight", "fc8.weight"]),
    ("googlenet", ["conv1/7x7_s2.weight", "inception_4c/3x3.weight", "loss3/classifier.weight"]),
])
def test_model_gradient(model, weights):
    m = MODELS[model](batch=1)
    assert m.input.shape == (1, 3, 224, 224)
    wrt = [m.graph[name] for name in weights]
    assert wrt[0].node == m.params[0].node  # the first conv's weight
    feeds = _he_init(m)
    grads = check_grad(m.output, wrt, feeds, eps=1e-8, rtol=1e-6, directional_only=True,
                       directions=2, kink_retries=2)
    # Every checked gradient carries signal (a zero gradient would pass trivially).
    for name in weights:
        assert np.linalg.norm(grads[name]) > 1e-3
