"""The PyTorch peer: the converter runs exactly our model; the peer's record; no torch, no crash."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import opgraph as og
from opgraph.benchmarks import check, driver, lowerings as lw
from opgraph.benchmarks.peer_torch import PeerError, import_torch
from opgraph.benchmarks.protocol import random_feeds, training_graph


def test_missing_torch_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    with pytest.raises(PeerError, match=r"pip install -e \"\.\[torch\]\""):
        import_torch()


def test_missing_torch_leaves_the_run_going(monkeypatch, tiny):
    monkeypatch.setitem(sys.modules, "torch", None)
    s = driver.Settings(device="cpu", lowerings=[lw.Lowering("gemm")], warmup=0, repeat=1,
                        compare=["torch"], per_layer=False, check=False)
    doc = driver.run_benchmark([tiny], s)
    peer, gemm = doc["results"]  # the peer runs first
    assert gemm["status"] == "ok" and "vs_torch" not in gemm
    assert peer["status"] == "unavailable" and "PyTorch is not installed" in peer["reason"]


def test_converter_matches_the_float64_reference(every_op):
    torch = pytest.importorskip("torch")
    from opgraph.benchmarks.peer_torch import TorchModel

    tg = training_graph(every_op)
    feeds = random_feeds(every_op, seed=3)
    feeds["c1.bias"] = np.linspace(-0.5, 0.5, 4).astype(np.float32)  # nonzero biases too
    want = og.compile(tg.outputs, pipeline="reference", dtype="float64")(**feeds)
    tm = TorchModel(every_op, feeds, "cpu", dtype=torch.float64)
    y = tm.forward()
    grads = tm.grads(y)
    np.testing.assert_allclose(y.detach().numpy(), want[0], rtol=1e-10, atol=1e-12)
    for g, w, p in zip(grads, want[1:], every_op.params):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-9, atol=1e-11, err_msg=p.name)


def test_channels_last_and_input_gradient(every_op):
    torch = pytest.importorskip("torch")
    from opgraph.benchmarks.peer_torch import TorchModel

    feeds = random_feeds(every_op, seed=4)
    plain = TorchModel(every_op, feeds, "cpu", dtype=torch.float64, input_grad=True)
    cl = TorchModel(every_op, feeds, "cpu", dtype=torch.float64, channels_last=True, input_grad=True)
    assert cl.inputs[every_op.input.node].is_contiguous(memory_format=torch.channels_last)
    a, b = plain.grads(plain.forward()), cl.grads(cl.forward())
    assert len(a) == len(every_op.params) + 1 and a[-1].shape == every_op.input.shape
    for x, y in zip(a, b):
        np.testing.assert_allclose(x.numpy(), y.numpy(), rtol=1e-10, atol=1e-12)


def test_peer_in_the_same_run(tiny):
    pytest.importorskip("torch")
    s = driver.Settings(device="cpu", lowerings=[lw.Lowering("gemm")], warmup=1, repeat=2,
                        compare=["torch"], per_layer=False)
    doc = driver.run_benchmark([tiny], s)
    peer, gemm = doc["results"]  # the peer runs first
    assert peer["kind"] == "torch" and peer["status"] == "ok", peer["reason"]
    assert peer["times"]["backward_data"] is None and peer["times"]["forward"]["median_ms"] > 0
    assert peer["totals"]["total_ms"] == pytest.approx(peer["totals"]["forward_ms"]
                                                       + peer["totals"]["backward_ms"])
    assert peer["flops"]["total"] == gemm["flops"]["total"]
    e2e = peer["check"]["end_to_end"]
    assert e2e["finite"] and e2e["output"] < 1e-5 and e2e["max_grad"] < 1e-4
    assert peer["versions"]["torch"].startswith("2.")
    from opgraph.benchmarks.tables import ordered

    assert [r["lowering"] for r in ordered(doc, "fp32")] == ["gemm", "torch"]  # tables: peer last
    ratio = gemm["vs_torch"]
    assert ratio["total"] == pytest.approx(gemm["totals"]["total_ms"] / peer["totals"]["total_ms"])


def test_peer_precisions_run(tiny):
    torch = pytest.importorskip("torch")
    from opgraph.benchmarks.peer_run import run_peers

    tg = training_graph(tiny)
    feeds = random_feeds(tiny)
    ref = check.Reference(tg, feeds, "cpu")
    (out,) = run_peers(tiny, feeds, ["torch"], device="cpu", precision="bf16", warmup=0, repeat=1,
                       reference=ref).values()
    e2e = out["check"]["end_to_end"]
    assert e2e["finite"] and 1e-4 < e2e["output"] < 5e-2  # bf16 autocast: visibly rounded
    assert out["converter_check"]["end_to_end"]["output"] < 1e-12  # the converters, in float64
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    try:
        (out,) = run_peers(tiny, feeds, ["torch"], device="cpu", precision="fp32", warmup=0, repeat=1,
                           reference=ref).values()
        assert out["check"]["end_to_end"]["output"] < 1e-5
        assert torch.backends.cudnn.allow_tf32 is True  # fp32 turned TF32 off, then restored it
    finally:
        torch.backends.cudnn.allow_tf32 = old


def test_bf16_storage_peer_stores_bf16(tiny):
    """A --dtype bfloat16 model: the peer's parameters and activations are bf16 too."""
    torch = pytest.importorskip("torch")
    import ml_dtypes

    from opgraph.benchmarks.peer_torch import TorchModel, storage_dtype

    feeds = {k: v.astype(ml_dtypes.bfloat16) for k, v in random_feeds(tiny).items()}
    tm = TorchModel(tiny, feeds, "cpu", dtype=storage_dtype(torch, "bfloat16"), channels_last=True)
    y = tm.forward()
    assert y.dtype == torch.bfloat16 and all(p.dtype == torch.bfloat16 for p in tm.param_list)
    assert tm.inputs[tiny.input.node].is_contiguous(memory_format=torch.channels_last)


def test_a_parameter_the_output_does_not_read_gets_a_zero_gradient(tiny):
    """opgraph's grad gives Zeros for it; the peer's autograd must too (not refuse)."""
    torch = pytest.importorskip("torch")
    from opgraph.benchmarks.peer_torch import TorchModel

    unused = tiny.graph.param("spare.weight", (3, 2))
    tiny.params.append(unused)
    tg = training_graph(tiny)
    feeds = random_feeds(tiny)
    read = {k: v for k, v in feeds.items() if k != unused.name}  # the executor refuses an unread feed
    want = og.compile(tg.outputs, pipeline="reference", dtype="float64")(**read)
    tm = TorchModel(tiny, feeds, "cpu", dtype=torch.float64)
    grads = tm.grads(tm.forward())
    assert len(grads) == len(tiny.params) and not grads[-1].any() and not want[-1].any()
    np.testing.assert_allclose(grads[0].numpy(), want[1], rtol=1e-10)


@pytest.fixture
def blas_env(monkeypatch):
    """The BLAS thread count read from the variables alone (threadpoolctl, where
    installed, would read the loaded library's own count instead)."""
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "GOTO_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_the_cpu_peer_runs_with_the_blas_thread_count(blas_env, tiny):
    """README advises OPENBLAS_NUM_THREADS=1 on a busy machine: opgraph's BLAS
    then ran one thread and PyTorch every core, and the ratio compared them
    without a word; the environment had no thread count (user report)."""
    torch = pytest.importorskip("torch")
    from opgraph.benchmarks import peer_run

    own = torch.get_num_threads()
    want = 1 if own > 1 else 2
    blas_env.setenv("OPENBLAS_NUM_THREADS", str(want))
    seen = []
    real = peer_run.run_peers

    def run_peers(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    blas_env.setattr(peer_run, "run_peers", run_peers)
    s = driver.Settings(device="cpu", lowerings=[lw.Lowering("gemm")], warmup=0, repeat=1,
                        compare=["torch"], per_layer=False, check=False)
    doc = driver.run_benchmark([tiny], s)
    assert seen == [want] and torch.get_num_threads() == own  # aligned while the peers ran, restored
    threads = doc["environment"]["threads"]
    assert (threads["blas"], threads["blas_source"], threads["torch"]) == (want, "OPENBLAS_NUM_THREADS", own)
    assert threads["OPENBLAS_NUM_THREADS"] == str(want) and threads["OMP_NUM_THREADS"] is None
    peer = doc["results"][0]
    assert peer["status"] == "ok" and peer["threads"] == want
    assert any(f"torch.set_num_threads({want})" in n and f"PyTorch's own {own}" in n for n in peer["notes"])
    assert any(n.startswith(f"threads: NumPy's BLAS runs {want} thread(s)") for n in doc["notes"])
    from opgraph.benchmarks.tables import environment_table

    rows = dict(environment_table(doc).rows)
    assert rows["threads"] == f"NumPy BLAS {want} (OPENBLAS_NUM_THREADS), PyTorch {own}"


def test_equal_or_unknown_thread_counts(blas_env, tiny):
    torch = pytest.importorskip("torch")
    from opgraph.benchmarks.peer_column import threads_note

    own = torch.get_num_threads()
    blas_env.setenv("OMP_NUM_THREADS", str(own))
    s = driver.Settings(device="cpu", lowerings=[lw.Lowering("gemm")], warmup=0, repeat=1,
                        compare=["torch"], per_layer=False, check=False)
    doc = driver.run_benchmark([tiny], s)
    assert doc["results"][0]["threads"] == own and not any(n.startswith("threads:") for n in doc["notes"])
    assert not any("set_num_threads" in n for n in doc["results"][0]["notes"])
    unknown = threads_note({"blas": None, "blas_source": "unknown: no threadpoolctl", "torch": own})
    assert unknown.startswith("threads: NumPy's BLAS thread count is unknown") and f"own {own}" in unknown


def _stand_in_threadpoolctl(monkeypatch, entries):
    """``threadpoolctl`` replaced by a module whose ``threadpool_info()`` lists ``entries``."""
    import types

    fake = types.ModuleType("threadpoolctl")
    fake.threadpool_info = lambda: [dict(e) for e in entries]
    monkeypatch.setitem(sys.modules, "threadpoolctl", fake)


def _blas(num_threads: int, filepath, internal_api: str = "openblas") -> dict:
    return {"user_api": "blas", "internal_api": internal_api, "num_threads": num_threads, "filepath": str(filepath)}


def test_threadpoolctl_gives_the_blas_count_where_installed(monkeypatch):
    from opgraph.benchmarks.environment import blas_threads, numpy_library_dirs

    package, libs = numpy_library_dirs()
    _stand_in_threadpoolctl(monkeypatch, [{"user_api": "openmp", "num_threads": 8, "filepath": str(libs / "libgomp.so")},
                                          _blas(3, libs / "libscipy_openblas64_-32a4b2a6.so")])
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")  # the library's own count wins
    assert blas_threads() == (3, "threadpoolctl (openblas)")
    _stand_in_threadpoolctl(monkeypatch, [_blas(4, package / ".dylibs" / "libscipy_openblas64_.dylib")])  # macOS
    assert blas_threads() == (4, "threadpoolctl (openblas)")


def test_the_blas_count_is_numpys_own_where_threadpoolctl_lists_several(monkeypatch):
    """SciPy's wheels bundle an OpenBLAS of their own, listed first once SciPy is imported (opgraph
    imports it), and PyTorch may load another: the count read was the first BLAS's, SciPy's, not
    the one opgraph's convolutions run on. NumPy's is found by its file; where none lies under
    NumPy's install (a system BLAS), the variables say what they set."""
    from opgraph.benchmarks.environment import blas_threads, numpy_library_dirs

    package, libs = numpy_library_dirs()
    site = package.parent
    scipy_first = [_blas(7, site / "scipy.libs" / "libscipy_openblas-6cdc3b4a.so"),
                   _blas(5, site / "torch" / "lib" / "libopenblas.so.0"),
                   {"user_api": "openmp", "internal_api": "openmp", "num_threads": 8,
                    "filepath": str(site / "torch" / "lib" / "libgomp.so.1")},
                   _blas(3, libs / "libscipy_openblas64_-32a4b2a6.so")]
    _stand_in_threadpoolctl(monkeypatch, scipy_first)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "GOTO_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    assert blas_threads() == (3, "threadpoolctl (openblas)")
    _stand_in_threadpoolctl(monkeypatch, scipy_first[:3])  # NumPy's BLAS not among them
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    monkeypatch.setenv("MKL_NUM_THREADS", "2")
    assert blas_threads()[0] == 2
    monkeypatch.delenv("OPENBLAS_NUM_THREADS")
    monkeypatch.delenv("MKL_NUM_THREADS")
    count, source = blas_threads()
    assert count is None and source.startswith("unknown: threadpoolctl lists no BLAS of NumPy's own")


def test_the_blas_count_of_the_installed_libraries_is_numpys(monkeypatch):
    """The same with the real threadpoolctl, where SciPy's wheel bundles its own OpenBLAS: SciPy's
    set to one thread and NumPy's to two, the count read is two, whichever is listed first."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    pytest.importorskip("scipy.linalg")  # loads SciPy's BLAS
    from opgraph.benchmarks.environment import blas_threads, numpy_blas_entry

    numpy_entry = numpy_blas_entry(threadpoolctl.threadpool_info())
    others = [i["filepath"] for i in threadpoolctl.threadpool_info()
              if i["user_api"] == "blas" and i["filepath"] != (numpy_entry or {}).get("filepath")]
    if numpy_entry is None or not others:
        pytest.skip("needs NumPy's own bundled BLAS and another one (SciPy's) loaded")
    controller = threadpoolctl.ThreadpoolController()
    with controller.select(filepath=others).limit(limits=1), \
            controller.select(filepath=numpy_entry["filepath"]).limit(limits=2):
        assert blas_threads() == (2, f"threadpoolctl ({numpy_entry['internal_api']})")


def test_the_run_and_the_peers_records_say_the_same_of_the_threads(monkeypatch):
    """One comparison (``thread_alignment``) for the run's note and the peers' records, in one
    wording."""
    torch = pytest.importorskip("torch")
    from opgraph.benchmarks import environment, peer_column

    own = torch.get_num_threads()
    want = 1 if own > 1 else 2
    monkeypatch.setattr(environment, "blas_threads", lambda: (want, "threadpoolctl (openblas)"))
    with peer_column.aligned_threads("cpu") as (threads, note):
        assert threads == want == torch.get_num_threads()
    assert torch.get_num_threads() == own
    assert note == peer_column.threads_note({"blas": want, "blas_source": "threadpoolctl (openblas)", "torch": own})
    assert note.startswith(f"threads: NumPy's BLAS runs {want} thread(s)") and f"set_num_threads({want})" in note
    monkeypatch.setattr(environment, "blas_threads", lambda: (None, "unknown: no threadpoolctl"))
    with peer_column.aligned_threads("cpu") as (threads, note):
        assert threads == own
    assert note == peer_column.threads_note({"blas": None, "blas_source": "unknown: no threadpoolctl", "torch": own})
    assert peer_column.thread_alignment(own, "OMP_NUM_THREADS", own) == (own, None)
