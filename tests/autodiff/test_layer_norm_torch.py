"""Layer norm against ``torch.nn.functional.layer_norm`` (CPU, float64): forward,
gradients and double backward through ``og.compile``'s default CPU pipeline."""

import numpy as np
import pytest

import opgraph as og

from .torch_compare import compare

torch = pytest.importorskip("torch")
F = torch.nn.functional


@pytest.mark.parametrize("normalized_shape", [5, (4, 5)])
@pytest.mark.parametrize("affine", [0, 1, 2])
def test_layer_norm_matches_torch(normalized_shape, affine):
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape
    rng = np.random.default_rng(3)
    feeds = {"x": 2.0 + 3.0 * rng.standard_normal((2, 3, 4, 5))}
    feeds.update({k: 1.0 + rng.standard_normal(ns) for k in ("w", "b")[:affine]})
    compare(lambda x, *p: og.layer_norm(x, normalized_shape, *p, eps=1e-3),
            lambda x, *p: F.layer_norm(x, ns, *p, eps=1e-3), feeds, list(feeds))
