"""``opgraph-bench --trace PATH``: one step of every timed column as a Chrome
trace (JSON trace-event format) on the CPU; the GPU path is tested with the
CuPy stand-ins (test_gpu_standins.py)."""

from __future__ import annotations

import json

from opgraph.benchmarks import cli
from opgraph.benchmarks.trace import CPU_TID

PHASES = {"forward", "backward_data", "backward_filter"}


def test_trace_file_has_one_process_per_column_and_an_event_per_node(capsys, tmp_path):
    path, out = tmp_path / "step.json", tmp_path / "run.json"
    status = cli.main(["--model", "L5", "--batch", "1", "--device", "cpu", "--lowering", "gemm,direct",
                       "--warmup", "0", "--repeat", "1", "--no-check", "--no-per-layer", "--quiet",
                       "--format", "json", "--output", str(out), "--trace", str(path)])
    assert status == 0, capsys.readouterr().err
    trace = json.loads(path.read_text())
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    assert {(e["pid"], e["args"]["name"]) for e in meta if e["name"] == "process_name"} == {
        (1, "L5 fp32 gemm"), (2, "L5 fp32 direct")}
    doc = json.loads(out.read_text())
    for pid, rec in enumerate(doc["results"], 1):
        events = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == pid]
        assert {e["tid"] for e in events} == {CPU_TID}
        ops = {e["args"]["op"]: e for e in events}
        assert {"Conv2d", "Conv2dBackwardData", "Conv2dBackwardFilter"} <= set(ops)
        conv = ops["Conv2dBackwardFilter"]
        assert conv["args"]["algorithm"] == rec["lowering"] and conv["args"]["direction"] == "backward_filter"
        assert conv["name"] == (f"{conv['args']['node']}: Conv2dBackwardFilter [{rec['lowering']}, "
                                "backward_filter]") and conv["cat"] == "backward_filter"
        assert all(e["args"]["direction"] in PHASES for e in events)
        for a, b in zip(events, events[1:]):  # one step, node after node
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3 and a["dur"] > 0


def test_trace_with_summary_is_a_usage_error(capsys, tmp_path):
    assert cli.main(["--model", "L5", "--summary", "--trace", str(tmp_path / "t.json")]) == 2
    assert "--trace" in capsys.readouterr().err


def test_the_trace_file_is_announced_like_the_other_outputs(capsys, tmp_path):
    """``--trace PATH`` says where it wrote, as ``--output`` and ``--plot`` do; ``--quiet`` silences it.
    One timed call: the step cell is the median alone, no ``±0.000`` spread of one value."""
    path = tmp_path / "step.json"
    args = ["--model", "L5", "--batch", "1", "--device", "cpu", "--lowering", "gemm", "--warmup", "0",
            "--repeat", "1", "--no-check", "--no-per-layer", "--trace", str(path)]
    assert cli.main(args) == 0
    captured = capsys.readouterr()
    assert f"wrote trace to {path}" in captured.err
    (row,) = [line for line in captured.out.splitlines() if line.startswith("│ L5")][:1]
    assert "±0.000" not in row
    assert cli.main([*args, "--quiet"]) == 0
    assert "wrote trace" not in capsys.readouterr().err
