"""compile(), pipelines, and the small passes: memory, layout, fuse, verify."""

import numpy as np
import pytest

import opgraph as og
from opgraph.errors import LoweringError, ParameterError
from opgraph.passes.base import FunctionPass, PassContext, Pipeline, graph_pass
from opgraph.passes.fuse import epilogue_chains, pool_relu_backward_pairs
from opgraph.passes.layout import LayoutPass
from opgraph.passes.lower import LowerPass
from opgraph.passes.memory import plan_memory
from opgraph.passes.pipelines import build
from opgraph.passes.policy import LoweringPolicy
from opgraph.passes.verify import VerifyPass

from passes_stubs import Scale, install_scale_rules


def small_model():
    g = og.Graph()
    x = g.input("x", (2, 3, 8, 8))
    w = g.param("w", (4, 3, 3, 3))
    b = g.param("b", (4,))
    y = og.max_pool2d(og.relu(og.conv2d(x, w, b, padding=1, name="conv1"), name="relu1"), 2, name="pool1")
    return g, y


def test_compile_runs_the_default_pipeline_and_reports():
    g, y = small_model()
    before = g.dump()
    exe = og.compile(y)
    assert g.dump() == before  # compile never modifies the user's graph
    r = exe.report
    assert r.pipeline == "default" and r.device == "cpu"
    assert [n for n, _ in r.passes] == ["layout", "legalize", "lower", "fuse", "memory", "verify"]
    assert r.choices["conv1"].startswith("gemm[cpu]:Conv2d")
    assert exe.report() == r.format()  # the old Executable.report() call still gives the table
    assert "conv1" in exe.report() and exe.choices["conv1"] == r.choices["conv1"]
    assert r.memory["planned_peak_bytes"] > 0
    assert "autotune" in [n for n, _ in og.compile(y, policy=LoweringPolicy(
        autotune=True, cache="off")).report.passes]


def test_compile_accepts_policy_as_dict_or_toml(tmp_path):
    g, y = small_model()
    assert og.compile(y, policy={"prefer": {"conv": "fft"}}).report.node("conv1").algorithm == "fft"
    path = tmp_path / "p.toml"
    path.write_text('[prefer]\nconv = "direct"\n')
    assert og.compile(y, policy=str(path)).report.node("conv1").algorithm == "direct"
    with pytest.raises(TypeError):
        og.compile(y, policy=3)


def test_reference_pipeline_lowers_everything_to_the_oracle():
    g, y = small_model()
    exe = og.compile(y, pipeline="reference", policy={"force": {"conv1": "fft"}})  # policy ignored
    assert {s.op.algorithm for s in exe.steps} <= {"reference", "direct"}
    with pytest.raises(ParameterError, match="pipeline"):
        build("fastest", LoweringPolicy())


def test_a_misspelt_pipeline_name_suggests_the_close_one():
    g, y = small_model()
    with pytest.raises(ParameterError, match=r"pipeline='refrence': .*\(did you mean 'reference'\?\)"):
        og.compile(y, pipeline="refrence")


def test_the_reference_pipeline_notes_the_policy_keys_it_ignores():
    """Fresh-user report: ``pipeline='reference'`` with ``prefer`` or autotune
    compiled silently; it runs the oracle whatever the policy says."""
    g, y = small_model()
    exe = og.compile(y, pipeline="reference", policy={"prefer": {"conv": "fft"}, "autotune": True, "cache": "off"})
    assert ("pipeline 'reference': every node runs the oracle kernels, so the policy's prefer, autotune, cache "
            "have no effect (pipeline='default' reads them)") in exe.report.notes
    assert "autotune" not in [n for n, _ in exe.report.passes]
    assert not any("pipeline 'reference'" in n for n in og.compile(y, pipeline="reference").report.notes)


@pytest.mark.parametrize("precision, dtype, computed", [
    ("tf32", None, "float32"), ("bf16", None, "float32"), ("bf16", "bfloat16", "float32 from bfloat16 storage"),
    ("fp16", "float64", "float64")])
def test_a_precision_no_cpu_kernel_takes_is_noted(precision, dtype, computed):
    """Fresh-user report: ``precision='tf32'`` or ``'bf16'`` on the CPU was ignored
    without a word by ``compile`` (the benchmark said it): no CPU kernel takes a
    precision, each computes as for its storage. The words are the benchmark's
    (``opgraph.precision.unapplied_note``)."""
    g, y = small_model()
    exe = og.compile(y, device="cpu", policy={"precision": precision}, dtype=dtype)
    assert (f"precision {precision} requested, but no kernel of this lowering takes a precision option "
            f"(none on the CPU does): it computed in {computed}") in exe.report.notes
    exe = og.compile(y, device="cpu", dtype="bfloat16")  # fp32 on half storage is the storage's own: nothing to say
    assert not any(n.startswith("precision") for n in exe.report.notes)


def test_verify_catches_a_pipeline_without_lower():
    g, y = small_model()
    with pytest.raises(LoweringError, match="conv1 .*abstract"):
        og.compile(y, pipeline=Pipeline("broken", [VerifyPass()]))


def test_pipeline_records_timings_and_keeps_outputs():
    g, y = small_model()
    seen = []

    @graph_pass("spy")
    def spy(graph, outputs, ctx):
        seen.append((graph is g, [v.node for v in outputs]))
        return graph

    ctx = PassContext()
    out, outs = Pipeline("p", [spy, LowerPass(), spy]).run(g, [y], ctx)
    assert seen == [(False, [y.node]), (False, [y.node])]  # each pass got a copy
    assert [n for n, _ in ctx.report.passes] == ["spy", "lower", "spy"]
    assert outs[0].graph is out and outs[0].node == y.node


def test_a_pass_dropping_an_output_is_an_error():
    g, y = small_model()

    def drop(graph, outputs, ctx):
        graph.nx.remove_node(outputs[0].node)
        return graph

    with pytest.raises(og.OpgraphError, match="pass drop"):
        Pipeline("p", [FunctionPass("drop", drop)]).run(g, [y], PassContext())


def test_memory_plan_by_hand(monkeypatch):
    # chain x -> r1 -> r2 -> r3 of float32[4, 4] (64 B each): r1 is freed after r2 ran
    g = og.Graph()
    x = g.input("x", (1, 1, 4, 4))
    r3 = og.relu(og.relu(og.relu(x)))
    plan = plan_memory(g, [r3])
    assert plan["planned_peak_bytes"] == 128 and plan["source_bytes"] == 64
    assert plan["no_reuse_bytes"] == 192 and plan["workspace_peak_bytes"] == 0
    assert plan_memory(g, [r3], dtype="float64")["planned_peak_bytes"] == 256
    # a lowered node's declared workspace is live during its step only
    install_scale_rules(monkeypatch, ["reference", "big"])
    g = og.Graph()
    x = g.input("x", (4, 4))
    s = g.add_node(Scale(), [og.relu(x)], name="s")
    out, _ = Pipeline("p", [LowerPass(og.LoweringPolicy(force={"s": "big"}))]).run(g, [s], PassContext())
    plan = plan_memory(out, [s])
    assert plan["workspace_peak_bytes"] == 10**9
    assert plan["planned_peak_bytes"] == 64 + 64 + 10**9 and plan["peak_step"] == "s"


def test_layout_records_nchw_and_notes_nhwc_ignored_on_cpu():
    g, y = small_model()
    ctx = PassContext(policy=LoweringPolicy(layout="NHWC"))
    out = LayoutPass()(g, [y], ctx)
    layouts = {v.name: v.type.layout for v in out.nodes_in_order([y])}
    assert layouts["conv1"] == "NCHW" and layouts["x"] == "NCHW" and layouts["b"] is None
    assert any("NHWC requested but ignored on cpu" in n for n in ctx.report.notes)


def test_layout_assigns_nhwc_on_cuda_with_transposes_only_at_sources():
    g, y = small_model()
    ctx = PassContext(device="cuda", policy=LoweringPolicy(layout="NHWC"))
    out = LayoutPass()(g, [y], ctx)
    views = list(out.nodes_in_order([y]))
    four_d = [v for v in views if v.type.ndim == 4]
    assert four_d and all(v.type.layout == "NHWC" for v in four_d)
    assert all(v.type.layout is None for v in views if v.type.ndim != 4)
    n_sources = sum(1 for v in four_d if v.op.__class__.__name__ == "Source")
    assert any(f"{len(four_d)} 4-D values stored NHWC, {n_sources} transposes" in n for n in ctx.report.notes)


def test_executable_feeds_nhwc_sources_channels_last_and_values_do_not_change():
    """A source stamped NHWC is stored channels-last; the numbers stay the same."""
    from opgraph.types import to_layout
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 3, 4, 5))
    cl = to_layout(np, a, "NHWC")
    assert cl.shape == a.shape and cl.strides[1] == a.itemsize and np.array_equal(cl, a)
    assert to_layout(np, a, "NCHW") is a and to_layout(np, a[0, 0], "NHWC").shape == (4, 5)
    g, y = small_model()
    run = og.compile([y], pipeline="reference")
    lowered = run.graph
    src = lowered["x"].node
    lowered.nx.nodes[src]["type"] = lowered.node(src).type.__class__(
        lowered.node(src).type.shape, "float32", "NHWC")
    feeds = {s.name: rng.standard_normal(s.type.shape).astype(np.float32) for s in run.sources}
    slots = run.feed(feeds)
    assert slots[src].strides[1] == 4  # channels-last storage
    (got,) = run(**feeds)
    (want,) = og.compile([y], pipeline="reference")(**feeds)
    np.testing.assert_array_equal(got, want)


def fusable_chains(g, outputs):
    """``(conv, activation)`` node pairs of the forward epilogue chains."""
    return [(c.conv, c.act) for c in epilogue_chains(g, outputs)]


def _names(g, chains):
    return [(g.node(c).name, g.node(r).name) for c, r in chains]


def test_fuse_finds_conv_bias_relu_chains_only_when_private():
    g, y = small_model()
    assert _names(g, fusable_chains(g, [y])) == [("conv1", "relu1")]
    dx, = og.grad(y, [g["x"]])  # relu's gradient reads relu1's output: still private
    assert _names(g, fusable_chains(g, [y, dx])) == [("conv1", "relu1")]
    conv = g["conv1"]
    assert fusable_chains(g, [y, dx, conv]) == []  # the conv output is wanted itself
    h = og.Graph()
    x, w, b = h.input("x", (1, 2, 5, 5)), h.param("w", (2, 2, 1, 1)), h.param("b", (2,))
    r = og.relu(og.bias_add(og.conv2d(x, w, name="c"), b, name="ba"), name="r")
    assert fusable_chains(h, [r]) == []  # no bias input on the conv: not this pattern
    r2 = og.relu(og.conv2d(x, w, b, name="c2"), name="r2")
    assert _names(h, fusable_chains(h, [r2])) == []  # r2 is the output itself
    s = og.softmax(og.flatten(r2))
    assert _names(h, fusable_chains(h, [s])) == [("c2", "r2")]


@pytest.mark.parametrize("algorithm", ["gemm", "direct", "winograd", "fft"])
def test_fuse_rewrites_training_graph_and_keeps_the_numbers(algorithm):
    g = og.Graph()
    x, w, b = g.input("x", (2, 3, 6, 6)), g.param("w", (4, 3, 3, 3)), g.param("b", (4,))
    w2 = g.param("w2", (2, 4, 1, 1))
    r = og.relu(og.conv2d(x, w, b, padding=1, name="conv1"), name="relu1")
    y = og.conv2d(r, w2, name="conv2")
    grads = og.grad(y, [x, w, b, w2])
    outs = [y, *grads]
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 3, 6, 6)), "w": rng.standard_normal((4, 3, 3, 3)),
             "b": rng.standard_normal(4), "w2": rng.standard_normal((2, 4, 1, 1))}
    gy = {y: rng.standard_normal(y.shape)}
    exe = og.compile(outs, policy=og.LoweringPolicy(prefer={"conv": [algorithm]}))
    fused = exe.graph["conv1"].op
    assert fused.op.name == "Conv2dBiasRelu" and fused.algorithm == algorithm
    assert "relu1" not in exe.graph
    assert any("1 conv + bias + relu chain(s) fused" in n for n in exe.report.notes)
    ref = og.compile(outs, pipeline="reference", dtype="float64")(grad_outputs=gy, **feeds)
    for got, want in zip(exe(grad_outputs=gy, **feeds), ref):
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-3
    off = og.compile(outs, policy=og.LoweringPolicy(prefer={"conv": [algorithm]}, exclude=["fused"]))
    assert off.graph["conv1"].op.op.name == "Conv2d" and "relu1" in off.graph


def test_end_to_end_training_graph_matches_reference():
    g, y = small_model()
    gx, gw, gb = og.grad(y, [g["x"], g["w"], g["b"]])
    outs = [y, gx, gw, gb]
    rng = np.random.default_rng(0)
    feeds = dict(x=rng.standard_normal((2, 3, 8, 8)), w=rng.standard_normal((4, 3, 3, 3)),
                 b=rng.standard_normal(4))
    gy = rng.standard_normal(y.shape)
    ref = og.compile(outs, pipeline="reference", dtype="float64")(grad_outputs={y: gy}, **feeds)
    for lowering in ("gemm", "fft", "winograd", "direct"):
        exe = og.compile(outs, policy=LoweringPolicy.from_cli(f"conv={lowering}"))
        got = exe(grad_outputs={y: gy}, **feeds)
        assert {r.algorithm for r in exe.report.nodes.values() if r.op_type.startswith("Conv")} == {lowering}
        for a, b in zip(got, ref):
            assert np.linalg.norm(a - b) <= 1e-3 * np.linalg.norm(b)


def test_compile_refuses_a_non_float_dtype_and_feeds_are_named():
    from opgraph.errors import ExecutionError, ParameterError

    g, y = small_model()
    for bad in ("int64", "complex64", np.int32):
        with pytest.raises(ParameterError, match="dtype=.*: must be one of float16"):
            og.compile(y, dtype=bad)
    for good, name in ((np.float32, "float32"), ("f8", "float64"), ("float16", "float16")):
        assert og.compile(y, dtype=good).dtype == name  # NumPy spellings are normalised
    exe = og.compile(y)
    feeds = {"x": np.zeros((2, 3, 8, 8)), "w": np.zeros((4, 3, 3, 3)), "b": "hello"}
    with pytest.raises(ExecutionError, match="param 'b': cannot be read as float32"):
        exe(**feeds)


def test_a_bfloat16_graph_compiled_in_float64_computes_in_float64():
    # the float64 oracle of a bf16 run: compile(dtype="float64") must replace
    # bfloat16 like the other floating dtypes (it once kept bf16: "bfloat16"
    # does not start with "float", and the check compared bf16 with itself)
    from opgraph.types import numpy_dtype

    bf = numpy_dtype("bfloat16")
    g = og.Graph()
    x, w = g.input("x", (2, 3, 8, 8), "bfloat16"), g.param("w", (4, 3, 3, 3), "bfloat16")
    y = og.conv2d(x, w, padding=1)
    rng = np.random.default_rng(0)
    xv, wv = rng.standard_normal((2, 3, 8, 8)).astype(bf), rng.standard_normal((4, 3, 3, 3)).astype(bf)
    (hi,) = og.compile(y, pipeline="reference", dtype="float64")(x=xv, w=wv)
    (lo,) = og.compile(y)(x=xv, w=wv)
    assert hi.dtype == np.float64 and lo.dtype == bf
    want = og.compile(y, pipeline="reference", dtype="float64")(x=xv.astype(np.float64),
                                                               w=wv.astype(np.float64))[0]
    np.testing.assert_array_equal(hi, want)
    # the bf16 output is that value rounded once (fp32 accumulation): within half a bf16 ulp
    err = np.abs(lo.astype(np.float64) - hi)
    assert 0 < err.max() and np.all(err <= np.abs(hi) * 2.0 ** -8 + 1e-6)


def _pooled_relu(second_reader: bool = False):
    g = og.Graph()
    x, w, b = g.input("x", (2, 3, 8, 8)), g.param("w", (4, 3, 3, 3)), g.param("b", (4,))
    r = og.relu(og.conv2d(x, w, b, padding=1, name="conv1"), name="relu1")
    y = og.flatten(og.max_pool2d(r, 2, name="pool1"))
    if second_reader:  # the ReLU output read twice: its gradient is a sum (GoogLeNet's inception)
        w2 = g.param("w2", (2, 4, 8, 8))
        y = og.concat([y, og.flatten(og.conv2d(r, w2, name="conv2"))], dim=1, name="cat")
    return g, y, og.grad(y, [w, b] + ([g["w2"]] if second_reader else []))


def test_fuse_finds_pooled_relu_gradients_only_when_private():
    g, y, grads = _pooled_relu()
    pairs = pool_relu_backward_pairs(g, [y, *grads])
    assert [(type(g.node(p).op).__name__, type(g.node(r).op).__name__) for p, r in pairs] == [
        ("MaxPool2dBackward", "ReluBackward")]
    pool_grad = pairs[0][0]
    assert pool_relu_backward_pairs(g, [y, *grads, g.node(pool_grad).output]) == []  # wanted itself
    g2, y2, grads2 = _pooled_relu(second_reader=True)
    assert pool_relu_backward_pairs(g2, [y2, *grads2]) == []  # the ReLU gradient reads a sum
    # the pooling gradient read by another node too, and a mask that is not the pooled tensor
    h = og.Graph()
    a, b2, gy = h.input("a", (1, 2, 4, 4)), h.input("b", (1, 2, 4, 4)), h.input("gy", (1, 2, 2, 2))
    params = dict(kernel_size=(2, 2), stride=(2, 2), padding=((0, 0), (0, 0)), ceil_mode=False)
    pg = h.apply(og.ops.MaxPool2dBackward, params, [a, gy], "pg")
    masked = h.apply(og.ops.ReluBackward, {}, [a, pg], "masked")
    assert _names(h, pool_relu_backward_pairs(h, [og.flatten(masked)])) == [("pg", "masked")]
    shared = og.add(masked, pg, name="shared")
    assert pool_relu_backward_pairs(h, [shared]) == []
    other = h.apply(og.ops.ReluBackward, {}, [b2, h.apply(og.ops.MaxPool2dBackward, params, [a, gy])])
    assert pool_relu_backward_pairs(h, [og.flatten(other)]) == []


def test_fuse_pool_relu_backward_keeps_the_numbers_and_can_be_excluded():
    g, y, grads = _pooled_relu()
    outs = [y, *grads]
    rng = np.random.default_rng(2)
    feeds = {"x": rng.standard_normal((2, 3, 8, 8)), "w": rng.standard_normal((4, 3, 3, 3)),
             "b": rng.standard_normal(4)}
    gy = {y: rng.standard_normal(y.shape)}
    exe = og.compile(outs)
    kinds = [type(st.op.op).__name__ for st in exe.steps]
    assert kinds.count("MaxPool2dBackwardRelu") == 1 and "MaxPool2dBackward" not in kinds
    assert kinds.count("ReluBackward") == 0
    assert any("1 max-pool + relu backward pair(s) fused" in n for n in exe.report.notes)
    off = og.compile(outs, policy=og.LoweringPolicy(exclude=["fused"]))
    assert "MaxPool2dBackwardRelu" not in [type(st.op.op).__name__ for st in off.steps]
    ref = og.compile(outs, pipeline="reference", dtype="float64")(grad_outputs=gy, **feeds)
    unfused = off(grad_outputs=gy, **feeds)
    for got, same, want in zip(exe(grad_outputs=gy, **feeds), unfused, ref):
        np.testing.assert_array_equal(got, same)  # the same operations in the same order
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5


def test_fusion_keeps_a_forced_choice_of_the_absorbed_node():
    g = og.Graph()
    x, w, b = g.input("x", (1, 3, 6, 6)), g.param("w", (4, 3, 3, 3)), g.param("b", (4,))
    y = og.flatten(og.relu(og.conv2d(x, w, b, padding=1, name="conv1"), name="relu1"))
    forced = og.compile([y], policy=og.LoweringPolicy(prefer={"conv": ["gemm"]}, force={"relu1": "reference"}))
    assert "relu1" in forced.graph and forced.graph["conv1"].op.op.name == "Conv2d"
    assert any("relu1 is forced to reference, conv1 runs gemm" in n for n in forced.report.notes)
    # a force naming the algorithm the fused node runs is honoured by fusing
    same = og.compile([y], policy=og.LoweringPolicy(prefer={"conv": ["reference"]},
                                                    force={"relu1": "reference"}))
    assert "relu1" not in same.graph and same.graph["conv1"].op.op.name == "Conv2dBiasRelu"


@pytest.mark.parametrize("dtype", [None, "float64"])
def test_every_step_context_carries_its_node_type(dtype):
    """The executor gives each kernel its node's inferred output type (as it
    runs: ``compile(dtype=...)`` replaces the floating dtype), so kernels read
    their output size instead of computing it."""
    g, y = small_model()
    exe = og.compile(og.grad(y, [g["w"]]) + [y], dtype=dtype)
    for st in exe.steps:
        t = exe.graph.node(st.node).type
        assert st.ctx.out_type.shape == t.shape and st.ctx.out_type.layout == t.layout
        assert st.ctx.out_type.dtype == (dtype or t.dtype)
