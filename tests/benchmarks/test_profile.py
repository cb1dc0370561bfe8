"""``opgraph-bench --profile`` (benchmarks/profile.py, profile_table.py) on the CPU:
every step accounted once, bytes and FLOPs of a convolution and a ReLU as
computed by hand from their shapes, rows grouped by op type and direction,
the fractions against the limits, the JSON document, and the command line."""

from __future__ import annotations

import json

import pytest

from opgraph.backends.copy_bandwidth import measure_copy_bandwidth
from opgraph.benchmarks import cli, profile as pf
from opgraph.benchmarks.protocol import random_feeds, training_graph
from opgraph.benchmarks.timer import make_timer
from opgraph.passes.policy import LoweringPolicy

from tinymodels import tiny_convnet


@pytest.fixture(scope="module")
def unfused_profile():
    """The tiny convnet's training step, conv, bias and ReLU unfused (so that
    each is a step of its own), profiled on the CPU."""
    m = tiny_convnet(batch=2)
    tg = training_graph(m)
    prof = pf.profile_steps(tg, random_feeds(m), "cpu", LoweringPolicy(exclude=["fused"]),
                            make_timer("cpu"), warmup=0, repeat=2)
    return m, tg, prof


def test_every_step_is_accounted_once(unfused_profile):
    import opgraph as og

    _, tg, prof = unfused_profile
    exe = og.compile(tg.outputs, device="cpu", policy=LoweringPolicy(exclude=["fused"]))
    assert [n["name"] for n in prof["nodes"]] == [st.name for st in exe.steps]
    assert all(n["ms"] >= 0 for n in prof["nodes"]) and prof["step_ms"] > 0
    assert prof["nodes_ms"] == pytest.approx(sum(n["ms"] for n in prof["nodes"]))
    # on the CPU every step is called from Python (no CUDA graphs), and says so
    assert {(n["timed"], n["graph_calls"], n["eager_reason"]) for n in prof["nodes"]} == {
        ("eager", None, "device cpu: no CUDA graphs")}
    assert (prof["timing"]["graph_steps"], prof["timing"]["eager_steps"]) == (0, len(prof["nodes"]))
    assert prof["graph_step_ms"] is None and prof["graph_step_capture"] is None
    rows = pf.group_by_op(prof["nodes"], 1.0, 10.0)
    assert sum(r["count"] for r in rows) == len(prof["nodes"])
    assert sum(r["ms"] for r in rows) == pytest.approx(prof["nodes_ms"])
    assert sum(r["bytes"] for r in rows) == sum(n["bytes"] for n in prof["nodes"])


def test_bytes_and_flops_of_a_conv_and_a_relu_by_hand(unfused_profile):
    _, _, prof = unfused_profile
    by_name = {n["name"]: n for n in prof["nodes"]}
    conv, relu = by_name["conv1"], by_name["relu1"]
    # conv1: x (2, 3, 8, 8), w (4, 3, 5, 5), b (4,) -> y (2, 4, 8, 8), float32 (4 bytes)
    x, w, b, y = 2 * 3 * 8 * 8, 4 * 3 * 5 * 5, 4, 2 * 4 * 8 * 8
    assert conv["bytes"] == 4 * (x + w + b + y)
    assert conv["flops"] == 2 * y * 3 * 5 * 5  # a multiply-add per output, input channel and tap
    assert (conv["kind"], conv["direction"]) == ("compute", "fprop")
    # relu1 reads y and writes as many elements, and does no multiply-add
    assert relu["bytes"] == 4 * 2 * y and relu["flops"] == 0
    assert (relu["kind"], relu["direction"]) == ("memory", "forward")
    directions = {(n["op"], n["direction"]) for n in prof["nodes"]}
    assert {("Conv2dBackwardData", "dgrad"), ("Conv2dBackwardFilter", "wgrad"), ("MatMul", "dgrad"),
            ("MatMul", "wgrad"), ("ReluBackward", "backward")} <= directions


def test_an_input_taken_for_its_type_only_moves_no_bytes():
    """``BatchNormBackwardSumsRow(sums, like)`` reads (2, C) float32 sums and
    writes (C,); its ``like`` (the whole activation) is never read: counted, the
    fresh-user run of MobileNet-v2 showed 428 % of the copy bandwidth."""
    import opgraph as og
    from opgraph.op import Lowered
    from opgraph.ops import BatchNormBackwardSumsRow
    g = og.Graph()
    sums, like = g.input("sums", (2, 16)), g.input("like", (4, 16, 8, 8))
    row = g.add_node(Lowered(BatchNormBackwardSumsRow(row=0), "reference", "cpu", {}), [sums, like])
    moved, _ = pf.step_traffic(g, row.node)
    assert moved == 4 * (2 * 16 + 16)


def test_the_take_counts_one_element_of_x_per_output():
    """``MaxPool2dTake(x, idx)`` reads idx and x at each window's winner, not all of x."""
    import opgraph as og
    from opgraph.op import Lowered
    from opgraph.ops import MaxPool2dTake
    g = og.Graph()
    x = g.input("x", (4, 16, 8, 8))
    idx = g.add_node(Lowered(og.ops.MaxPool2dArgmax(kernel_size=2, stride=2), "reference", "cpu", {}), [x])
    take = g.add_node(Lowered(MaxPool2dTake(kernel_size=2, stride=2), "reference", "cpu", {}), [x, idx])
    pooled = 4 * 16 * 4 * 4
    assert pf.step_traffic(g, take.node)[0] == pooled * (1 + 4 + 4)  # idx bytes, x read, y written
    assert pf.step_traffic(g, idx.node)[0] == 4 * 16 * 8 * 8 * 4 + pooled  # the whole window scan of x


def test_rows_are_judged_against_the_limit_of_their_kind():
    nodes = [{"op": "Conv2d", "direction": "fprop", "kind": "compute", "algorithm": "gemm",
              "ms": 2.0, "bytes": 4_000_000, "flops": 6_000_000_000},
             {"op": "Relu", "direction": "forward", "kind": "memory", "algorithm": "codegen",
              "ms": 0.5, "bytes": 1_000_000_000, "flops": 0},
             {"op": "Relu", "direction": "forward", "kind": "memory", "algorithm": "codegen",
              "ms": 0.5, "bytes": 1_000_000_000, "flops": 0}]
    conv, relu = sorted(pf.group_by_op(nodes, matmul_tflops=10.0, copy_gbps=4000.0), key=lambda r: r["op"])
    assert conv["tflops"] == pytest.approx(3.0) and conv["fraction"] == pytest.approx(0.3)
    assert relu["count"] == 2 and relu["gbps"] == pytest.approx(2000.0) and relu["fraction"] == pytest.approx(0.5)
    assert relu["algorithms"] == {"codegen": 2}
    assert pf.group_by_op(nodes, None, None)[0]["fraction"] is None  # no limit measured


def test_the_copy_bandwidth_counts_the_read_and_the_write():
    got = measure_copy_bandwidth("cpu", nbytes=1 << 20, repeat=2)
    assert got["bytes"] == 2 << 20 and got["gbps"] == pytest.approx(got["bytes"] / (got["best_ms"] * 1e6))
    with pytest.raises(ValueError, match="device"):
        measure_copy_bandwidth("tpu")


def test_the_command_writes_a_table_and_the_json_document(tmp_path, capsys, monkeypatch):
    # a small copy and matmul keep the limits quick on the shared machine
    monkeypatch.setattr(pf, "measure_limits", lambda device, precisions: {
        "matmul": {p: {"tflops": 0.05, "method": "stub"} for p in precisions},
        "copy": measure_copy_bandwidth("cpu", nbytes=1 << 20, repeat=2)})
    out = tmp_path / "profile.json"
    status = cli.main(["--profile", "--model", "L4", "--batch", "1", "--warmup", "0", "--repeat", "1",
                       "--json", str(out), "--quiet"])
    assert status == 0
    text = capsys.readouterr().out
    assert "Conv2dBackwardFilter" in text and "% of limit" in text and "copy bandwidth" in text
    assert "whole step eager" in text and "steps alone timed by eager: each step called alone" in text
    assert "as CUDA graphs" not in text  # no graph figure on the CPU
    doc = json.loads(out.read_text())
    # version 2: a node's ms is graph-timed on a GPU (benchmarks/step_clock.py)
    assert (doc["tool"], doc["mode"], doc["schema_version"]) == ("opgraph-bench", "profile", 3)
    assert set(doc) == {"tool", "mode", "schema_version", "environment", "limits", "notes", "models"}
    (rec,) = doc["models"]
    assert {"model", "title", "batch", "dtype", "lowering", "precision", "layout", "compile_s", "step_ms",
            "graph_step_ms", "graph_step_capture", "timing", "nodes_ms", "nodes", "by_op"} <= set(rec)
    assert rec["model"] == "L4" and rec["lowering"] == "gemm"
    assert {"op", "direction", "kind", "count", "eager_steps", "ms", "bytes", "flops", "gbps", "tflops",
            "fraction", "algorithms"} == set(rec["by_op"][0])
    assert sum(r["count"] for r in rec["by_op"]) == len(rec["nodes"])


def test_a_cpu_profile_asked_for_nhwc_records_the_nchw_it_ran(tmp_path, quick_limits):
    """As a benchmark column: ``layout`` is what ran, ``layout_requested`` what was asked."""
    out = tmp_path / "profile.json"
    assert cli.main(["--profile", "--model", "L4", "--batch", "1", "--warmup", "0", "--repeat", "1",
                     "--layout", "nhwc", "--json", str(out), "--quiet"]) == 0
    doc = json.loads(out.read_text())
    (rec,) = doc["models"]
    assert (rec["layout"], rec["layout_requested"]) == ("NCHW", "NHWC")
    assert (doc["environment"]["layout"], doc["environment"]["layout_requested"]) == ("NCHW", "NHWC")
    assert any(n.startswith("layout: NHWC requested but ignored on cpu") for n in rec["notes"]), rec["notes"]


def test_a_cpu_profile_says_tf32_and_the_engine_limit_did_not_apply(tmp_path, quick_limits, capsys):
    out = tmp_path / "profile.json"
    assert cli.main(["--profile", "--model", "L4", "--batch", "1", "--warmup", "0", "--repeat", "1",
                     "--precision", "tf32", "--lowering", "auto", "--engine-limit", "5",
                     "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    (rec,) = doc["models"]
    assert any(n.startswith("precision tf32 requested, but no kernel") for n in rec["notes"]), rec["notes"]
    # the compile's note on the engine limit (the policy's, from --engine-limit), in the record
    assert any("engine_limit=5" in n and "no effect" in n for n in rec["notes"]), rec["notes"]
    printed = capsys.readouterr().out
    assert "precision tf32 requested" in printed  # in the table's notes too
    assert "engine_limit=5" in printed


def test_profile_refuses_what_it_cannot_do(capsys):
    assert cli.main(["--profile", "--summary"]) == 2
    assert cli.main(["--profile", "--format", "csv"]) == 2
    assert "--profile" in capsys.readouterr().err


def test_a_schema_1_record_still_renders(unfused_profile):
    # a document written before the graph-timed steps: no timing, graph figure or eager counts
    from opgraph.benchmarks.profile_table import profile_tables
    from opgraph.benchmarks.tables import fmt_ms

    m, _, prof = unfused_profile
    old = {k: v for k, v in prof.items() if k not in ("timing", "graph_step_ms", "graph_step_capture")}
    old["nodes"] = [{k: v for k, v in n.items() if k not in ("timed", "graph_calls", "eager_reason")}
                    for n in prof["nodes"]]
    rows = [{k: v for k, v in r.items() if k != "eager_steps"} for r in pf.group_by_op(old["nodes"], 1.0, 10.0)]
    record = {"title": m.title, "batch": 2, "dtype": "float32", "layout": "NCHW", "precision": "fp32",
              "lowering": "gemm", "model": m.key, **old, "by_op": rows}
    (table,) = profile_tables({"schema_version": 1, "limits": {}, "models": [record]})
    assert table.caption.endswith(f"whole step eager {fmt_ms(prof['step_ms'])} ms; "
                                  f"sum of the steps alone {fmt_ms(prof['nodes_ms'])} ms")
    assert "as CUDA graphs" not in table.caption and "graph-timed" not in table.caption
    assert [r[2] for r in table.rows] == [str(r["count"]) for r in rows]
    assert not any(n.startswith("steps alone timed by") for n in table.notes)


def test_a_model_the_lowering_cannot_run_is_not_profiled_but_noted(tmp_path, quick_limits):
    """L1's 11x11 convolutions have no Winograd kernel: as the benchmark marks
    its column n/a, the profile leaves it out and says why (it profiled the
    fallback under winograd's name before)."""
    out = tmp_path / "profile.json"
    assert cli.main(["--profile", "--model", "L1,L5", "--batch", "1", "--warmup", "0", "--repeat", "1",
                     "--lowering", "winograd", "--json", str(out), "--quiet"]) == 0
    doc = json.loads(out.read_text())
    assert [r["model"] for r in doc["models"]] == ["L5"]
    assert any(n.startswith("L1 fp32 winograd: not profiled: winograd applies to no convolution of L1")
               for n in doc["notes"]), doc["notes"]


def test_zero_copy_steps_move_only_what_they_copy():
    """A ``Slice`` returning a view and a concat whose inputs were written in
    place copy nothing: kind ``view``, no bytes, no fraction (counted as
    copies, GoogLeNet's concats and slices showed 400-500x the copy bandwidth
    on the H200); a concat that copies some inputs moves those twice."""
    import opgraph as og
    from opgraph.buffer_views import AssembleConcat, SliceView
    from opgraph.ops.tensor import Concat

    from tinymodels import every_op_model

    m = every_op_model(batch=2)
    tg = training_graph(m)
    policy = LoweringPolicy()
    exe = og.compile(tg.outputs, device="cpu", policy=policy)
    prof = pf.profile_steps(tg, random_feeds(m), "cpu", policy, make_timer("cpu"), warmup=0, repeat=1)
    by_name = {n["name"]: n for n in prof["nodes"]}
    zero_copy = [st for st in exe.steps if isinstance(st.view, (SliceView, AssembleConcat))]
    assert any(isinstance(st.view, SliceView) for st in zero_copy)  # the concat's backward slices
    assert any(isinstance(st.view, AssembleConcat) for st in zero_copy)
    for st in zero_copy:
        n = by_name[st.name]
        types = exe.graph.node(st.node).input_types
        copied = [pos for pos, *_ in st.view.copies] if isinstance(st.view, AssembleConcat) else []
        assert n["bytes"] == sum(2 * pf.tensor_bytes(types[p]) for p in copied)
        assert n["kind"] == ("memory" if copied else "view")
    # a step that runs its kernel counts its traffic as before
    concat_free = [st for st in exe.steps if st.view is None and not isinstance(st.op.op, Concat)]
    assert all(by_name[st.name]["bytes"] == pf.step_traffic(exe.graph, st.node)[0] for st in concat_free)
    views = [r for r in pf.group_by_op(prof["nodes"], 1.0, 10.0) if r["kind"] == "view"]
    assert views and all(r["fraction"] is None and r["gbps"] is None and r["bytes"] == 0 for r in views)


def test_a_group_of_copying_and_zero_copy_steps_is_judged_as_memory():
    nodes = [{"op": "Concat", "direction": "forward", "kind": "view", "algorithm": "codegen", "ms": 1.0,
              "bytes": 0, "flops": 0},
             {"op": "Concat", "direction": "forward", "kind": "memory", "algorithm": "codegen", "ms": 1.0,
              "bytes": 4e9, "flops": 0}]
    (row,) = pf.group_by_op(nodes, 1.0, 10.0)
    assert row["kind"] == "memory" and row["gbps"] == pytest.approx(2000.0) and row["fraction"] == pytest.approx(200.0)


def test_a_step_slower_in_place_than_autotune_timed_it_is_listed(monkeypatch):
    """Each profiled node carries the median autotune measured for its choice
    (``tuned_ms``); a step above 1.5x that (and by more than 0.01 ms) is listed
    in ``slower_than_tuned`` and in the table's notes: autotune timed it on
    other operands than it runs on."""
    from opgraph.benchmarks.profile_table import profile_tables
    from opgraph.passes.report import Candidate, LoweringReport, NodeReport

    report = LoweringReport()
    report.nodes["conv"] = NodeReport(0, "conv", "Conv2d", "Conv2d", candidates=[
        Candidate("cudnn", {"engine": 15}, time_ms=0.44, status="chosen"), Candidate("fft", {}, time_ms=1.6)])
    report.nodes["relu"] = NodeReport(1, "relu", "Relu", "Relu")  # not timed: lowered by the policy
    assert pf.tuned_ms(report, "conv") == 0.44 and pf.tuned_ms(report, "relu") is None
    assert pf.tuned_ms(report, "absent") is None
    nodes = [{"name": "conv", "ms": 2.61, "tuned_ms": 0.44}, {"name": "fast", "ms": 0.45, "tuned_ms": 0.44},
             {"name": "tiny", "ms": 0.012, "tuned_ms": 0.004}, {"name": "relu", "ms": 0.3, "tuned_ms": None},
             {"name": "bn", "ms": 0.9, "tuned_ms": 0.5}]
    slow = pf.slower_than_tuned(nodes)
    assert [r["name"] for r in slow] == ["conv", "bn"]  # the largest gap first; "tiny" is under the floor
    doc = {"limits": {}, "models": [{"model": "m", "title": "m", "batch": 1, "dtype": "float32", "lowering": "auto",
                                     "precision": "fp32", "layout": "NCHW", "nodes_ms": 4.0, "by_op": [],
                                     "step_ms": 4.0, "graph_step_ms": None, "timing": None, "notes": [],
                                     "slower_than_tuned": slow}]}
    (table,) = profile_tables(doc)
    assert any("2 step(s) ran above 1.5x" in n and "conv (2.61 vs 0.440)" in n for n in table.notes), table.notes


def test_a_profile_whose_choices_came_from_the_autotune_cache_says_so_naming_it(tmp_path, quick_limits, capsys,
                                                                                 monkeypatch):
    """Fresh-user report: a second ``--profile --lowering auto`` reused the first
    one's autotune decisions (and their tuned_ms) without a word. It says so, on
    standard error and in the record's notes, naming the cache file; the first
    run, which timed every candidate, says nothing of the kind."""
    cache = tmp_path / "tune.json"
    monkeypatch.setenv("OPGRAPH_CACHE", str(cache))

    def profile(out):
        assert cli.main(["--profile", "--model", "L4", "--batch", "1", "--warmup", "0", "--repeat", "1",
                         "--device", "cpu", "--lowering", "auto", "--json", str(out), "--quiet"]) == 0
        (rec,) = json.loads(out.read_text())["models"]
        return rec, [n for n in rec["notes"] if str(cache) in n], capsys.readouterr()

    first, said, _ = profile(tmp_path / "first.json")
    assert first["autotune"]["nodes_tuned"] > 0 and first["autotune"]["file_hits"] == 0 and said == []
    second, (note,), printed = profile(tmp_path / "second.json")
    summary = second["autotune"]
    assert summary["nodes_tuned"] == 0
    assert summary["file_hits"] == summary["cache_hits"] == first["autotune"]["nodes_tuned"]
    assert note.startswith(f"autotune: {summary['file_hits']} of {summary['file_hits']} node choices")
    assert f"opgraph-bench: L4 fp32 auto: {note}" in printed.err
    assert " ".join(note.split()) in " ".join(printed.out.split())  # under the table too
