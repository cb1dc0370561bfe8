"""``flatten``'s start_dim as torch's: a negative one counts from the end (it was refused,
"must be an int >= 0"); the default is ``nn.Flatten``'s 1; out of range is a clear error."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import opgraph as og  # noqa: E402
from opgraph.errors import ParameterError, ShapeError  # noqa: E402


@pytest.mark.parametrize("start_dim", [0, 1, 2, 3, -1, -2, -3, -4])
def test_flatten_matches_torch_flatten(start_dim):
    g = og.Graph()
    x = g.input("x", (2, 3, 4, 5))
    y = og.flatten(x, start_dim)
    data = np.random.default_rng(0).standard_normal((2, 3, 4, 5))
    want = torch.flatten(torch.from_numpy(data), start_dim).numpy()
    assert y.type.shape == want.shape
    (got,) = og.compile([y], pipeline="reference", dtype="float64")(x=data)
    np.testing.assert_array_equal(got, want)


def test_the_default_keeps_the_batch_axis_as_nn_flatten():
    g = og.Graph()
    assert og.flatten(g.input("x", (2, 3, 4, 5))).type.shape == torch.nn.Flatten()(torch.zeros(2, 3, 4, 5)).shape


@pytest.mark.parametrize("start_dim, error", [(-5, ParameterError), (4, ShapeError)])
def test_a_start_dim_out_of_range_names_the_parameter(start_dim, error):
    g = og.Graph()
    with pytest.raises(error, match="start_dim"):
        og.flatten(g.input("x", (2, 3, 4, 5)), start_dim, name="flat")
