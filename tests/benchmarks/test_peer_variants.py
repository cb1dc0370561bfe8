"""The peers' variants (eager, +graph, torch.compile, both): their control flow
on the CPU, the CUDA-graph path through a stand-in device, the checks that keep
a wrong converter or a broken replay from being timed, the records, the ratios
(vs torch, vs best peer) and the one-message rule when PyTorch is missing."""

from __future__ import annotations

import sys

import pytest

from opgraph.benchmarks import check, driver, lowerings as lw, peer_run
from opgraph.benchmarks.peer_column import add_ratios, ratio_key
from opgraph.benchmarks.peer_device import CpuPeerDevice
from opgraph.benchmarks.protocol import random_feeds, training_graph
from opgraph.benchmarks.tables import end_to_end_tables

ALL = ["torch", "torch+graph", "torch-compile", "torch-compile+graph"]


class GraphStandIn(CpuPeerDevice):
    """A device whose "CUDA graph" reruns the captured step into the tensors the
    capture returned, as a replay rewrites its static outputs; ``broken``: a
    replay that leaves zeros; ``refuse``: a capture that raises."""

    name = "cpu"

    def __init__(self, torch, broken=False, refuse=False):
        super().__init__(torch)
        self.broken, self.refuse, self.captures = broken, refuse, 0

    def graph_unavailable(self):
        return None

    def capture(self, step):
        if self.refuse:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.captures += 1
        static = [t.detach().clone() for t in step()]

        def replay():
            fresh = step()
            for s, f in zip(static, fresh):
                s.copy_(f.detach() * (0 if self.broken else 1))
        return replay, static, 0.25, {"measured_peak_bytes": None, "reserved_peak_bytes": None}


@pytest.fixture
def counted_compile(monkeypatch):
    """torch.compile replaced by the identity, counting calls (Inductor on the
    CPU needs minutes; a real compile is tested once, marked slow)."""
    calls = []
    monkeypatch.setattr(peer_run, "compile_function", lambda torch, fn: calls.append(fn) or fn)
    return calls


def _peers(tiny, names, **kw):
    torch = pytest.importorskip("torch")
    feeds = random_feeds(tiny)
    ref = check.Reference(training_graph(tiny), feeds, "cpu")
    pdev = kw.pop("pdev", None)
    return peer_run.run_peers(tiny, feeds, names, device="cpu", warmup=1, repeat=3, reference=ref,
                              pdev=pdev(torch) if pdev else None, **kw)


def test_graph_variants_are_unavailable_on_the_cpu(tiny, counted_compile):
    out = _peers(tiny, ALL)
    assert list(out) == ALL
    for name in ("torch+graph", "torch-compile+graph"):
        assert out[name]["status"] == "unavailable"
        assert "CUDA graph" in out[name]["reason"] and "needs a GPU" in out[name]["reason"]
    for name in ("torch", "torch-compile"):
        r = out[name]
        assert r["status"] == "ok", r["reason"]
        assert r["converter_check"]["passed"] and r["converter_check"]["end_to_end"]["output"] < 1e-12
        assert r["times"]["forward"]["median_ms"] > 0 and len(r["step"]["times_ms"]) == 3
        assert r["step"]["min_ms"] <= r["step"]["median_ms"] <= r["step"]["max_ms"] and r["first_call_s"] > 0
    assert len(counted_compile) == 1


def test_graph_variants_with_a_stand_in_device_share_one_compilation(tiny, counted_compile):
    out = _peers(tiny, ALL, pdev=GraphStandIn)
    assert [r["status"] for r in out.values()] == ["ok"] * 4, [r["reason"] for r in out.values()]
    assert len(counted_compile) == 1  # torch-compile and torch-compile+graph: one compilation
    for name in ("torch+graph", "torch-compile+graph"):
        r = out[name]
        assert r["times"] is None and r["capture_s"] == 0.25 and r["step"]["median_ms"] > 0
        assert r["check"]["passed"] and r["check"]["end_to_end"]["output"] < 1e-5
    assert out["torch-compile+graph"]["first_call_s"] == out["torch-compile"]["first_call_s"]


def test_a_broken_replay_is_a_mismatch_and_a_failed_capture_an_error(tiny, counted_compile):
    torch = pytest.importorskip("torch")
    out = _peers(tiny, ["torch", "torch+graph"], pdev=lambda t: GraphStandIn(t, broken=True))
    assert out["torch"]["status"] == "ok"
    assert out["torch+graph"]["status"] == "mismatch" and "CUDA-graph replay" in out["torch+graph"]["reason"]
    out = _peers(tiny, ["torch+graph", "torch"], pdev=lambda t: GraphStandIn(t, refuse=True))
    assert out["torch"]["status"] == "ok" and list(out) == ["torch+graph", "torch"]
    assert out["torch+graph"]["status"] == "error" and "stream is capturing" in out["torch+graph"]["reason"]
    assert out["torch+graph"]["reason"].startswith("CUDA-graph capture failed: RuntimeError: ")
    assert out["torch+graph"]["error"]["frames"][-1].endswith("in capture")  # GraphStandIn.capture
    del torch


def test_a_wrong_converter_is_not_timed(tiny, monkeypatch):
    pytest.importorskip("torch")
    from opgraph.benchmarks import peer_converters

    monkeypatch.setitem(peer_converters.CONVERTERS, "Relu", lambda t, op, x: t.F.leaky_relu(x, 0.01))
    out = _peers(tiny, ["torch"])
    r = out["torch"]
    assert r["status"] == "mismatch" and "float64 differs from the reference" in r["reason"]
    assert not r["converter_check"]["passed"] and "times" not in r


def test_a_peer_column_that_raises_records_type_message_and_frames(tiny, monkeypatch):
    """An unexpected exception out of the peers (issue 17: an error column
    recorded only 'IndexError: tuple index out of range') gives each of their
    columns the error record opgraph's columns have."""
    from opgraph.benchmarks.peer_column import peer_records

    def broken(*args, **kwargs):
        raise IndexError("tuple index out of range")

    monkeypatch.setattr(peer_run, "run_peers", broken)
    s = driver.Settings(device="cpu", lowerings=[], compare=["torch", "torch-compile"], warmup=0, repeat=1)
    recs = peer_records(training_graph(tiny), random_feeds(tiny), None, ["torch", "torch-compile"], "fp32",
                        s, None)
    for r in recs:
        assert r["status"] == "error" and r["error"]["type"] == "IndexError"
        assert r["error"]["message"] == "tuple index out of range"
        assert r["error"]["frames"][-1].endswith("in broken") and len(r["error"]["frames"]) >= 2
        assert r["reason"].startswith("IndexError: tuple index out of range (at tests/benchmarks/")


def test_a_compilation_failure_leaves_the_eager_peers(tiny, monkeypatch):
    def refuse(torch, fn):
        raise RuntimeError("inductor: no C++ compiler")

    monkeypatch.setattr(peer_run, "compile_function", refuse)
    out = _peers(tiny, ["torch", "torch-compile"])
    assert out["torch"]["status"] == "ok"
    got = out["torch-compile"]
    assert got["status"] == "error" and got["converter_check"] == out["torch"]["converter_check"]
    # an error record as opgraph's columns have (issue 17): type, message and innermost frames
    assert got["error"]["type"] == "RuntimeError" and got["error"]["message"] == "inductor: no C++ compiler"
    assert got["error"]["frames"][-1].endswith("in refuse")
    assert got["reason"] == f"RuntimeError: inductor: no C++ compiler (at {got['error']['frames'][-1]})"


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_a_real_compilation_on_the_cpu(tiny):
    """Inductor on the CPU (needs a C++ compiler; tens of seconds)."""
    out = _peers(tiny, ["torch-compile"])
    r = out["torch-compile"]
    assert r["status"] == "ok", r["reason"]
    assert r["check"]["end_to_end"]["output"] < 1e-5 and r["first_call_s"] > 0


def test_records_ratios_and_table_of_a_run(tiny, counted_compile):
    pytest.importorskip("torch")
    s = driver.Settings(device="cpu", lowerings=[lw.Lowering("gemm")], warmup=1, repeat=3,
                        compare=ALL, per_layer=False)
    doc = driver.run_benchmark([tiny], s)
    recs = {r["lowering"]: r for r in doc["results"]}
    assert [r["lowering"] for r in doc["results"]] == ALL + ["gemm"]
    gemm, torch_rec = recs["gemm"], recs["torch"]
    assert gemm["step"]["median_ms"] > 0 and torch_rec["first_call_s"] > 0
    assert gemm["vs_torch"]["step"] == pytest.approx(gemm["step"]["median_ms"] / torch_rec["step"]["median_ms"])
    best = min(("torch", "torch-compile"), key=lambda k: recs[k]["step"]["median_ms"])
    assert gemm["vs_best_peer"] == {"ratio": pytest.approx(gemm["step"]["median_ms"] / recs[best]["step"]["median_ms"]),
                                    "peer": best, "peer_step_ms": recs[best]["step"]["median_ms"]}
    assert ratio_key("torch+graph") not in gemm  # unavailable peers give no ratio
    (table,) = end_to_end_tables(doc)
    unavailable = [n for n in table.notes if "unavailable" in n]
    assert len(unavailable) == 1 and "tiny / torch+graph, tiny / torch-compile+graph" in unavailable[0]


def _record(kind, step_ms, forward_ms=None, status="ok", model="m", precision="fp32"):
    totals = {"forward_ms": forward_ms, "backward_ms": None if forward_ms is None else 2.0,
              "total_ms": step_ms if forward_ms is None else forward_ms + 2.0, "total_min_ms": None}
    return {"model": model, "precision": precision, "kind": kind, "lowering": kind, "status": status,
            "totals": totals, "step": {"median_ms": step_ms}}


def test_vs_best_peer_arithmetic():
    ours = _record("opgraph", 9.0, forward_ms=3.0)
    other_model = _record("opgraph", 4.0, forward_ms=1.0, model="n")
    results = [_record("torch", 12.0, forward_ms=4.0), _record("torch+graph", 10.0),
               _record("torch-compile", 6.0, forward_ms=2.5), _record("torch-compile+graph", 3.0, status="error"),
               _record("torch-compile+graph", 1.0, precision="bf16"), ours, other_model]
    add_ratios(results)
    assert ours["vs_best_peer"] == {"ratio": 1.5, "peer": "torch-compile", "peer_step_ms": 6.0}
    assert ours["vs_torch"] == {"step": 0.75, "forward": 0.75, "backward": 1.0, "total": 5.0 / 6.0}
    assert ours["vs_torch_graph"] == {"step": 0.9}  # no phases to compare with a captured step
    assert "vs_torch_compile_graph" not in ours  # its only run of fp32 failed
    assert "vs_best_peer" not in other_model and "vs_torch" not in other_model


def test_missing_torch_prints_its_message_once(monkeypatch, capsys):
    from opgraph.benchmarks import cli

    from tinymodels import every_op_model, tiny_convnet

    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setattr(cli, "build_models", lambda names, args, device, notes: [tiny_convnet(), every_op_model()])
    status = cli.main(["--model", "L5,L4", "--device", "cpu", "--lowering", "gemm", "--warmup", "0",
                       "--repeat", "1", "--no-check", "--no-per-layer", "--compare", "torch,torch-compile"])
    out, err = capsys.readouterr()
    assert status == 0, err
    out = " ".join(out.split())  # a note wraps on a terminal (one line here)
    assert err.count("PyTorch is not installed") == 1 and out.count("PyTorch is not installed") == 1
    assert err.count("(reason above)") == 4  # every peer column of the two models: said before the run
    assert out.count("unavailable [1]") == 4


def test_a_graph_peer_on_the_cpu_is_a_usage_error(capsys):
    """A +graph peer captures CUDA graphs: on the CPU it is refused before anything
    runs, as --cuda-graph is (it used to run every column, then say 'unavailable')."""
    from opgraph.benchmarks import cli
    status = cli.main(["--model", "L1", "--device", "cpu", "--compare", ",".join(ALL)])
    err = capsys.readouterr().err
    assert status == 2 and "--compare torch+graph,torch-compile+graph captures CUDA graphs" in err
    assert "needs --device cuda (this run: cpu)" in err
