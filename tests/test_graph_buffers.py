"""Buffer sources (``Graph.buffer``): state fed by name like parameters, with a
default value, left out of parameter counts and never differentiated."""

import numpy as np
import pytest

import opgraph as og
from opgraph.analysis import summarize, totals
from opgraph.errors import NotDifferentiableError, ParameterError, ShapeError


def _bn_net():
    g = og.Graph()
    x = g.input("x", (2, 3, 4, 4))
    w, b = g.param("w", (3,)), g.param("b", (3,))
    rm, rv = g.buffer("rm", (3,), value=0.0), g.buffer("rv", (3,), value=np.full(3, 4.0, np.float32))
    return g, x, w, b, rm, rv


def test_buffer_defaults_are_fed_and_can_be_overridden():
    g, x, w, b, rm, rv = _bn_net()
    assert rm.op.role == "buffer" and [s.name for s in g.sources("buffer")] == ["rm", "rv"]
    np.testing.assert_array_equal(g.param_values["rm"], np.zeros(3, np.float32))
    y = og.batch_norm(x, rm, rv, w, b, eps=0.0)
    run = og.compile(y)
    xv = np.random.default_rng(0).standard_normal((2, 3, 4, 4)).astype(np.float32)
    (default,) = run(x=xv, w=np.ones(3, np.float32), b=np.zeros(3, np.float32))
    np.testing.assert_allclose(default, xv / 2, rtol=1e-6)  # running_var 4 from the default
    (fed,) = run(x=xv, w=np.ones(3, np.float32), b=np.zeros(3, np.float32), rv=np.ones(3, np.float32))
    np.testing.assert_allclose(fed, xv, rtol=1e-6)


def test_buffer_value_of_another_shape_is_an_error():
    g = og.Graph()
    with pytest.raises(ShapeError, match=r"node rm: buffer value shape \(4,\) != \(3,\)"):
        g.buffer("rm", (3,), value=np.zeros(4))


@pytest.mark.parametrize("value", ["a", 1j])
def test_buffer_value_that_is_no_real_number_names_the_buffer(value):
    """np.full raised a bare "could not convert string to float" for 'a' and
    dropped the imaginary part of 1j with a warning."""
    g = og.Graph()
    with pytest.raises(ParameterError, match=rf"node rm \(buffer float32\[3\]\): parameter value={value!r}: "
                                             r"must be a real number filling the buffer or an array of shape \(3,\)"):
        g.buffer("rm", (3,), value=value)
    assert "rm" not in g


def test_parameter_counts_leave_buffers_out():
    """As torchvision's: a batch norm owns weight and bias (2C), not its running statistics."""
    g, x, w, b, rm, rv = _bn_net()
    y = og.batch_norm(x, rm, rv, w, b)
    rows = summarize(g, [y])
    assert rows[-1].params == 6
    assert totals(rows, g, [y]).params == 6
    with_sources = {r.name: r.role for r in summarize(g, [y], include_sources=True)}
    assert with_sources["rm"] == "buffer"


def test_grad_refuses_a_buffer_and_ignores_buffers_otherwise():
    g, x, w, b, rm, rv = _bn_net()
    y = og.batch_norm(x, rm, rv, w, b)
    with pytest.raises(NotDifferentiableError, match="grad: rm is a buffer"):
        og.grad(y, [w, rm])
    gw = og.grad(y, w)
    assert gw.shape == (3,)
