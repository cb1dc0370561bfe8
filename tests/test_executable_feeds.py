"""What an executable accepts as feeds: sources the compiled outputs do not
read are ignored (a training loop feeds one dict of every parameter), names
that are not in the graph, malformed ``grad_outputs`` and float data fed to
integer inputs are clear errors."""

import re

import numpy as np
import pytest
import torch

import opgraph as og
from opgraph.errors import ExecutionError


def _conv():
    g = og.Graph("net")
    x, w, b = g.input("x", (2, 3, 5, 5)), g.param("w", (4, 3, 3, 3)), g.param("b", (4,))
    y = og.conv2d(x, w, b, padding=1, name="conv")
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 3, 5, 5), dtype=np.float32),
             "w": rng.standard_normal((4, 3, 3, 3), dtype=np.float32),
             "b": rng.standard_normal(4, dtype=np.float32)}
    return g, y, feeds


def test_a_source_the_outputs_do_not_read_is_ignored():
    g, y, feeds = _conv()
    (dw,) = og.grad(y, [g["w"]])
    run = og.compile([dw])  # dw reads x and the output gradient, not w or b
    gy = np.ones(y.shape, np.float32)
    (got,) = run(grad_outputs={y: gy}, **feeds)
    xt = torch.from_numpy(feeds["x"])
    wt = torch.from_numpy(feeds["w"]).requires_grad_()
    torch.nn.functional.conv2d(xt, wt, padding=1).backward(torch.from_numpy(gy))
    np.testing.assert_allclose(got, wt.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_a_name_not_in_the_graph_is_still_an_error():
    g, y, feeds = _conv()
    with pytest.raises(ExecutionError, match=r"unknown feed\(s\) \['wq'\]: no source of graph 'net'"):
        og.compile([y])(wq=feeds["w"], **feeds)


def test_grad_outputs_must_be_a_mapping():
    g, y, feeds = _conv()
    (dw,) = og.grad(y, [g["w"]])
    with pytest.raises(TypeError, match="grad_outputs must be a dict .* got list"):
        og.compile([dw])([np.ones(y.shape, np.float32)], **feeds)


def test_an_unknown_grad_outputs_name_is_named():
    g, y, feeds = _conv()
    (dw,) = og.grad(y, [g["w"]])
    with pytest.raises(ExecutionError, match="grad_outputs key 'nope' is neither an output Value nor"):
        og.compile([dw])(grad_outputs={"nope": np.ones(y.shape)}, **feeds)
    (got,) = og.compile([dw])(grad_outputs={"conv": np.ones(y.shape)}, **feeds)  # by name works
    assert got.shape == (4, 3, 3, 3)


def test_a_feed_dict_passed_positionally_says_so():
    g, y, feeds = _conv()
    with pytest.raises(ExecutionError, match=r"'x' is a source \(input\), not an output: feed sources "
                                             r"as keyword arguments, run\(x=...\)"):
        og.compile([y])(feeds)


def _loss():
    g = og.Graph("clf")
    x, t = g.input("x", (3, 4)), g.input("t", (3,), dtype="int64")
    return og.cross_entropy(x, t), np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)


@pytest.mark.parametrize("target, bad", [([0.0, 1.7, 2.0], "1.7"), ([0.0, np.nan, 2.0], "nan"),
                                         ([0.0, 1.0, 1e30], "1e+30")])
def test_cross_entropy_refuses_non_integral_float_targets(target, bad):
    loss, x = _loss()
    with pytest.raises(ExecutionError, match="input 't' is int64: got floating values such as " + re.escape(bad)):
        og.compile([loss])(x=x, t=np.array(target))


def test_cross_entropy_takes_whole_float_targets_as_pytorch_takes_long_ones():
    loss, x = _loss()
    (got,) = og.compile([loss])(x=x, t=np.array([0.0, 3.0, 2.0]))
    want = torch.nn.functional.cross_entropy(torch.from_numpy(x), torch.tensor([0, 3, 2]))
    assert abs(float(got) - float(want)) < 1e-6


def _tiny():
    """conv + bias + ReLU (fused into one step by compile: the ReLU's node h
    is not in the compiled graph) and a flatten p, with the gradient of w."""
    g = og.Graph("tiny")
    x, w, b = g.input("x", (2, 3, 5, 5)), g.param("w", (4, 3, 3, 3)), g.param("b", (4,))
    h = og.relu(og.conv2d(x, w, b, padding=1), name="h")
    p = og.flatten(h, name="p")
    (dw,) = og.grad(p, [w])
    return g, h, p, dw


def _tiny_feeds():
    rng = np.random.default_rng(2)
    return {"x": rng.standard_normal((2, 3, 5, 5), dtype=np.float32),
            "w": rng.standard_normal((4, 3, 3, 3), dtype=np.float32),
            "b": rng.standard_normal(4, dtype=np.float32)}


def test_grad_outputs_keys_are_values_of_the_compiled_graph_not_node_numbers():
    """A key is matched to its own graph, not by node number: a value of a
    graph built the same way (same ids, same name) or a source of another
    graph is refused naming it and the compiled outputs; a value the
    compiler fused away is an ExecutionError naming it (not a KeyError)."""
    g, h, p, dw = _tiny()
    run, feeds = og.compile([p, dw]), _tiny_feeds()
    gy = np.ones(p.shape, np.float32)
    compiled_for = re.escape("this executable was compiled for outputs ['p', 'conv2d.grad/conv2d_backward_filter']; "
                             "they read the gradient of ['p']")
    other, _, other_p, _ = _tiny()
    with pytest.raises(ExecutionError, match=r"grad_outputs key <Value %\d+ p: .*> is a value of another Graph "
                                             r"object, also named 'tiny', not of the graph 'tiny' this "
                                             r"executable was compiled from; " + compiled_for):
        run(grad_outputs={other_p: gy}, **feeds)
    named = og.Graph("other")
    x0 = named.input("x", (2, 3, 5, 5))  # node 0, as x is in g: not blamed on g's x
    with pytest.raises(ExecutionError, match=r"key <Value %0 x: .*> is a value of graph 'other', not of the "
                                             r"graph 'tiny'"):
        run(grad_outputs={x0: gy}, **feeds)
    assert h.node not in run.graph.nx  # fused into the convolution's step
    for key in (h, "h"):
        with pytest.raises(ExecutionError, match="grad_outputs key 'h' is not an output with a gradient "
                                                 "placeholder .*; " + compiled_for):
            run(grad_outputs={key: np.ones(h.shape, np.float32)}, **feeds)


def test_grad_outputs_keys_of_the_users_graph_and_the_compiled_one_both_work():
    g, h, p, dw = _tiny()
    run, feeds = og.compile([p, dw]), _tiny_feeds()
    gy = np.random.default_rng(3).standard_normal(p.shape).astype(np.float32)
    want = run(grad_outputs={p: gy}, **feeds)[1]
    for key in ("p", run.outputs[0]):  # a name; a value of the compiled graph (exe.outputs)
        np.testing.assert_array_equal(run(grad_outputs={key: gy}, **feeds)[1], want)
    xt, bt = torch.from_numpy(feeds["x"]), torch.from_numpy(feeds["b"])
    wt = torch.from_numpy(feeds["w"]).requires_grad_()
    torch.relu(torch.nn.functional.conv2d(xt, wt, bt, padding=1)).flatten(1).backward(torch.from_numpy(gy))
    np.testing.assert_allclose(want, wt.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_two_grad_outputs_keys_for_one_output_are_an_error_naming_both():
    g, h, p, dw = _tiny()
    run, feeds = og.compile([p, dw]), _tiny_feeds()
    gy = np.ones(p.shape, np.float32)
    with pytest.raises(ExecutionError, match=r"grad_outputs keys <Value %\d+ p: .*> and 'p' both name output "
                                             r"'p'; give one gradient per output"):
        run(grad_outputs={p: gy, "p": gy * 0}, **feeds)
    with pytest.raises(ExecutionError, match=r"keys 'p' and <Value %\d+ p: .*> both name output 'p'"):
        run(grad_outputs={"p": gy, run.outputs[0]: gy * 0}, **feeds)


def test_a_complex_feed_is_refused_naming_it():
    g, y, feeds = _conv()
    run = og.compile([y])
    with pytest.raises(ExecutionError, match=r"input 'x' is float32: got complex values \(complex64\); a cast "
                                             "would drop their imaginary part"):
        run(**{**feeds, "x": feeds["x"] + 1j})
    with pytest.raises(ExecutionError, match=r"param 'b' is float32: got complex values \(complex128\)"):
        run(**{**feeds, "b": [1j, 0, 0, 0]})
    run(**{**feeds, "b": feeds["b"].tolist()})  # a list of reals is still read


def test_an_integer_target_past_int64_is_refused_before_the_cast_wraps_it():
    loss, x = _loss()
    run = og.compile([loss])
    with pytest.raises(ExecutionError, match="input 't' is int64: got uint64 values such as 9223372036854775809, "
                                             "outside its range -9223372036854775808..9223372036854775807"):
        run(x=x, t=np.array([0, 2**63 + 1, 2], np.uint64))
    with pytest.raises(ExecutionError, match="input 't': cannot be read as int64"):
        run(x=x, t=[0, 2**64, 2])  # a Python int past uint64 too (NumPy: OverflowError)
    (got,) = run(x=x, t=np.array([0, 1, 2], np.uint64))  # uint64 in range is read as before
    want = torch.nn.functional.cross_entropy(torch.from_numpy(x), torch.tensor([0, 1, 2]))
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5)


def test_torch_tensors_are_checked_as_arrays_are():
    """Review: a float torch tensor fed to a class-index input was truncated (1.7 -> class 1: torch
    dtypes have no NumPy ``kind``, so the integral check passed them over); a complex tensor is
    refused, a bfloat16 one is an error naming the input, whole-number tensors are read."""
    loss, x = _loss()
    run = og.compile([loss])
    with pytest.raises(ExecutionError, match=r"input 't' is int64: got floating values such as 1.7"):
        run(x=x, t=torch.tensor([0.0, 1.7, 2.0]))
    with pytest.raises(ExecutionError, match=r"input 't' is int64: got complex values \(complex64\)"):
        run(x=x, t=torch.tensor([0, 1j, 2]))
    with pytest.raises(ExecutionError, match=r"input 't': cannot be read as int64"):
        run(x=x, t=torch.tensor([0.0, 1.0, 2.0], dtype=torch.bfloat16))
    want = torch.nn.functional.cross_entropy(torch.from_numpy(x), torch.tensor([0, 1, 2]))
    for t in (torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2], dtype=torch.uint8), torch.tensor([0.0, 1.0, 2.0])):
        np.testing.assert_allclose(run(x=x, t=t)[0], want.numpy(), rtol=1e-5)
