"""CUDA-graph replay (opgraph/graph_replay.py) on the CPU, through a stand-in for CuPy.

The stand-in behaves as stream capture does: while a stream captures, a
kernel does not run but is recorded, and its output is an array whose values
appear only when the graph is launched (here: NaN until then). A step marked
as cuBLAS raises as CuPy does during capture. So the tests see what a real
capture would do with addresses and values: a graph reads the arrays it
captured, an eager step between graphs must write into the array the next
graph captured, and ``slots`` must not be rebound after the build.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import attrs
import numpy as np
import pytest

from opgraph import graph_replay
from opgraph.executable import Step


class FakeGraph:
    def __init__(self, ops):
        self.ops, self.launches = ops, 0

    def launch(self, stream=None):
        self.launches += 1
        for op in self.ops:
            op()


class FakeStream:
    def __init__(self, non_blocking=False):
        self.recording, self.invalid, self.captures = None, False, 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def begin_capture(self, mode=None):
        assert self.recording is None, "capture begun twice"
        EVENTS.append("capture")
        self.recording, self.invalid = [], False
        self.captures += 1

    def end_capture(self):
        assert self.recording is not None, "no capture to end"
        ops, self.recording = self.recording, None
        if self.invalid:
            raise RuntimeError("cudaErrorStreamCaptureInvalidated: operation failed due to a "
                               "previous error during capture")
        return FakeGraph(ops)

    def synchronize(self):
        if self.recording is not None:
            self.invalid = True


class FakePool:
    def __init__(self):
        self.allocations, self.freed = 0, False

    def malloc(self, nbytes):
        self.allocations += 1

    def free_all_blocks(self):
        self.freed = True

    def total_bytes(self):
        return 64 * self.allocations


ALLOCATORS: list = []  # the pool of every capture that allocated from one, in order
EVENTS: list = []  # "capture" (a capture begun) and "release" (the default pool's idle blocks freed)


class FakeDefaultPool:
    def free_all_blocks(self):
        EVENTS.append("release")


@contextlib.contextmanager
def using_allocator(malloc):
    ALLOCATORS.append(malloc.__self__)
    yield


FAKE = SimpleNamespace(cuda=SimpleNamespace(Stream=FakeStream, MemoryPool=FakePool,
                                            using_allocator=using_allocator),
                       get_default_memory_pool=FakeDefaultPool)


@pytest.fixture(autouse=True)
def fake_cupy(monkeypatch):
    monkeypatch.setattr(graph_replay, "_cupy", lambda: FAKE)
    ALLOCATORS.clear()
    EVENTS.clear()


def chain(cublas=(), syncs=(), alone_only=()):
    """x -> a = 2x -> b = a + 1 -> c = b * b -> d = c - x, as steps on node ids 1..4
    (x is node 0). ``cublas`` steps raise during capture as CuPy's cuBLAS calls
    do; ``syncs`` synchronise the stream (invalidating a capture); ``alone_only``
    steps capture alone but invalidate a capture that recorded something before."""
    fns = {1: lambda x: 2 * x, 2: lambda a: a + 1, 3: lambda b: b * b, 4: lambda c, x: c - x}
    args = {1: (0,), 2: (1,), 3: (2,), 4: (3, 0)}
    names = {1: "a", 2: "b", 3: "c", 4: "d"}
    steps = [Step(n, names[n], None, None, None, args[n]) for n in (1, 2, 3, 4)]

    def run_step(st, slots, stream):
        ins = [slots[a] for a in st.args]
        fn = fns[st.node]
        if stream.recording is None:
            return fn(*ins)
        if st.node in cublas:
            raise NotImplementedError("calling cuBLAS API during stream capture is currently unsupported")
        if st.node in syncs:
            stream.synchronize()
        if st.node in alone_only and stream.recording:
            stream.invalid = True
        out = np.full(ins[0].shape, np.nan)
        stream.recording.append(lambda: out.__setitem__(Ellipsis, fn(*ins)))
        return out

    return steps, run_step


def eager_values(x):
    a = 2 * x
    b = a + 1
    c = b * b
    return {0: x, 1: a, 2: b, 3: c, 4: c - x}


def build(x, **kw):
    steps, run = chain(**kw)
    stream = FakeStream()
    slots = eager_values(x)
    replay = graph_replay.GraphReplay(steps, slots, lambda st, sl: run(st, sl, stream), stream)
    return replay, slots, stream


def test_runs_between_cublas_steps_become_graphs_and_replays_read_the_live_input():
    x = np.arange(6.0).reshape(2, 3)
    replay, slots, _ = build(x, cublas={2})
    assert (replay.graphs, replay.captured_steps, replay.steps) == (2, 3, 4)
    assert list(replay.eager_reasons) == ["b"]
    assert "cuBLAS" in replay.eager_reasons["b"]
    assert [len(s.steps) for s in replay.segments] == [1, 1, 2]
    for node, want in eager_values(x).items():  # the build leaves one replay's values
        np.testing.assert_array_equal(slots[node], want)
    held = {n: slots[n] for n in slots}
    x[...] = np.linspace(-1, 1, 6).reshape(2, 3)  # the source changes in place
    replay()
    for node, want in eager_values(x).items():
        np.testing.assert_array_equal(slots[node], want)
        assert slots[node] is held[node]  # no slot rebound: graphs keep their addresses
    assert all(s.graph.launches == 2 for s in replay.segments if s.graph is not None)
    summary = replay.summary()
    assert summary["eager_steps"] == 1 and summary["graphs"] == 2 and summary["pool_bytes"] >= 0


def test_a_step_that_synchronises_runs_eagerly():
    x = np.ones((2, 2))
    replay, slots, _ = build(x, syncs={3})
    assert list(replay.eager_reasons) == ["c"]
    assert "Invalidated" in replay.eager_reasons["c"]
    x[...] = 3.0
    replay()
    np.testing.assert_array_equal(slots[4], eager_values(x)[4])


def test_a_run_that_fails_together_falls_back_to_eager_steps():
    x = np.full((3,), 2.0)
    steps, run = chain(cublas={2}, alone_only={4})
    stream = FakeStream()
    slots = eager_values(x)
    before = dict(slots)
    replay = graph_replay.GraphReplay(steps, slots, lambda st, sl: run(st, sl, stream), stream)
    # the failed capture's arrays (never written, their pool not kept) are not reused
    assert slots[3] is before[3] and slots[4] is before[4]
    # c and d each capture alone; together they invalidate the capture
    assert set(replay.eager_reasons) == {"b", "c", "d"}
    assert "captured alone but not in a run of 2 steps" in replay.eager_reasons["d"]
    assert replay.graphs == 1 and replay.captured_steps == 1
    x[...] = -1.0
    replay()
    for node, want in eager_values(x).items():
        np.testing.assert_array_equal(slots[node], want)


def test_everything_eager_still_replays_correctly():
    x = np.full((2,), 0.5)
    replay, slots, _ = build(x, cublas={1, 2, 3, 4})
    assert replay.graphs == 0 and replay.captured_steps == 0
    x[...] = 4.0
    replay()
    np.testing.assert_array_equal(slots[4], eager_values(x)[4])


def test_a_step_whose_rule_declares_a_blocker_runs_eagerly_without_a_trial():
    x = np.arange(3.0)
    steps, run = chain()
    # the compiler puts Rule.capture_blocker on the step's KernelContext
    steps[2] = attrs.evolve(steps[2], ctx=SimpleNamespace(capture_blocker="needs nvmath-python"))
    stream = FakeStream()
    slots = eager_values(x)
    replay = graph_replay.GraphReplay(steps, slots, lambda st, sl: run(st, sl, stream), stream)
    assert replay.eager_reasons == {"c": "declared not capturable: needs nvmath-python"}
    # trial captures of a, b and d, then the graphs of (a, b) and (d): c never captured
    assert stream.captures == 3 + 2 and (replay.graphs, replay.captured_steps) == (2, 3)
    x[...] = 5.0
    replay()
    np.testing.assert_array_equal(slots[4], eager_values(x)[4])
    assert graph_replay.declared_blocker(steps[0]) is None  # no context: a trial decides


def test_capture_error_leaves_no_capture_open():
    steps, run = chain(cublas={2})
    stream = FakeStream()
    slots = eager_values(np.ones(2))
    why = graph_replay.capture_error(steps[1], slots, lambda st, sl: run(st, sl, stream), stream)
    assert why.startswith("NotImplementedError: calling cuBLAS")
    assert stream.recording is None  # ended even though the step raised
    assert graph_replay.capture_error(steps[0], slots, lambda st, sl: run(st, sl, stream), stream) is None
    np.testing.assert_array_equal(slots[1], 2 * np.ones(2))  # a trial writes no slot


def test_close_frees_the_cached_blocks_but_keeps_the_pools_and_the_values():
    x = np.arange(4.0)
    replay, slots, _ = build(x, cublas={2})
    pool = replay.pool
    assert not pool.freed
    replay.close()
    assert pool.freed
    # a CuPy pool frees the blocks arrays still use when it dies: the replay keeps it
    assert replay.pool is pool
    np.testing.assert_array_equal(slots[4], eager_values(x)[4])
    with pytest.raises(RuntimeError, match="closed"):
        replay()


def test_the_graphs_of_a_replay_share_one_private_pool():
    # two graphs (a | b eager | c d): a pool per graph held every graph's scratch at
    # once (fp32 ResNet-50: 27.7 GB of pools against eager's 10.4 GB peak)
    replay, _, _ = build(np.arange(3.0), cublas={2})
    assert replay.graphs == 2 and ALLOCATORS == [replay.pool, replay.pool]
    assert isinstance(replay.pool, FakePool)


def test_each_capture_starts_with_the_default_pools_idle_blocks_given_back():
    # the arrays an earlier graph rebound sit idle in the default pool, which a private pool
    # that fails cudaMalloc does not free (fp32 ResNet-50's backward-data on an H100)
    replay, _, _ = build(np.arange(3.0), cublas={2})
    trials = 4  # one throw-away capture per step, then the two graphs (a | b eager | c d)
    assert EVENTS == ["capture"] * trials + ["release", "capture", "release", "capture"]
    assert replay.graphs == 2


def test_the_default_pool_cannot_be_a_replays_private_pool(monkeypatch):
    default = FakeDefaultPool()
    monkeypatch.setattr(FAKE, "get_default_memory_pool", lambda: default)
    steps, run = chain()
    stream = FakeStream()
    with pytest.raises(ValueError, match="the default memory pool cannot be a replay's private pool"):
        graph_replay.GraphReplay(steps, eager_values(np.ones(2)), lambda st, sl: run(st, sl, stream), stream,
                                 pool=default)


def test_a_replay_allocates_from_the_pool_it_is_given():
    steps, run = chain(cublas={2})
    stream, shared = FakeStream(), FakePool()
    slots = eager_values(np.ones(2))
    replay = graph_replay.GraphReplay(steps, slots, lambda st, sl: run(st, sl, stream), stream, pool=shared)
    assert replay.pool is shared and ALLOCATORS == [shared, shared]


def test_closing_a_replay_leaves_a_shared_pool_alone():
    # another replay's graphs write their scratch into the shared pool's idle blocks
    steps, run = chain(cublas={2})
    stream, shared = FakeStream(), FakePool()
    slots = eager_values(np.ones(2))
    replay = graph_replay.GraphReplay(steps, slots, lambda st, sl: run(st, sl, stream), stream, pool=shared)
    replay.close()
    assert not shared.freed and replay.summary()["pool_shared"] is True
    own, _, _ = build(np.ones(2), cublas={2})
    assert own.summary()["pool_shared"] is False
    own.close()
    assert own.pool.freed


def test_a_pool_that_gives_blocks_back_during_a_capture_fails_the_build():
    # CuPy's pool frees its idle blocks and retries when cudaMalloc fails: an idle
    # block may be an earlier graph's scratch, which its replays would still write
    class ReleasingPool(FakePool):
        def total_bytes(self):
            return 64 * self.allocations - (32 if ALLOCATORS.count(self) >= 2 else 0)

    steps, run = chain(cublas={2})
    stream = FakeStream()
    slots = eager_values(np.ones(2))
    before = dict(slots)
    with pytest.raises(graph_replay.ReleasedScratch, match="device memory ran out"):
        graph_replay.GraphReplay(steps, slots, lambda st, sl: run(st, sl, stream), stream, pool=ReleasingPool())
    assert all(slots[n] is before[n] for n in before)


def test_a_build_that_fails_leaves_the_slots_as_it_found_them():
    x = np.ones(3)
    steps, run = chain(cublas={2})
    stream = FakeStream()
    slots = eager_values(x)
    before = dict(slots)

    def failing(st, sl):
        if st.node == 2 and stream.recording is None:  # the eager step, at build time
            raise MemoryError("out of device memory")
        return run(st, sl, stream)

    with pytest.raises(MemoryError):
        graph_replay.GraphReplay(steps, slots, failing, stream)
    # segment a was captured into a pool that dies with the half-built replay
    assert all(slots[n] is before[n] for n in before)


# ------------------------------------------------------------------ in-place steps

def in_place_chain():
    """The chain with c = b * b written into b's array (b dies there: the
    memory pass's plan, ``Step.inplace``), as ``run_step`` runs it: eagerly
    into ``slots[b]``, or, while capturing, recorded to write ``slots[b]`` at
    launch."""
    steps, _ = chain()
    steps[2] = attrs.evolve(steps[2], free=(2,), inplace=0)
    fns = {1: lambda x: 2 * x, 2: lambda a: a + 1, 3: lambda b: b * b, 4: lambda c, x: c - x}

    def run_step(st, slots, stream):
        ins = [slots[a] for a in st.args]
        fn, target = fns[st.node], st.writes_into
        if stream.recording is None:
            if target is None:
                return fn(*ins)
            slots[target][...] = fn(*ins)
            return slots[target]
        out = slots[target] if target is not None else np.full(ins[0].shape, np.nan)
        stream.recording.append(lambda: out.__setitem__(Ellipsis, fn(*ins)))
        return out

    return steps, run_step


@pytest.mark.parametrize("cublas", [(), (2,), (3,)], ids=["all-captured", "b-eager", "c-eager"])
def test_a_replay_runs_an_in_place_step_out_of_place_and_parts_shared_slots(cublas):
    steps, run = in_place_chain()
    stream = FakeStream()

    def run_step(st, sl):
        if st.node in cublas and stream.recording is not None:
            raise NotImplementedError("calling cuBLAS API during stream capture is currently unsupported")
        return run(st, sl, stream)

    x = np.arange(6.0).reshape(2, 3)
    slots = eager_values(x)
    for st in steps:  # a full run as the executor's run_step does it: c into b
        slots[st.node] = run_step(st, slots)
    assert slots[3] is slots[2]
    replay = graph_replay.GraphReplay(steps, slots, run_step, stream)
    # phases replay apart, so nothing runs in place, and c's slot got its own array:
    # an eager c copying its result into it must not overwrite b (read by a later phase)
    assert [st.writes_into for seg in replay.segments for st in seg.steps] == [None] * 4
    assert slots[3] is not slots[2]
    for k in range(3):
        x[...] = np.linspace(-1, 1, 6).reshape(2, 3) * (k + 1)
        replay()
        want = eager_values(x)
        for node in (1, 2, 3, 4):
            np.testing.assert_array_equal(slots[node], want[node])


def test_a_replay_of_steps_that_do_not_compute_the_overwritten_input_runs_them_out_of_place():
    steps, run = in_place_chain()
    stream = FakeStream()
    x = np.arange(6.0).reshape(2, 3)
    slots = eager_values(x)
    # c and d replayed apart from b's producer (a phase on another phase's value)
    replay = graph_replay.GraphReplay(steps[2:], slots, lambda st, sl: run(st, sl, stream), stream)
    assert [st.writes_into for seg in replay.segments for st in seg.steps] == [None, None]
    for _ in range(3):  # in place, the second replay would square b's square
        replay()
        want = eager_values(x)
        for node in (2, 3, 4):
            np.testing.assert_array_equal(slots[node], want[node])


def test_a_step_listed_k_times_is_tried_once_and_captured_as_k_calls_in_one_graph():
    # --profile's loop of k calls of one step (benchmarks/step_clock.py)
    steps, run = chain()
    stream = FakeStream()
    x = np.arange(4.0)
    slots = eager_values(x)
    replay = graph_replay.GraphReplay([steps[1]] * 5, slots, lambda st, sl: run(st, sl, stream), stream)
    assert stream.captures == 1 + 1  # one trial, one capture of the five calls
    assert (replay.graphs, replay.captured_steps, replay.steps) == (1, 5, 5)
    (seg,) = replay.segments
    assert len(seg.graph.ops) == 5
    slots[1][...] = 7.0  # b = a + 1 follows its input in every call
    replay()
    np.testing.assert_array_equal(slots[2], np.full(4, 8.0))
