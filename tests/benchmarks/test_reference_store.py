"""The float64 reference's values past a device budget wait in host memory
(benchmarks/reference_store.py): the same values, the same check outcomes,
the device holding no more than the budget."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.backends import device as dev
from opgraph.benchmarks import check, driver, lowerings as lw, reference_store
from opgraph.benchmarks.protocol import random_feeds, training_graph


def test_values_past_the_budget_go_to_the_host_and_come_back_on_reading(monkeypatch):
    copies = {"to_host": 0, "to_device": 0}
    real_host, real_device = dev.to_host, dev.to_device

    def to_host(a):
        copies["to_host"] += 1
        return real_host(a).copy()  # a separate buffer, as a GPU's host copy is

    def to_device(a, device):
        copies["to_device"] += 1
        return real_device(a, device).copy()

    monkeypatch.setattr(dev, "to_host", to_host)
    monkeypatch.setattr(dev, "to_device", to_device)
    rng = np.random.default_rng(0)
    arrays = {n: rng.standard_normal(s) for n, s in enumerate([(10,), (20,), (5,), (40,), (3,)])}
    vs = reference_store.ValueStore("cpu", budget=8 * 30)
    for n, a in arrays.items():
        vs.put(n, a)
    # (10,) and (20,) fill the 240 bytes; (5,) would pass them, so it and the rest go to the host
    assert (vs.device_bytes, vs.host_bytes) == (8 * 30, 8 * 48)
    assert copies == {"to_host": 3, "to_device": 0}
    assert 2 in vs and 99 not in vs and copies["to_device"] == 0  # membership copies nothing
    assert len(vs) == 5 and sorted(vs) == list(arrays)
    for n, a in arrays.items():
        np.testing.assert_array_equal(vs[n], a)
    assert copies["to_device"] == 3  # each read of a host value, none of a device one
    vs.put(7, rng.standard_normal(100), on_device=True)  # the outputs stay whatever the budget
    assert vs.device_bytes == 8 * 130 and vs.host_bytes == 8 * 48
    with pytest.raises(KeyError):
        vs[99]
    with pytest.raises(ValueError, match="node 2 is stored already"):
        vs.put(2, arrays[2])


def test_no_budget_keeps_everything_on_the_device():
    vs = reference_store.ValueStore("cpu", budget=None)
    vs.put(0, np.ones(1000))
    assert (vs.device_bytes, vs.host_bytes) == (8000, 0)
    assert reference_store.device_budget("cpu") is None  # host and device memory are one


@pytest.fixture
def tiny_setup(tiny):
    tg = training_graph(tiny)
    return tg, random_feeds(tiny, seed=1)


def test_a_reference_past_its_budget_has_the_same_values_and_checks(tiny_setup):
    tg, feeds = tiny_setup
    whole = check.Reference(tg, feeds, "cpu")
    small = check.Reference(tg, feeds, "cpu", device_budget=4096)
    assert whole.values.host_bytes == 0
    assert small.values.host_bytes > 0 and small.values.device_bytes > 0
    assert small.values.device_bytes - sum(o.nbytes for o in small.outputs) <= 4096
    assert sorted(small.values) == sorted(whole.values)
    assert small.values.device_bytes + small.values.host_bytes == whole.values.device_bytes
    for n in whole.values:
        np.testing.assert_array_equal(small.values[n], whole.values[n])
    for a, b in zip(small.outputs, whole.outputs):
        np.testing.assert_array_equal(a, b)
    exe = og.compile(tg.outputs, policy={"prefer": {"conv": ["gemm"]}})
    a, b = check.check_lowering(exe, whole), check.check_lowering(exe, small)
    assert a.passed and b.passed and a.nodes_checked == b.nodes_checked >= 9
    assert a.max_rel_error == b.max_rel_error and a.worst_node == b.worst_node


def test_a_run_says_how_much_of_its_reference_waits_in_host_memory(monkeypatch, tiny):
    monkeypatch.setattr(reference_store, "device_budget", lambda device: 0)
    s = driver.Settings(device="cpu", lowerings=lw.parse_lowerings("gemm"), warmup=0, repeat=1)
    doc = driver.run_benchmark([tiny], s)
    [rec] = doc["results"]
    assert rec["status"] == "ok" and rec["check"]["passed"]
    [entry] = doc["models"]
    assert entry["reference_bytes"]["host"] > 0
    [note] = [n for n in doc["notes"] if "float64 reference keeps" in n]
    assert note.startswith(f"{tiny.key}: ") and "wait in host memory" in note
