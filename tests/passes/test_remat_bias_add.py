"""The ``bias-remat`` fusion rule (``passes/remat_bias_add.py``): where it
fires (a ConvNeXt block compiled for cuda without a GPU, cuDNN's checks
stubbed: its first Linear's bias add fused with the GELU in the forward and,
recomputed, with the GELU's gradient in the backward), where it must not (the
rule or the element-wise chains excluded, no fused chain to follow on the
CPU's oracle, an add of two full tensors, an add a matrix product reads, an
add that is an output), the memory plan, and the training step's values on
the CPU's oracle against the float64
reference and the same compile without the rule (the step on the emulated
kernels: ``tests/backends/test_codegen_layer_norm_step.py``)."""

from __future__ import annotations

import collections

import pytest

import opgraph as og
from opgraph import ops
from opgraph.op import Lowered

import modern_blocks
from fused_training_steps import rule_on_and_off
from passes_stubs import compile_for_cuda, cudnn_accepts


def block():
    return modern_blocks.convnext_block("scale", (2, 8, 3, 5))


def step(make=block):
    y, params, _ = make()
    return [y, *og.grad(y, params, grad_outputs=[y])]


def remats(notes) -> int:
    """How many copies the rule made, from the fuse pass's note."""
    found = [n for n in notes if "recomputed for an element-wise reader fused" in n]
    return int(found[0].split()[1]) if found else 0


def members(graph, outs) -> collections.Counter:
    """Op names of the lowered steps, a fused chain's members counted as ``member:<op>`` too."""
    c = collections.Counter()
    for v in graph.nodes_in_order(outs):
        if isinstance(v.op, Lowered):
            c[v.op.op.name] += 1
            for m in getattr(v.op.op, "members", ()):
                c["member:" + m] += 1
    return c


def chains_with(graph, outs, *names) -> list[tuple[str, ...]]:
    """The member lists of the fused chains holding every op of ``names``."""
    return [v.op.op.members for v in graph.nodes_in_order(outs) if isinstance(v.op, Lowered)
            and set(names) <= set(getattr(v.op.op, "members", ()))]


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_the_first_linear_bias_fuses_with_the_gelu_and_its_gradient_on_cuda(monkeypatch, layout, dtype):
    cudnn_accepts(monkeypatch)
    graph, outs, report = compile_for_cuda(step(), og.LoweringPolicy(layout=layout), dtype=dtype)
    assert remats(report.notes) == 1
    assert chains_with(graph, outs, "BroadcastAdd", "Gelu") and chains_with(graph, outs, "BroadcastAdd", "GeluBackward")
    assert not members(graph, outs)["Gelu"] and not members(graph, outs)["GeluBackward"]
    # the second Linear's bias is read through a transpose by one node: it stays a step of its own
    assert members(graph, outs)["BroadcastAdd"] == 1
    copies = [v for v in graph.nodes_in_order(outs) if v.name.endswith("/remat")]
    assert not copies  # absorbed into the gradient's chain: the copy's record is listed there
    fused = [r for r in report.nodes.values() if any(a.endswith("/remat") for a in r.absorbed)]
    assert len(fused) == 1 and fused[0].algorithm == "codegen"


def test_without_it_the_add_is_written_once_and_read_twice(monkeypatch):
    cudnn_accepts(monkeypatch)
    graph, outs, report = compile_for_cuda(step(), og.LoweringPolicy(layout="NHWC", exclude=["bias-remat"]))
    assert remats(report.notes) == 0
    assert members(graph, outs)["BroadcastAdd"] == 2 and members(graph, outs)["Gelu"] == 1
    assert any("bias-remat" in n and "excluded by policy" in n for n in report.notes)


def test_with_the_chains_excluded_it_declines_saying_why(monkeypatch):
    cudnn_accepts(monkeypatch)
    graph, outs, report = compile_for_cuda(step(), og.LoweringPolicy(layout="NHWC", exclude=["elementwise"]))
    assert remats(report.notes) == 0 and members(graph, outs)["BroadcastAdd"] == 2
    assert any("bias-remat: not applied" in n and "elementwise rule is excluded" in n
               for n in report.notes), report.notes


def test_on_the_oracle_without_the_opt_in_it_waits_for_it_saying_why():
    """Listed as waiting for ``include=['fused-reference']`` (``opt_in``), as the element-wise
    rules are, not as declined matches."""
    exe = og.compile(step(), device="cpu")
    assert remats(exe.report.notes) == 0
    assert any("bias-remat: not applied" in n and "no fused chain would take the add in" in n
               and "fused-reference" in n for n in exe.report.notes), exe.report.notes
    assert exe.report.fusion["bias-remat"] == {"applied": 0, "declined": 0, "opt_in": True}


def _add_graph(b_shape, reader):
    """``z = x + b`` (``b`` of ``b_shape``) read by ``relu(z)`` and by ``reader(z)``; the
    training step's outputs."""
    g = og.Graph("add")
    x, b = g.input("x", (2, 4, 3, 8)), g.param("b", b_shape)
    z = g.apply(ops.BroadcastAdd, {}, [x, b])  # a BroadcastAdd even for equal shapes (og.add makes an Add)
    y = og.add(og.relu(z), reader(z, g))
    return [y, *og.grad(y, [x, b], grad_outputs=[y])]


def test_an_add_of_two_full_tensors_is_not_recomputed(monkeypatch):
    """A copy would read both operands: twice the bytes of reading ``z`` (the same graph with a
    ``(8,)`` bias is recomputed: ``test_a_bias_add_read_by_two_activations_is_recomputed``)."""
    cudnn_accepts(monkeypatch)
    graph, outs, report = compile_for_cuda(_add_graph((2, 4, 3, 8), lambda z, g: og.sigmoid(z)))
    assert remats(report.notes) == 0
    assert members(graph, outs)["BroadcastAdd"] + members(graph, outs)["member:BroadcastAdd"] == 1


def test_a_bias_add_read_by_two_activations_is_recomputed(monkeypatch):
    cudnn_accepts(monkeypatch)
    graph, outs, report = compile_for_cuda(_add_graph((8,), lambda z, g: og.sigmoid(z)))
    assert remats(report.notes) >= 1
    assert members(graph, outs)["BroadcastAdd"] == 0


def test_an_add_a_matrix_product_reads_is_not_recomputed(monkeypatch):
    """The product needs ``z`` written: a copy for the activation would save nothing and keep
    ``x`` alive beside it."""
    cudnn_accepts(monkeypatch)

    def product(z, g):
        w = g.param("w", (8, 8))
        return og.reshape(og.matmul(og.reshape(z, (-1, 8)), w), (2, 4, 3, 8))

    graph, outs, report = compile_for_cuda(_add_graph((8,), product))
    assert remats(report.notes) == 0
    assert members(graph, outs)["BroadcastAdd"] == 1


def test_an_add_that_is_an_output_is_not_recomputed(monkeypatch):
    cudnn_accepts(monkeypatch)
    g = og.Graph("out")
    x, b = g.input("x", (2, 4, 3, 8)), g.param("b", (8,))
    z = g.apply(ops.BroadcastAdd, {}, [x, b])
    y = og.gelu(z)
    graph, outs, report = compile_for_cuda([y, z, *og.grad(y, [b], grad_outputs=[y])])
    assert remats(report.notes) == 0


def test_the_memory_plan_keeps_the_product_instead_of_the_sum(monkeypatch):
    """The copy keeps the Linear's product to the backward instead of the sum: the planned peak
    does not grow."""
    cudnn_accepts(monkeypatch)
    peaks = []
    for exclude in ([], ["bias-remat"]):
        _, _, report = compile_for_cuda(step(), og.LoweringPolicy(layout="NHWC", exclude=exclude),
                                                   dtype="bfloat16")
        peaks.append(report.memory["activation_peak_bytes"])
    assert peaks[0] <= peaks[1], peaks


def test_the_step_on_the_oracle_matches_the_reference():
    """Opted in on the CPU (``include=['fused-reference']``) the rule fires and the step's outputs
    equal the float64 reference and the compile without it."""
    on, off, errors = rule_on_and_off(block, "bias-remat")
    assert remats(on.report.notes) == 1 and remats(off.report.notes) == 0
    for fe, ue, fu in errors:
        assert fe < 1e-4 and fu < 1e-5, (fe, ue, fu)
