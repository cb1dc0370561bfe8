"""Golden graphs: the exact nodes that ``grad`` adds.

The expected dumps were written by hand from the rules (each op's ``vjp``,
``grad``'s naming: ``<node>.grad/<kind>`` for the nodes a node's rule adds,
``<out>.grad_output`` for the output-gradient source, ``<value>.grad/add`` for
summed contributions; dump format ``%id name = Op(params)(inputs) -> type``),
not copied from a run.
"""

import opgraph as og


def _conv_pool_relu():
    g = og.Graph("golden")
    x = g.input("x", (1, 2, 6, 6))
    w = g.param("w", (3, 2, 3, 3))
    b = g.param("b", (3,))
    c = og.conv2d(x, w, b, padding=1, name="conv")
    p = og.max_pool2d(c, 2, name="pool")
    r = og.relu(p, name="relu")
    return g, x, w, b, r


FORWARD = """\
%0 x = Input(float32[1, 2, 6, 6])() -> float32[1, 2, 6, 6]
%1 w = Param(float32[3, 2, 3, 3])() -> float32[3, 2, 3, 3]
%2 b = Param(float32[3])() -> float32[3]
%3 conv = Conv2d(stride=1, padding=1, dilation=1, groups=1)(%0, %1, %2) -> float32[1, 3, 6, 6]
%4 pool = MaxPool2d(kernel_size=2, stride=2, padding=0, ceil_mode=False)(%3) -> float32[1, 3, 3, 3]
%5 relu = Relu()(%4) -> float32[1, 3, 3, 3]"""


def test_conv_pool_relu_backward_nodes():
    g, x, w, b, r = _conv_pool_relu()
    assert g.dump() == FORWARD
    dx, dw, db = og.grad(r, [x, w, b])
    assert g.dump() == FORWARD + """
%6 relu.grad_output = Grad(float32[1, 3, 3, 3])() -> float32[1, 3, 3, 3]
%7 relu.grad/relu_backward = ReluBackward()(%5, %6) -> float32[1, 3, 3, 3]
%8 pool.grad/max_pool2d_backward = MaxPool2dBackward(kernel_size=2, stride=2, padding=0, ceil_mode=False)(%3, %7) -> float32[1, 3, 6, 6]
%9 conv.grad/conv2d_backward_data = Conv2dBackwardData(stride=1, padding=1, dilation=1, groups=1, input_shape=(1, 2, 6, 6))(%8, %1) -> float32[1, 2, 6, 6]
%10 conv.grad/conv2d_backward_filter = Conv2dBackwardFilter(stride=1, padding=1, dilation=1, groups=1, weight_shape=(3, 2, 3, 3))(%0, %8) -> float32[3, 2, 3, 3]
%11 conv.grad/bias_add_backward = BiasAddBackward()(%8) -> float32[3]"""
    assert (dx.node, dw.node, db.node) == (9, 10, 11)
    assert g.grad_inputs == {5: 6}


def test_conv_pool_relu_backward_nodes_for_params_only():
    """The convnet-benchmarks protocol: no image gradient, so no backward-data node."""
    g, x, w, b, r = _conv_pool_relu()
    dw, db = og.grad(r, [w, b])
    added = g.dump().split("\n")[6:]
    assert [line.split(" = ")[0] for line in added] == [
        "%6 relu.grad_output",
        "%7 relu.grad/relu_backward",
        "%8 pool.grad/max_pool2d_backward",
        "%9 conv.grad/conv2d_backward_filter",
        "%10 conv.grad/bias_add_backward",
    ]
    assert (dw.node, db.node) == (9, 10)


def test_value_used_twice_gets_an_add_node():
    g = og.Graph()
    x = g.input("x", (2, 3))
    y = og.add(og.relu(x), x)
    gx = og.grad(y, x)
    assert g.dump() == """\
%0 x = Input(float32[2, 3])() -> float32[2, 3]
%1 relu = Relu()(%0) -> float32[2, 3]
%2 add = Add()(%1, %0) -> float32[2, 3]
%3 add.grad_output = Grad(float32[2, 3])() -> float32[2, 3]
%4 relu.grad/relu_backward = ReluBackward()(%1, %3) -> float32[2, 3]
%5 x.grad/add = Add()(%3, %4) -> float32[2, 3]"""
    assert gx.node == 5


def test_dump_of_the_gradient_alone():
    """``dump(outputs)`` lists only the ancestors of the given values."""
    g, x, w, b, r = _conv_pool_relu()
    (db,) = og.grad(r, [b])
    names = [line.split(" = ")[0].split(" ")[1] for line in g.dump([db]).split("\n")]
    assert names == ["x", "w", "b", "conv", "pool", "relu", "relu.grad_output",
                     "relu.grad/relu_backward", "pool.grad/max_pool2d_backward",
                     "conv.grad/bias_add_backward"]
