"""The autotune cache key's format (``autotune_cache.cache_key``, ``key_layout``): the key of a
node whose inputs share one layout is byte for byte the one written before every input's
layout was kept (the device's carried cache keeps hitting), and two nodes that differ only in a
later input's layout have keys that differ outside their kernels' fingerprints (neither finds
the other's decision "tuned on other kernel code")."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import attrs
import pytest

import opgraph as og
from opgraph import ops
from opgraph.backends import registry
from opgraph.backends.registry import Rule
from opgraph.op import Op
from opgraph.passes.autotune_cache import AutotuneCache, cache_key, key_layout, unfingerprinted
from opgraph.passes.policy import LoweringPolicy

from passes_stubs import StubTimer
from test_autotune import tune

#: the newest session's cache: the only one kept in the tree (docs/gpu.md)
CACHES = sorted((Path(__file__).resolve().parents[2] / "docs/results").glob("*/autotune-cache.json.gz"))

#: the key's format, as ``cache_key``'s docstring writes it
KEY = re.compile(r"(?P<op>.+?) \| in=\((?P<ins>[^)]*)\) \| dtype=(?P<dtype>[\w]+) \| layout=(?P<layout>[\w,>-]+) \| "
                 r"(?:out=(?P<out>[^|]+) \| )?precision=(?P<precision>\w+) \| workspace_limit=(?P<limit>\w+) \| "
                 r"device=(?P<device>\w+):(?P<name>[^|]+) \| candidates=(?P<candidates>.*?) \| "
                 r"(?P<versions>[^|]+)")
IN = re.compile(r"(\w+)\[([0-9x]*)\]")


def t4(layout, shape=(8, 64, 28, 28), dtype="bfloat16"):
    return og.TensorType(shape, dtype, layout)


def test_a_key_whose_inputs_share_a_layout_is_the_one_written_before():
    """The literal key of a bf16 NHWC convolution with a bias (1-D, no layout), as every earlier
    version wrote it: ``layout=`` names the first input's."""
    types = (t4("NHWC"), t4("NHWC", (64, 64, 3, 3)), og.TensorType((64,), "bfloat16"))
    assert key_layout(types) == "NHWC"
    policy = LoweringPolicy(precision="bf16")
    key = cache_key(ops.Conv2d(stride=(1, 1), padding=((1, 1), (1, 1))), types, None, key_layout(types), policy,
                    "cuda", "NVIDIA H200", {"numpy": "2.5.2", "cupy": "14.2.0", "tune_clock": "held-stream"},
                    candidates="cudnn:variants[engines<=10]")
    assert key == ("Conv2d(stride=1, padding=1, dilation=1, groups=1) | in=(bfloat16[8x64x28x28], "
                   "bfloat16[64x64x3x3], bfloat16[64]) | dtype=declared | layout=NHWC | precision=bf16 | "
                   "workspace_limit=None | device=cuda:NVIDIA H200 | candidates=cudnn:variants[engines<=10] | "
                   "cupy=14.2.0;numpy=2.5.2;tune_clock=held-stream")
    assert KEY.fullmatch(key)


@pytest.mark.parametrize("layouts, own, field", [
    (("NCHW", "NCHW"), None, "NCHW"),
    (("NHWC", None, "NHWC"), None, "NHWC"),  # a 1-D input has none: it differs from no one
    ((None, None), None, "NCHW"),  # 2-D inputs
    ((None, "NCHW"), None, "NCHW"),  # a first input without one reads NCHW, as it always did
    ((), "NHWC", "NHWC"),  # a source: its own layout
    ((), None, "NCHW"),
    (("NHWC", "NCHW"), None, "NHWC,NCHW"),
    (("NCHW", "NHWC"), None, "NCHW,NHWC"),
    ((None, "NHWC", None), None, "-,NHWC,-"),
    # the output's layout: added only where it differs from the inputs', which agree
    (("NHWC", "NHWC"), "NHWC", "NHWC"),  # the layout pass's every 4-D node: the key it always had
    (("NHWC", None), None, "NHWC"),  # a reduction to a value without a layout
    ((None, None), "NCHW", "NCHW"),  # 2-D inputs into an NCHW value
    ((None, None), "NHWC", "NCHW->NHWC"),  # ... into an NHWC one
    (("NCHW", "NCHW"), "NHWC", "NCHW->NHWC"),
    (("NHWC", None), "NCHW", "NHWC->NCHW"),
    (("NHWC", "NCHW"), "NHWC", "NHWC,NCHW"),  # inputs that differ: each input's, as before
])
def test_the_layout_field_names_each_input_only_where_they_differ(layouts, own, field):
    types = tuple(t4(la) if la else og.TensorType((64,), "float32") for la in layouts)
    assert key_layout(types, own) == field


def _carried_entries() -> dict:
    assert len(CACHES) == 1, f"one autotune cache is kept in docs/results, found {[str(c) for c in CACHES]}"
    return json.loads(gzip.decompress(CACHES[0].read_bytes()))["entries"]


def test_every_key_of_the_carried_cache_is_written_again_byte_for_byte():
    """Each key of the H200 cache in docs/results parses by the documented format and, rebuilt from
    its parts through ``cache_key`` and ``key_layout`` (its 4-D inputs in the one layout the layout
    pass gives them all), is the same string: the device's carried cache keeps hitting."""
    keys = list(_carried_entries())
    assert len(keys) > 5000
    for key in keys:
        m = KEY.fullmatch(key)
        assert m, key
        types = []
        for dtype, shape in IN.findall(m["ins"]):
            dims = tuple(int(d) for d in shape.split("x")) if shape else ()
            types.append(og.TensorType(dims, dtype, m["layout"] if len(dims) == 4 else None))
        assert len(types) == m["ins"].count("["), key
        assert key_layout(types) == m["layout"], key
        versions = dict(v.split("=", 1) for v in m["versions"].split(";"))
        op = SimpleNamespace(describe=lambda text=m["op"]: text)
        policy = SimpleNamespace(precision=m["precision"], workspace_limit=m["limit"])
        dtype = None if m["dtype"] == "declared" else m["dtype"]
        again = cache_key(op, types, dtype, key_layout(types), policy, m["device"], m["name"], versions,
                          candidates=m["candidates"], out=m["out"])
        assert again == key


# ---- the autotune pass: two nodes that differ only in their second input's layout

@attrs.frozen
class Pair(Op):
    """Dummy op: ``y = x + z`` (two inputs of one shape)."""

    kind: ClassVar[str] = "pair"
    arity: ClassVar = (2, 2)

    def infer(self, x, z):
        return x


def _add(ctx, op, x, z):
    return x + z


def _variants(op, types, device):
    return [{"t": 1}, {"t": 2}]


#: as ``codegen_sources.emitted_fingerprint``: the kernels emitted for the node follow each input's layout
_variants.node_fingerprint = lambda op, ins, out, home=None: f"{sum(map(ord, repr([t.layout for t in ins]))):012x}"


@pytest.fixture
def pair_rules(monkeypatch):
    registry.rules_for(Pair)  # load the backends first
    monkeypatch.setitem(registry._RULES, Pair, {"reference": Rule(Pair, "reference", _add, tags={"reference"}),
                                                "gen": Rule(Pair, "gen", _add, variants=_variants)})


def _pair_graph():
    """``p0 = x + z1`` and ``p1 = x + z2``: all (2, 3, 4, 5), z2 stored NHWC, the others NCHW."""
    g = og.Graph()
    x, z1, z2 = (g.input(n, (2, 3, 4, 5)) for n in ("x", "z1", "z2"))
    for v, layout in ((x, "NCHW"), (z1, "NCHW"), (z2, "NHWC")):
        g.set_layout(v.node, layout)
    return [g.add_node(Pair(), [x, z1], name="p0"), g.add_node(Pair(), [x, z2], name="p1")]


def test_nodes_differing_in_a_later_inputs_layout_do_not_supersede_each_other(pair_rules, tmp_path):
    outs = _pair_graph()
    timer = StubTimer({"reference": 3.0, "gen[t=1]": 1.0, "gen[t=2]": 2.0})
    cache = tmp_path / "c.json"
    _, report = tune(outs, cache, timer)
    k0, k1 = report.node("p0").cache_key, report.node("p1").cache_key
    assert "| layout=NCHW |" in k0 and "| layout=NCHW,NHWC |" in k1
    assert unfingerprinted(k0) != unfingerprinted(k1)
    assert not any("other kernel code" in n for n in report.notes), report.notes
    assert AutotuneCache(cache).superseded(k1) is None
    assert set(json.loads(cache.read_text())["entries"]) == {k0, k1}
    _, again = tune(outs, cache, timer)
    assert {n: again.node(n).how for n in ("p0", "p1")} == {"p0": "cache", "p1": "cache"}


def test_nodes_of_the_same_inputs_writing_other_layouts_have_keys_of_their_own(pair_rules, tmp_path):
    """``p0 = x + z`` and ``p1 = x + z``, the inputs NCHW, p1's output stored NHWC: their keys
    shared every field (the ``layout=`` field named only the inputs'), so p1 read p0's decision,
    timed writing NCHW; now p1's field names its output's too and each node is tuned and cached
    on its own. p0's key, inputs and output sharing one layout, is the one it always was."""
    g = og.Graph()
    x, z = (g.input(n, (2, 3, 4, 5)) for n in ("x", "z"))
    for v in (x, z):
        g.set_layout(v.node, "NCHW")
    outs = [g.add_node(Pair(), [x, z], name="p0"), g.add_node(Pair(), [x, z], name="p1")]
    g.set_layout(outs[0].node, "NCHW")
    g.set_layout(outs[1].node, "NHWC")
    timer = StubTimer({"reference": 3.0, "gen[t=1]": 1.0, "gen[t=2]": 2.0})
    cache = tmp_path / "c.json"
    _, report = tune(outs, cache, timer)
    k0, k1 = report.node("p0").cache_key, report.node("p1").cache_key
    assert {report.node(n).how for n in ("p0", "p1")} == {"autotune"}
    assert "| layout=NCHW |" in k0 and "| layout=NCHW->NHWC |" in k1 and KEY.fullmatch(k1)
    assert unfingerprinted(k0) != unfingerprinted(k1)
    assert k0 == k1.replace("| layout=NCHW->NHWC |", "| layout=NCHW |")  # the one field differs
    assert set(json.loads(cache.read_text())["entries"]) == {k0, k1}
    _, again = tune(outs, cache, timer)
    assert {n: again.node(n).how for n in ("p0", "p1")} == {"p0": "cache", "p1": "cache"}


# ---- superseded entries leave the file when the node's new decision is stored

def _k(node: str, fp: str = "") -> str:
    """A key of ``node`` whose candidates carry the fingerprint ``fp`` (none: '')."""
    return f"Scale() | in=(float32[{node}]) | candidates=gen:variants{fp and '#' + fp * 12} | numpy=2.4.0"


def _entry(algorithm="gen", **more):
    return {"algorithm": algorithm, "options": {}, **more}


def _write(path, entries):
    path.write_text(json.dumps({"format": "opgraph-autotune/1", "entries": entries}))


def _keys(path):
    return set(json.loads(path.read_text())["entries"])


def test_a_put_drops_the_entries_it_supersedes_from_memory_and_from_the_file(tmp_path):
    path = tmp_path / "c.json"
    nan_row = {"algorithm": "gen", "status": "wrong", "rel_error": float("nan")}  # equal to itself here
    _write(path, {_k("4", "a"): _entry(), _k("4"): _entry(candidates=[nan_row]),  # node 4: two stale entries
                  _k("5", "a"): _entry(), _k("6"): _entry()})  # other nodes
    cache = AutotuneCache(path)
    assert cache.superseded(_k("4", "b")) == _k("4")
    cache.put(_k("4", "b"), _entry("reference"))
    assert set(cache.entries) == {_k("4", "b"), _k("5", "a"), _k("6")}
    assert set(cache.pruned) == {_k("4", "a"), _k("4")} and cache.from_file == {_k("5", "a"), _k("6")}
    assert cache.superseded(_k("4", "b")) is None
    cache.save()
    assert _keys(path) == {_k("4", "b"), _k("5", "a"), _k("6")}
    assert AutotuneCache(path).get(_k("4", "b"))["algorithm"] == "reference"


def test_a_key_without_fingerprints_and_the_keys_in_use_drop_nothing(tmp_path):
    path = tmp_path / "c.json"
    _write(path, {_k("4", "a"): _entry(), _k("5", "a"): _entry()})
    cache = AutotuneCache(path)
    cache.put(_k("4"), _entry())  # no fingerprint: only its own entry is its decision
    assert cache.get(_k("5", "a")) is not None  # found: another node of this compile reads it
    cache.put(_k("5", "b"), _entry())
    cache.put(_k("6", "a"), _entry())
    cache.put(_k("6", "b"), _entry())  # put by this compile: another node's
    cache.save()
    assert _keys(path) == {_k(n, fp) for n, fp in (("4", "a"), ("4", ""), ("5", "a"), ("5", "b"), ("6", "a"),
                                                   ("6", "b"))}


def test_a_concurrent_writers_entries_survive_the_pruning_save(tmp_path):
    """Another process wrote the file meanwhile: a key of its own, one equal to ours but for
    another fingerprint, and one of the keys ours supersedes anew: all three are its decisions,
    and stay; the superseded entry it left as it was is dropped, and no later save brings it back."""
    path = tmp_path / "c.json"
    _write(path, {_k("4", "a"): _entry(), _k("4", "c"): _entry(), _k("5"): _entry()})
    cache = AutotuneCache(path)
    cache.put(_k("4", "b"), _entry())
    assert set(cache.pruned) == {_k("4", "a"), _k("4", "c")}
    _write(path, {_k("4", "a"): _entry(), _k("4", "c"): _entry("reference"),  # the other process
                  _k("4", "d"): _entry(), _k("5"): _entry(), _k("7", "a"): _entry()})
    cache.save()
    kept = json.loads(path.read_text())["entries"]
    assert set(kept) == {_k("4", "b"), _k("4", "c"), _k("4", "d"), _k("5"), _k("7", "a")}
    assert kept[_k("4", "c")]["algorithm"] == "reference"
    cache.put(_k("8", "a"), _entry())
    cache.save()
    assert _keys(path) == {*kept, _k("8", "a")}
