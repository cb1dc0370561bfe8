"""The graph structure: ordered inputs, topological order, names, scopes, dump.

Expected dumps are written by hand from the documented format
``%id name = Op(params)(inputs) -> type``.
"""

import numpy as np
import pytest

import opgraph as og
from opgraph import ops
from opgraph.errors import OpgraphError, ShapeError
from opgraph.op import Source


def _conv_pool_add():
    g = og.Graph("demo")
    x = g.input("x", (1, 3, 8, 8))
    w = g.param("w", (4, 3, 3, 3))
    y = og.conv2d(x, w, stride=2, padding=((0, 1), (1, 1)), name="conv")
    z = og.max_pool2d(y, 2, name="pool")
    return g, x, w, y, z, og.add(z, z)


# ---- inputs and order -------------------------------------------------------------

def test_inputs_keep_their_positions():
    g = og.Graph()
    a, b = g.input("a", (2, 3, 4, 4)), g.input("b", (2, 1, 4, 4))
    c = og.concat([b, a, b], 1)
    assert g.input_ids(c.node) == [b.node, a.node, b.node]
    assert [v.node for v in g.node(c.node).inputs] == [b.node, a.node, b.node]
    assert g.node(c.node).input_types == (b.type, a.type, b.type)
    assert c.shape == (2, 5, 4, 4)


def test_add_of_one_value_twice_has_two_input_edges():
    g = og.Graph()
    x = g.input("x", (2, 3))
    y = og.add(x, x)
    assert g.input_ids(y.node) == [x.node, x.node]
    assert g.nx.number_of_edges(x.node, y.node) == 2
    assert g.users(x.node) == [y.node]  # each user listed once


def test_topological_order_follows_edges_not_ids():
    """Rewire so that a node reads a younger node: the order must put the producer first."""
    g = og.Graph()
    x = g.input("x", (2, 3))
    a = og.relu(x, name="a")
    b = og.relu(x, name="b")
    g.rewrite(a.node, a.op, [b])
    assert g.topological() == [x.node, b.node, a.node]
    assert [v.name for v in g.nodes_in_order([a])] == ["x", "b", "a"]


def test_topological_ties_break_by_id():
    g = og.Graph()
    p, q = g.input("p", (2,)), g.input("q", (2,))
    r1, r2 = og.relu(q), og.relu(p)
    assert g.topological() == [p.node, q.node, r1.node, r2.node]


def test_nodes_in_order_restricted_to_ancestors():
    g, x, w, y, z, s = _conv_pool_add()
    og.relu(x, name="unused")
    assert [v.name for v in g.nodes_in_order([z])] == ["x", "w", "conv", "pool"]
    assert g.ancestors([y]) == {x.node, w.node, y.node}


# ---- names -------------------------------------------------------------------------

def test_automatic_names_count_up():
    g = og.Graph()
    x = g.input("x", (2, 3))
    names = [og.relu(x).name for _ in range(3)]
    assert names == ["relu", "relu_2", "relu_3"]
    assert g["relu_2"].node == g.node(g["relu_2"].node).id
    assert "relu_3" in g and "relu_4" not in g


def test_explicit_name_and_lookup():
    g = og.Graph()
    x = g.input("x", (2, 3))
    y = og.relu(x, name="act")
    assert g["act"] == y and y.name == "act"
    with pytest.raises(KeyError, match="nope"):
        g["nope"]


def test_duplicate_explicit_name_is_an_error():
    g = og.Graph("net")
    x = g.input("x", (2, 3))
    og.relu(x, name="act")
    with pytest.raises(OpgraphError, match="'act' already exists in graph 'net'"):
        og.relu(x, name="act")
    with pytest.raises(OpgraphError, match="'x' already exists"):
        g.param("x", (2,))


def test_automatic_name_skips_an_explicit_one():
    g = og.Graph()
    x = g.input("x", (2, 3))
    og.relu(x, name="relu_2")
    assert [og.relu(x).name for _ in range(2)] == ["relu", "relu_3"]


def test_scope_prefixes_names():
    g = og.Graph()
    x = g.input("x", (2, 3))
    with g.scope("block1"):
        a = og.relu(x)
        with g.scope("inner/"):  # a trailing slash is not doubled
            b = og.relu(x, name="act")
        c = og.relu(x)
    d = og.relu(x)
    assert [v.name for v in (a, b, c, d)] == ["block1/relu", "block1/inner/act", "block1/relu_2", "relu"]


def test_scope_is_left_on_error():
    g = og.Graph()
    x = g.input("x", (2, 3))
    with pytest.raises(RuntimeError):
        with g.scope("s"):
            raise RuntimeError
    assert og.relu(x).name == "relu"


def test_scoped_duplicate_is_an_error():
    g = og.Graph()
    x = g.input("x", (2, 3))
    with g.scope("s"):
        og.relu(x, name="act")
    og.relu(x, name="act")  # another name: "act" vs "s/act"
    with g.scope("s"), pytest.raises(OpgraphError, match="'s/act'"):
        og.relu(x, name="act")


# ---- values, sources, other graphs ---------------------------------------------------

def test_value_properties():
    g, x, w, y, z, s = _conv_pool_add()
    assert y.shape == (1, 4, 4, 4) and y.dtype == "float32" and y.name == "conv"
    assert isinstance(y.op, ops.Conv2d) and y.type == og.TensorType((1, 4, 4, 4))
    assert repr(y) == "<Value %2 conv: float32[1, 4, 4, 4]>"
    assert repr(g.node(2)) == ("<Node %2 conv = Conv2d(stride=2, padding=((0, 1), (1, 1)), "
                               "dilation=1, groups=1)>")


def test_sources_by_role():
    g, x, w, y, z, s = _conv_pool_add()
    og.grad(s, [w])
    assert [v.name for v in g.sources()] == ["x", "w", "add.grad_output"]
    assert [v.name for v in g.sources("param")] == ["w"]
    assert all(isinstance(v.op, Source) for v in g.sources())


def test_param_value_shape_is_checked():
    g = og.Graph()
    g.param("w", (2, 3), value=np.zeros((2, 3)))
    assert g.param_values["w"].shape == (2, 3)
    with pytest.raises(ShapeError, match=r"node v: .*\(3, 2\)"):
        g.param("v", (2, 3), value=np.zeros((3, 2)))


def test_values_of_another_graph_are_refused():
    g1, g2 = og.Graph("one"), og.Graph("two")
    a, b = g1.input("a", (2, 3)), g2.input("b", (2, 3))
    with pytest.raises(OpgraphError):
        og.add(a, b)
    with pytest.raises(OpgraphError, match="graph 'one'"):
        g1.add_node(ops.Relu(), [b])


def test_shape_error_names_the_node():
    g = og.Graph()
    a, b = g.input("a", (2, 3)), g.input("b", (3, 2))
    with pytest.raises(ShapeError, match=r"node sum \(BroadcastAdd\)"):
        og.add(a, b, name="sum")  # (2, 3) + (3, 2) do not broadcast


def test_copy_is_independent():
    g, x, w, y, z, s = _conv_pool_add()
    h = g.copy()
    og.relu(h.value(s.node), name="more")
    assert "more" in h and "more" not in g
    assert len(h) == len(g) + 1
    assert og.relu(h.value(s.node)).node == len(g) + 1  # ids continue in the copy


def test_replace_op_must_keep_the_shape():
    g, x, w, y, z, s = _conv_pool_add()
    g.replace_op(z.node, ops.AvgPool2d(kernel_size=2, stride=2))
    assert isinstance(g.node(z.node).op, ops.AvgPool2d)
    with pytest.raises(ShapeError, match="pool"):
        g.replace_op(z.node, ops.MaxPool2d(kernel_size=1, stride=1))


# ---- dump --------------------------------------------------------------------------

def test_dump_format():
    g, x, w, y, z, s = _conv_pool_add()
    assert g.dump() == """\
%0 x = Input(float32[1, 3, 8, 8])() -> float32[1, 3, 8, 8]
%1 w = Param(float32[4, 3, 3, 3])() -> float32[4, 3, 3, 3]
%2 conv = Conv2d(stride=2, padding=((0, 1), (1, 1)), dilation=1, groups=1)(%0, %1) -> float32[1, 4, 4, 4]
%3 pool = MaxPool2d(kernel_size=2, stride=2, padding=0, ceil_mode=False)(%2) -> float32[1, 4, 2, 2]
%4 add = Add()(%3, %3) -> float32[1, 4, 2, 2]"""
    assert g.dump([y]) == "\n".join(g.dump().split("\n")[:3])


def test_dump_short_forms_of_parameters():
    g = og.Graph()
    x = g.input("x", (1, 2, 9, 9), "float64")
    w = g.param("w", (2, 1, 3, 3), "float64")
    og.conv2d(x, w, stride=(2, 1), padding=(1, 2), dilation=(1, 1), groups=2, name="c")
    assert g.dump().split("\n")[-1] == (
        "%2 c = Conv2d(stride=(2, 1), padding=(1, 2), dilation=1, groups=2)(%0, %1) "
        "-> float64[1, 2, 5, 11]")


def test_source_shapes_and_dtypes_are_validated_naming_the_node():
    import pytest as _pytest
    g = og.Graph()
    with _pytest.raises(og.ShapeError, match=r"node x: shape \(2, -3, 4, 4\)"):
        g.input("x", (2, -3, 4, 4))
    with _pytest.raises(og.ShapeError, match="node w: dtype 'int8'"):
        g.param("w", (2, 3), "int8")
    assert g.input("empty_batch", (0, 3, 4, 4)).shape == (0, 3, 4, 4)  # batch 0 is valid


def test_a_source_shape_of_one_int_is_1d_and_other_non_sequences_are_named():
    """As torch.empty(5) (and layer_norm(x, 5) here): one int is a 1-D shape;
    anything else that is not a sequence was "'float' object is not iterable"."""
    g = og.Graph()
    assert g.input("c", 5).shape == (5,)
    assert g.param("p", np.int64(3)).shape == (3,)
    assert g.buffer("b", 2, value=1.0).shape == (2,)
    with pytest.raises(og.ShapeError, match=r"node d: shape 5.0 is not a sequence of dimensions"):
        g.input("d", 5.0)
    with pytest.raises(og.ShapeError, match=r"node e: shape True is not a sequence of dimensions"):
        g.input("e", True)  # a bool is no dimension
    with pytest.raises(og.ShapeError, match=r"node f: shape \(2, None\): every dimension must be an int >= 0"):
        g.input("f", (2, None))
    with pytest.raises(og.ShapeError, match=r"node n: shape \(-1,\): every dimension must be an int >= 0"):
        g.input("n", -1)


def test_rewiring_is_checked_before_anything_changes():
    """rewrite validates count and shapes first (naming the node) and keeps
    the graph intact when it refuses; replace_op refuses a changed dtype."""
    import attrs

    g = og.Graph()
    x = g.input("x", (2, 3, 4, 4))
    flat = g.input("flat", (2, 48))
    r = og.relu(x, name="r")
    s = og.relu(r, name="s")
    before = g.dump()
    with pytest.raises(ShapeError, match="node s .*takes 1 inputs, got 2"):
        g.rewrite(s.node, s.op, [x, x])
    with pytest.raises(ShapeError, match="node s: rewiring changes the output"):
        g.rewrite(s.node, s.op, [flat])
    assert g.dump() == before
    g.nx.nodes[s.node]["type"] = attrs.evolve(g.node(s.node).type, layout="NHWC")
    g.rewrite(s.node, s.op, [x])  # same shape: allowed, layout kept
    assert g.node(s.node).type.layout == "NHWC" and g.input_ids(s.node) == [x.node]


def test_replace_op_refuses_another_shape_or_dtype():
    import attrs

    from opgraph.op import Op
    from opgraph.ops.tensor import Reshape

    @attrs.frozen
    class Widen(Op):
        kind = "widen"

        def infer(self, x):
            return attrs.evolve(x, dtype="float64")

    g = og.Graph()
    x = g.input("x", (2, 3))
    y = og.relu(x, name="y")
    with pytest.raises(ShapeError, match=r"node y: replacing Relu by Reshape changes the output "
                                         r"float32\[2, 3\] -> float32\[3, 2\]"):
        g.replace_op(y.node, Reshape(shape=(3, 2)))
    with pytest.raises(ShapeError, match=r"node y: replacing Relu by Widen changes the output "
                                         r"float32\[2, 3\] -> float64\[2, 3\]"):
        g.replace_op(y.node, Widen())
    assert isinstance(g.node(y.node).op, ops.Relu)


def test_non_values_are_refused_by_name():
    g = og.Graph()
    x = g.input("x", (2, 3))
    y = og.relu(x)
    with pytest.raises(OpgraphError, match=r"got str 'x' \(look it up with graph\['x'\]\)"):
        og.grad(y, ["x"])


def test_rewiring_refuses_cycles_foreign_values_and_dtype_changes():
    g = og.Graph()
    x = g.input("x", (2, 3))
    x64 = g.input("x64", (2, 3), dtype="float64")
    r = og.relu(x, name="r")
    r2 = og.relu(r, name="r2")
    other = og.Graph()
    foreign = other.input("f", (2, 3))
    before = g.dump()
    with pytest.raises(OpgraphError, match="node r: reading r2 would make a cycle"):
        g.rewrite(r.node, r.op, [r2])
    with pytest.raises(OpgraphError, match="node r: reading r would make a cycle"):
        g.rewrite(r.node, r.op, [r])
    with pytest.raises(OpgraphError, match="node r: input .* is not a value of graph"):
        g.rewrite(r.node, r.op, [foreign])
    with pytest.raises(OpgraphError, match="is not a value of graph"):
        g.rewrite(r.node, r.op, ["x"])
    with pytest.raises(ShapeError, match=r"node r: rewiring changes the output float32\[2, 3\] -> float64"):
        g.rewrite(r.node, r.op, [x64])
    with pytest.raises(ShapeError, match="node r .*Add takes 2 inputs, got 1"):
        g.replace_op(r.node, ops.Add())
    assert g.dump() == before


def test_grad_checks_its_arguments():
    g = og.Graph()
    x = g.input("x", (2, 3))
    w = g.param("w", (2, 3))
    y = og.add(og.relu(x, name="r"), w, name="y")
    with pytest.raises(OpgraphError, match="outputs must be a value or a list of values.*got str 'y'"):
        og.grad("y", [w])
    with pytest.raises(OpgraphError, match="no_grad must hold values.*got NoneType"):
        og.grad(y, [w], no_grad=[None])
    with pytest.raises(OpgraphError, match="0 grad_outputs for 1 outputs"):
        og.grad(y, [w], grad_outputs=[])
    with pytest.raises(OpgraphError, match="grad_outputs keys must be the outputs"):
        og.grad(y, [w], grad_outputs={x: x})
    with pytest.raises(OpgraphError, match="a cotangent must be a value of the outputs' graph"):
        og.grad(y, [w], grad_outputs=["z"])
    (gw,) = og.grad(y, [w], grad_outputs={y: x})  # a proper cotangent still works
    assert gw.shape == (2, 3)


def test_grad_names_an_array_given_as_grad_outputs_by_shape_and_dtype():
    """Arrays are fed at run time; the message names one by shape and dtype
    instead of printing its elements (list() split a (2, 3) array into two
    rows: "2 grad_outputs for 1 outputs")."""
    g = og.Graph()
    x, w = g.input("x", (2, 3)), g.param("w", (2, 3))
    y = og.add(x, w, name="y")
    gy = np.full((2, 3), 0.123456789)
    for given in (gy, gy[:1]):
        with pytest.raises(OpgraphError, match=r"grad_outputs must be values of the graph .*got ndarray of shape "
                                               rf"\({given.shape[0]}, 3\) and dtype float64; arrays are fed when "
                                               r"the compiled graph runs: run\(..., grad_outputs=\{y: array\}\)"
                                               ) as err:
            og.grad(y, [w], grad_outputs=given)
        assert "0.123" not in str(err.value)
    with pytest.raises(OpgraphError, match=r"a cotangent must be a value of the outputs' graph, got ndarray of "
                                           r"shape \(2, 3\) and dtype float64; arrays are fed") as err:
        og.grad(y, [w], grad_outputs=[gy])
    assert "0.123" not in str(err.value)
    with pytest.raises(OpgraphError, match=r"outputs must be a value or a list of values .*got ndarray of shape"):
        og.grad(gy, [w])


def test_rewrite_swaps_op_and_inputs_at_once_keeping_id_and_layout():
    """A padding moved into an explicit Pad node: neither the new op on the old
    input nor the old op on the new input has the node's type, both at once do."""
    import attrs

    g = og.Graph()
    x = g.input("x", (1, 2, 6, 6))
    w = g.param("w", (3, 2, 3, 3))
    y = og.conv2d(x, w, padding=((0, 1), (1, 0)), name="conv")
    r = og.relu(y, name="r")
    g.nx.nodes[y.node]["type"] = attrs.evolve(y.type, layout="NHWC")
    padded = g.add_node(ops.Pad(padding=((0, 1), (1, 0))), [x], name="conv/pad")
    unpadded = ops.Conv2d()
    with pytest.raises(ShapeError, match="node conv"):
        g.replace_op(y.node, unpadded)
    g.rewrite(y.node, unpadded, [padded, w])
    assert g.node(y.node).op == unpadded and g.input_ids(y.node) == [padded.node, w.node]
    assert g.node(y.node).type.layout == "NHWC" and g.input_ids(r.node) == [y.node]


def test_set_layout():
    g = og.Graph()
    x = g.input("x", (1, 2, 6, 6))
    flat = og.flatten(x, name="flat")
    g.set_layout(x.node, "NHWC")
    assert x.type.layout == "NHWC" and x.type.shape == (1, 2, 6, 6)
    with pytest.raises(og.ParameterError, match="node x: parameter layout='nhwc'"):
        g.set_layout(x.node, "nhwc")
    with pytest.raises(og.ParameterError, match="node flat: .*only 4-D values"):
        g.set_layout(flat.node, "NCHW")
